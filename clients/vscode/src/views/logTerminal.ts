/** A job's log followed in a terminal (as `remotegpu-cli logs -f`): Ctrl-C or closing it stops following. */

import { StringDecoder } from "node:string_decoder";

import * as vscode from "vscode";

import type { ApiClient } from "../core";

function crlf(text: string): string {
  return text.replace(/\r?\n/g, "\r\n");
}

export function followLogTerminal(client: ApiClient, jobId: number, name: string): vscode.Terminal {
  const write = new vscode.EventEmitter<string>();
  const close = new vscode.EventEmitter<void>();
  const abort = new AbortController();
  const decoder = new StringDecoder("utf8");

  const pty: vscode.Pseudoterminal = {
    onDidWrite: write.event,
    onDidClose: close.event,
    open: () => {
      write.fire(`following the log of job ${jobId} on ${client.server} (Ctrl-C or closing the terminal stops)\r\n`);
      client.followLog(jobId, { signal: abort.signal, onData: (b) => write.fire(crlf(decoder.write(b))) })
        .then(async (last) => {
          if (!last) {
            return;
          }
          write.fire(crlf(decoder.end()));
          let end = `job ${jobId} ${last.state}`;
          try {
            const job = await client.job(jobId);
            end = `job ${jobId} ${job.state}` + (job.exit_code !== null ? `, exit code ${job.exit_code}` : "") +
              (job.reason ? ` (${job.reason})` : "");
          } catch {
            // the log's own final state is said then
          }
          write.fire(`\r\n[${end}]\r\n`);
        })
        .catch((e: Error) => write.fire(`\r\n[the log cannot be followed: ${crlf(e.message)}]\r\n`));
    },
    close: () => {
      abort.abort();
      write.dispose();
      close.dispose();
    },
    handleInput: (data) => {
      if (data === "\x03" && !abort.signal.aborted) {
        abort.abort();
        write.fire("\r\n[stopped following; close the terminal when done]\r\n");
      }
    },
  };
  return vscode.window.createTerminal({ name, pty });
}

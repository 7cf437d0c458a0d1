/**
 * What the extension leaves to remotegpu-cli and ssh: the SSH configuration and
 * DirectLink (`remotegpu-cli ssh-config`, whose ProxyCommand is `remotegpu-cli proxy`),
 * a terminal inside a workspace (`remotegpu-cli shell`), a workspace port on localhost
 * (`remotegpu-cli forward`). The transport exists once, in the Python client; this
 * module only says which program to run with which arguments, and runs the short ones.
 */

import { ChildProcess, execFile, spawn } from "node:child_process";

type Env = Record<string, string | undefined>;

export interface CliOptions {
  /** remotegpu-cli, on PATH or an absolute path. */
  cliPath: string;
  /** remotegpu-cli's folder (`--home`); unset: its default (REMOTEGPU_HOME or ~/.config/remotegpu). */
  home?: string;
  /** The ssh config that `ssh-config` writes and `ssh -F` reads; unset: ~/.ssh/config. */
  sshConfigFile?: string;
  /** ssh, on PATH or an absolute path. */
  sshPath?: string;
  env?: Env;
  timeoutMs?: number;
}

export interface Argv {
  command: string;
  args: string[];
}

export interface SshConfigResult {
  file: string;
  /** NODE.CLUSTER for every node reached through DirectLink. */
  hosts: string[];
  /** What remotegpu-cli said on stderr (servers skipped, servers that could not be asked). */
  notes: string[];
}

/** A running `remotegpu-cli tunnel`: a loopback address that reaches a node's API through DirectLink. */
export interface Tunnel {
  /** 127.0.0.1:PORT */
  address: string;
  node: string;
  /** "direct" or "relayed" when it opened. */
  path: string;
  /** Ends the tunnel (its standard input is closed). */
  close(): void;
  /** Set when the tunnel process ended by itself. */
  ended(): boolean;
}

/** One row of `remotegpu-cli clusters --json`: a cluster the tenant may use, or one that was just dropped. */
export interface ClusterRow {
  cluster_id: string;
  server: string;
  /** "ok", "added" (an admin gave it), "removed: WHY" (it refuses the tenant now), "not answering: WHY", ... */
  state: string;
}

export class CliError extends Error {
  constructor(message: string, readonly exitCode: number | null = null) {
    super(message);
  }
}

interface Ran {
  stdout: string;
  stderr: string;
}

function run(command: string, args: string[], env: Env | undefined, timeoutMs: number): Promise<Ran> {
  return new Promise((resolve, reject) => {
    execFile(command, args, { env: env as NodeJS.ProcessEnv | undefined, timeout: timeoutMs, maxBuffer: 8 << 20,
                              windowsHide: true }, (err, stdout, stderr) => {
      if (err) {
        const e = err as NodeJS.ErrnoException & { code?: string | number; killed?: boolean };
        if (e.code === "ENOENT") {
          reject(new CliError(`${command} was not found: install mtgpu's client (pip install mtgpu) or set its path ` +
            "in the settings (remoteGpu.cliPath, remote.SSH.path)"));
        } else if (e.killed) {
          reject(new CliError(`${command} ${args.join(" ")} took more than ${timeoutMs / 1000} s and was stopped`));
        } else {
          const said = String(stderr).trim() || String(stdout).trim() || e.message;
          reject(new CliError(`${command} ${args.join(" ")} failed: ${said}`, typeof e.code === "number" ? e.code : null));
        }
        return;
      }
      resolve({ stdout: String(stdout), stderr: String(stderr) });
    });
  });
}

export class RemoteGpuCli {
  constructor(private readonly o: CliOptions) {}

  private base(): string[] {
    return this.o.home ? ["--home", this.o.home] : [];
  }

  argv(...args: string[]): Argv {
    return { command: this.o.cliPath, args: [...this.base(), ...args] };
  }

  /**
   * `remotegpu-cli ssh-config --json`: writes a Host NODE.CLUSTER for every node of every
   * joined cluster with DirectLink (host keys pinned) and says which hosts it wrote.
   */
  async sshConfig(): Promise<SshConfigResult> {
    const a = this.argv("ssh-config", "--json", ...(this.o.sshConfigFile ? ["--file", this.o.sshConfigFile] : []));
    const r = await run(a.command, a.args, this.o.env, this.o.timeoutMs ?? 60000);
    let parsed: { file?: unknown; hosts?: unknown };
    try {
      parsed = JSON.parse(r.stdout);
    } catch {
      throw new CliError(`remotegpu-cli ssh-config printed no JSON: ${r.stdout.slice(0, 300)} ${r.stderr.slice(0, 300)}`);
    }
    if (typeof parsed.file !== "string" || !Array.isArray(parsed.hosts)) {
      throw new CliError(`remotegpu-cli ssh-config answered ${r.stdout.slice(0, 300)}, not {file, hosts}`);
    }
    const notes = r.stderr.split("\n").map((l) => l.trim()).filter(Boolean).map((l) => l.replace(/^remotegpu: /, ""));
    return { file: parsed.file, hosts: parsed.hosts.map(String), notes };
  }

  /**
   * `remotegpu-cli clusters --json`: asks every joined cluster who the tenant is there, adds
   * the clusters an admin gave it to servers.json and drops those that refuse it (mtgpu's
   * docs/CLUSTERS.md), so the views list exactly the clusters the tenant may use.
   */
  async clusters(): Promise<ClusterRow[]> {
    const a = this.argv("clusters", "--json");
    const r = await run(a.command, a.args, this.o.env, this.o.timeoutMs ?? 60000);
    let parsed: unknown;
    try {
      parsed = JSON.parse(r.stdout);
    } catch {
      throw new CliError(`remotegpu-cli clusters printed no JSON: ${r.stdout.slice(0, 300)} ${r.stderr.slice(0, 300)}`);
    }
    if (!Array.isArray(parsed) || !parsed.every((x) => x && typeof x.cluster_id === "string" &&
                                                       typeof x.state === "string")) {
      throw new CliError(`remotegpu-cli clusters answered ${r.stdout.slice(0, 300)}, not [{cluster_id, server, state}]`);
    }
    return parsed.map((x) => ({ cluster_id: x.cluster_id, server: String(x.server ?? ""), state: x.state }));
  }

  /**
   * `remotegpu-cli tunnel --server S`: the API of a server that does not answer directly,
   * through DirectLink (the Python client's transport), on a loopback port of this computer.
   */
  tunnel(server: string, timeoutMs = 45000): Promise<Tunnel> {
    const a = this.argv("tunnel", "--server", server);
    return new Promise((resolve, reject) => {
      let child: ChildProcess;
      try {
        child = spawn(a.command, a.args, { env: this.o.env as NodeJS.ProcessEnv | undefined, windowsHide: true,
                                           stdio: ["pipe", "pipe", "pipe"] });
      } catch (e) {
        reject(new CliError(`${a.command} could not be started: ${(e as Error).message}`));
        return;
      }
      let out = "";
      let err = "";
      let done = false;
      let exited = false;
      const finish = (e: Error | null, t?: Tunnel) => {
        if (done) {
          return;
        }
        done = true;
        clearTimeout(timer);
        if (e) {
          child.kill();
          reject(e);
        } else {
          resolve(t as Tunnel);
        }
      };
      const timer = setTimeout(() => finish(new CliError(
        `remotegpu-cli tunnel --server ${server} opened nothing in ${timeoutMs / 1000} s: ${err.trim().slice(0, 300)}`)),
      timeoutMs);
      child.on("error", (e: NodeJS.ErrnoException) => finish(new CliError(e.code === "ENOENT"
        ? `${a.command} was not found: install mtgpu's client (pip install mtgpu) or set remoteGpu.cliPath`
        : `${a.command} tunnel: ${e.message}`)));
      child.on("exit", (code) => {
        exited = true;
        finish(new CliError(`remotegpu-cli tunnel --server ${server} ended (exit ${code}): ${err.trim().slice(0, 300)}`,
          code));
      });
      child.stderr?.on("data", (c: Buffer) => { err += c.toString("utf8"); });
      child.stdout?.on("data", (c: Buffer) => {
        out += c.toString("utf8");
        const nl = out.indexOf("\n");
        if (nl < 0) {
          return;
        }
        let opened: { address?: unknown; node?: unknown; path?: unknown };
        try {
          opened = JSON.parse(out.slice(0, nl));
        } catch {
          finish(new CliError(`remotegpu-cli tunnel printed ${out.slice(0, 200)}, not JSON`));
          return;
        }
        if (typeof opened.address !== "string") {
          finish(new CliError(`remotegpu-cli tunnel printed ${out.slice(0, 200)}, not {address, node, path}`));
          return;
        }
        finish(null, {
          address: opened.address, node: String(opened.node ?? ""), path: String(opened.path ?? ""),
          close: () => { child.stdin?.end(); },
          ended: () => exited,
        });
      });
    });
  }

  /** A terminal inside a workspace, on its node, in tmux (`remotegpu-cli shell WS`). */
  shellArgv(workspace: string, server: string): Argv {
    return this.argv("shell", "--server", server, workspace);  // options first: after WS all is the command
  }

  /** A workspace's port on this computer's localhost until the terminal is closed. */
  forwardArgv(workspace: string, port: number, server: string, localPort?: number): Argv {
    return this.argv("forward", workspace, String(port), "--server", server,
      ...(localPort ? ["--local-port", String(localPort)] : []));
  }

  /** ssh to a Host that ssh-config wrote; with `workspace`, into that workspace (the node's sshd accepts MTGPU_WORKSPACE). */
  sshArgv(host: string, opts: { command?: string[]; workspace?: string; batch?: boolean } = {}): Argv {
    const args: string[] = [];
    if (this.o.sshConfigFile) {
      args.push("-F", this.o.sshConfigFile);
    }
    if (opts.batch) {
      args.push("-o", "BatchMode=yes");
    }
    if (opts.workspace) {
      args.push("-o", `SetEnv=MTGPU_WORKSPACE=${opts.workspace}`);
      if (!opts.command?.length) {
        args.push("-t");
      }
    }
    args.push(host, ...(opts.command ?? []));
    return { command: this.o.sshPath || "ssh", args };
  }

  /** The tenant's home on a node, asked over ssh (where Remote-SSH opens by default). */
  async remoteHome(host: string): Promise<string> {
    const a = this.sshArgv(host, { command: ["printenv", "HOME"], batch: true });
    const r = await run(a.command, a.args, this.o.env, this.o.timeoutMs ?? 60000);
    const home = r.stdout.trim().split("\n").pop() ?? "";
    if (!home.startsWith("/")) {
      throw new CliError(`ssh ${host} printenv HOME answered ${JSON.stringify(r.stdout.slice(0, 200))}, not a folder`);
    }
    return home;
  }
}

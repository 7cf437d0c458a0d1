/**
 * The extension's running state: settings, the watcher of the joined servers, the last
 * snapshot and the three views, refreshed every REFRESH_MS while one of them is visible.
 */

import * as os from "node:os";

import * as vscode from "vscode";

import {
  ApiClient, ClusterWatcher, configDir, findServer, jobRows, readServers, RemoteGpuCli, serverRows, ServerEntry,
  serversPath, Snapshot, workspaceRows,
} from "../core";
import { RowsProvider } from "./rows";

export const REFRESH_MS = 2000;

export const VIEW_SERVERS = "remoteGpu.servers";
export const VIEW_WORKSPACES = "remoteGpu.workspaces";
export const VIEW_JOBS = "remoteGpu.jobs";

/** remotegpu-cli's folder: the setting, else what remotegpu-cli itself uses. */
export function homeFolder(): string {
  return expandHome(vscode.workspace.getConfiguration("remoteGpu").get<string>("home", "")) ?? configDir();
}

/** A path setting with a leading ~ made absolute (Remote-SSH expands it; ssh -F and remotegpu-cli --file do not). */
function expandHome(p: string): string | undefined {
  const t = p.trim();
  return t ? t.replace(/^~(?=$|[\\/])/, os.homedir()) : undefined;
}

export function cli(): RemoteGpuCli {
  const own = vscode.workspace.getConfiguration("remoteGpu");
  const ssh = vscode.workspace.getConfiguration("remote.SSH");
  const home = own.get<string>("home", "").trim();
  return new RemoteGpuCli({
    cliPath: own.get<string>("cliPath", "remotegpu-cli").trim() || "remotegpu-cli",
    home: expandHome(home),
    // Remote-SSH reads this file; ssh-config must write into the same one.
    sshConfigFile: expandHome(ssh.get<string>("configFile", "")),
    sshPath: expandHome(ssh.get<string>("path", "")),
  });
}

export class Session implements vscode.Disposable {
  readonly servers = new RowsProvider();
  readonly workspaces = new RowsProvider();
  readonly jobs = new RowsProvider();
  private readonly views: vscode.TreeView<unknown>[] = [];
  private watcher: ClusterWatcher;
  private timer: NodeJS.Timeout | undefined;
  private inFlight: Promise<void> | undefined;
  last: Snapshot | undefined;
  private readonly disposables: vscode.Disposable[] = [];

  constructor() {
    this.watcher = this.makeWatcher();
    for (const [id, provider] of [[VIEW_SERVERS, this.servers], [VIEW_WORKSPACES, this.workspaces],
                                  [VIEW_JOBS, this.jobs]] as const) {
      const view = vscode.window.createTreeView(id, { treeDataProvider: provider, showCollapseAll: id === VIEW_SERVERS });
      this.views.push(view as vscode.TreeView<unknown>);
      this.disposables.push(view, view.onDidChangeVisibility(() => this.schedule()));
    }
    this.disposables.push(vscode.workspace.onDidChangeConfiguration((e) => {
      if (e.affectsConfiguration("remoteGpu.home")) {
        this.watcher = this.makeWatcher();
        void this.refresh();
      }
    }));
    this.schedule();
  }

  private makeWatcher(): ClusterWatcher {
    this.watcher?.close();  // the tunnels of the watcher it replaces
    // A server that does not answer directly is asked through `remotegpu-cli tunnel` (DirectLink).
    return new ClusterWatcher({ serversFile: serversPath(homeFolder()), openTunnel: (server) => cli().tunnel(server) });
  }

  private visible(): boolean {
    return this.views.some((v) => v.visible);
  }

  /** Polls while a view is visible; stops when none is (nothing is asked of the servers then). */
  private schedule(): void {
    if (this.visible() && !this.timer) {
      void this.refresh();
      this.timer = setInterval(() => void this.refresh(), REFRESH_MS);
    } else if (!this.visible() && this.timer) {
      clearInterval(this.timer);
      this.timer = undefined;
    }
  }

  /** A new snapshot, unless one is being taken (then that one). */
  refresh(): Promise<void> {
    if (!this.inFlight) {
      this.inFlight = (async () => {
        try {
          const snap = await this.watcher.snapshot();
          this.last = snap;
          this.servers.set(serverRows(snap));
          this.workspaces.set(workspaceRows(snap));
          this.jobs.set(jobRows(snap));
        } catch (e) {
          const row = { id: "refresh-error", label: `cannot refresh: ${(e as Error).message}`, icon: "error",
                        contextValue: "message" };
          for (const p of [this.servers, this.workspaces, this.jobs]) {
            p.set([row]);
          }
        } finally {
          this.inFlight = undefined;
        }
      })();
    }
    return this.inFlight;
  }

  /** The joined servers as servers.json has them now; refuses, saying why, when there are none. */
  async entries(): Promise<ServerEntry[]> {
    const file = await readServers(serversPath(homeFolder()));
    if (!file.entries.length) {
      throw new Error(file.problem ?? `no server joined yet: run \`remotegpu-cli join CODE --server HOST:PORT\``);
    }
    return file.entries;
  }

  async entry(server: string): Promise<ServerEntry> {
    const e = findServer(await this.entries(), server);
    if (!e) {
      throw new Error(`${server} is not in ${serversPath(homeFolder())} any more`);
    }
    return e;
  }

  async client(server: string): Promise<ApiClient> {
    return this.watcher.client(await this.entry(server));
  }

  dispose(): void {
    if (this.timer) {
      clearInterval(this.timer);
    }
    this.watcher.close();
    for (const d of this.disposables) {
      d.dispose();
    }
    this.servers.dispose();
    this.workspaces.dispose();
    this.jobs.dispose();
  }
}

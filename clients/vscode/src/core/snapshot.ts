/**
 * One look at every joined server: its info, its members' live use (where it offers it),
 * the tenant's jobs and workspaces. The views render the last snapshot; the extension
 * takes a new one every few seconds while a view is visible.
 */

import { stat } from "node:fs/promises";

import { ApiClient, ApiError } from "./api";
import type { Tunnel } from "./cli";
import type { Info, Job, NodeUsage, Workspace } from "./models";
import { readServers, ServerEntry, ServersFile } from "./servers";
import { KeyError, loadPrivateKey, TenantKey } from "./signing";

export interface ServerState {
  entry: ServerEntry;
  /** Why nothing could be asked (no key, no answer, refused); null when the server answered. */
  error: string | null;
  info?: Info;
  /** The members with their GPUs and use; absent with `nodesProblem` when not offered. */
  nodes?: NodeUsage[];
  nodesProblem?: string;
  jobs?: Job[];
  workspaces?: Workspace[];
  /** The node's warning that its answers may be old (it does not hear the cluster). */
  stale?: string;
  /** Through DirectLink ("direct" or "relayed", a `remotegpu-cli tunnel`); absent: straight to LISTEN. */
  via?: string;
}

export interface Snapshot {
  file: ServersFile;
  servers: ServerState[];
  /** Date.now() when it was taken. */
  at: number;
}

interface CachedKey {
  mtimeMs: number;
  key: TenantKey;
}

export interface WatcherOptions {
  serversFile: string;
  /** How long a request waits for its answer (5 s); through a DirectLink tunnel at least 20 s, the relay's hops
   * and the node's opening of a stream for each request added. */
  timeoutMs?: number;
  /** How long a server without a remote /v1/nodes route is not asked again. */
  nodesRetryMs?: number;
  now?: () => number;
  /** Opens a DirectLink tunnel to a server that does not answer directly (RemoteGpuCli.tunnel). */
  openTunnel?: (server: string) => Promise<Tunnel>;
}

/** The least wait for an answer through a DirectLink tunnel (a loaded machine took more than 5 s for the first). */
export const TUNNEL_TIMEOUT_MS = 20000;

function strip(state: ServerState & { unreachable?: boolean }): ServerState {
  delete state.unreachable;
  return state;
}

export class ClusterWatcher {
  private readonly keys = new Map<string, CachedKey>();
  private readonly noNodesRoute = new Map<string, number>();
  private readonly tunnels = new Map<string, Promise<Tunnel>>();

  constructor(private readonly o: WatcherOptions) {}

  private now(): number {
    return (this.o.now ?? Date.now)();
  }

  /** The tenant's key for an entry, read again when the file changed. */
  async key(entry: ServerEntry): Promise<TenantKey> {
    let mtimeMs: number;
    try {
      mtimeMs = (await stat(entry.key)).mtimeMs;
    } catch (e) {
      throw new KeyError(`the key of ${entry.server} (${entry.key}) cannot be read: ${(e as Error).message}`);
    }
    const cached = this.keys.get(entry.key);
    if (cached && cached.mtimeMs === mtimeMs) {
      return cached.key;
    }
    const key = await loadPrivateKey(entry.key);
    this.keys.set(entry.key, { mtimeMs, key });
    return key;
  }

  /** A client of the entry's server: through its DirectLink tunnel when one was opened for it. */
  async client(entry: ServerEntry, onStale?: (why: string) => void): Promise<ApiClient> {
    const tunnel = await this.liveTunnel(entry.server);
    const timeoutMs = this.o.timeoutMs ?? 5000;
    return new ApiClient({ server: entry.server, tenant: entry.tenant, key: await this.key(entry),
                           timeoutMs: tunnel ? Math.max(timeoutMs, TUNNEL_TIMEOUT_MS) : timeoutMs, onStale,
                           via: tunnel?.address });
  }

  private async liveTunnel(server: string): Promise<Tunnel | undefined> {
    const opening = this.tunnels.get(server);
    if (!opening) {
      return undefined;
    }
    try {
      const t = await opening;
      if (!t.ended()) {
        return t;
      }
    } catch {
      // it could not be opened: tried again on the next look
    }
    this.tunnels.delete(server);
    return undefined;
  }

  /** Ends every tunnel this watcher opened. */
  close(): void {
    for (const opening of this.tunnels.values()) {
      opening.then((t) => t.close(), () => undefined);
    }
    this.tunnels.clear();
  }

  async serverState(entry: ServerEntry): Promise<ServerState> {
    const state = await this.look(entry);
    const unreachable = state.error !== null && state.unreachable;
    if (unreachable && !state.via && entry.directlink?.enabled && this.o.openTunnel && !this.tunnels.has(entry.server)) {
      // The server does not answer directly: through DirectLink, as remotegpu-cli goes.
      const opening = this.o.openTunnel(entry.server);
      this.tunnels.set(entry.server, opening);
      try {
        await opening;
      } catch (e) {
        this.tunnels.delete(entry.server);
        state.error = `${state.error}; through DirectLink neither: ${(e as Error).message}`;
        return strip(state);
      }
      return strip(await this.look(entry));
    }
    return strip(state);
  }

  private async look(entry: ServerEntry): Promise<ServerState & { unreachable?: boolean }> {
    const state: ServerState & { unreachable?: boolean } = { entry, error: null };
    const tunnel = await this.liveTunnel(entry.server);
    if (tunnel) {
      state.via = tunnel.path || "relayed";
    }
    let client: ApiClient;
    try {
      client = await this.client(entry, (why) => { state.stale = why; });
    } catch (e) {
      state.error = (e as Error).message;
      return state;
    }
    const skipNodes = (this.noNodesRoute.get(entry.server) ?? 0) > this.now();
    const [info, jobs, workspaces, nodes] = await Promise.allSettled([
      client.info(), client.jobs(), client.workspaces(),
      skipNodes ? Promise.reject(new ApiError("", "route-missing")) : client.nodes(),
    ]);
    if (info.status === "fulfilled") {
      state.info = info.value;
    }
    if (jobs.status === "fulfilled") {
      state.jobs = jobs.value;
    }
    if (workspaces.status === "fulfilled") {
      state.workspaces = workspaces.value;
    }
    if (nodes.status === "fulfilled") {
      state.nodes = nodes.value;
    } else {
      const e = nodes.reason as Error;
      if (e instanceof ApiError && e.kind === "route-missing") {
        this.noNodesRoute.set(entry.server, this.now() + (this.o.nodesRetryMs ?? 30000));
        state.nodesProblem = "live use of the members is not offered to remote clients by this server " +
          "(no GET /v1/nodes on its LISTEN); `mtgpu-admin nodes` on a node shows it";
      } else {
        state.nodesProblem = e.message;
      }
    }
    // The tenant's own calls say whether the server answers and takes the key.
    const failed = [jobs, workspaces].find((r) => r.status === "rejected") as PromiseRejectedResult | undefined;
    if (failed) {
      state.error = (failed.reason as Error).message;
      state.unreachable = failed.reason instanceof ApiError && failed.reason.kind === "unreachable";
    }
    return state;
  }

  async snapshot(): Promise<Snapshot> {
    const file = await readServers(this.o.serversFile);
    const servers = await Promise.all(file.entries.map((e) => this.serverState(e)));
    return { file, servers, at: this.now() };
  }
}

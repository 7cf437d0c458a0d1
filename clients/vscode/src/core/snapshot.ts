/**
 * One look at every joined server: its info, its members' live use (where it offers it),
 * the tenant's jobs and workspaces. The views render the last snapshot; the extension
 * takes a new one every few seconds while a view is visible.
 */

import { stat } from "node:fs/promises";

import { ApiClient, ApiError } from "./api";
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
  timeoutMs?: number;
  /** How long a server without a remote /v1/nodes route is not asked again. */
  nodesRetryMs?: number;
  now?: () => number;
}

export class ClusterWatcher {
  private readonly keys = new Map<string, CachedKey>();
  private readonly noNodesRoute = new Map<string, number>();

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

  async client(entry: ServerEntry, onStale?: (why: string) => void): Promise<ApiClient> {
    return new ApiClient({ server: entry.server, tenant: entry.tenant, key: await this.key(entry),
                           timeoutMs: this.o.timeoutMs ?? 5000, onStale });
  }

  async serverState(entry: ServerEntry): Promise<ServerState> {
    const state: ServerState = { entry, error: null };
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
    }
    return state;
  }

  async snapshot(): Promise<Snapshot> {
    const file = await readServers(this.o.serversFile);
    const servers = await Promise.all(file.entries.map((e) => this.serverState(e)));
    return { file, servers, at: this.now() };
  }
}

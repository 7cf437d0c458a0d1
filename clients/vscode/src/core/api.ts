/**
 * The node's network API for a tenant off the node (mtgpu/server/api/routes.py
 * `public_app`): every tenant route signed with the tenant's key (signing.ts). The
 * calls and their shapes are those of mtgpu/client/remote.py, plus the workspace
 * actions the same routes offer (create, start, stop, rm).
 *
 * Plain HTTP to the server's LISTEN address, as the Python client. A server that does
 * not answer directly is reached by remotegpu-cli through DirectLink; this client says
 * so in its error instead of opening a tunnel of its own (the transport exists once).
 */

import * as http from "node:http";

import type { Info, Job, JobList, Me, NodeUsage, SubmitAnswer, Workspace, WorkspaceCreated } from "./models";
import { RequestClock, signHeaders, TenantKey } from "./signing";

export const STALE_HEADER = "x-mtgpu-stale";
export const LOG_STREAM_PATH = "/v1/jobs/{job_id}/log/stream";
const LOG_START = "x-mtgpu-log-start";
const LOG_END = "x-mtgpu-log-end";
const LOG_FINAL = "x-mtgpu-log-final";
const LOG_STATE = "x-mtgpu-job-state";
const LOG_NODE = "x-mtgpu-log-node";

/** Names the node accepts for workspaces (server/api/workspaces.py `_NAME`), or a job id. */
const WORKSPACE_NAME = /^[a-z0-9][a-z0-9_.-]{0,39}$/;

export type ApiErrorKind =
  | "answer" // the node answered with an error: its own message
  | "unreachable" // no answer (refused, timed out, reset)
  | "route-missing" // the node has no such route (an older mtgpu)
  | "protocol" // an answer that is not what the API promises
  | "usage"; // refused here before sending

export class ApiError extends Error {
  constructor(message: string, readonly kind: ApiErrorKind, readonly status = 0, readonly refused = false) {
    super(message);
  }
}

export interface ClientOptions {
  /** HOST:PORT, the node's LISTEN. */
  server: string;
  tenant?: string;
  key?: TenantKey;
  timeoutMs?: number;
  clock?: RequestClock;
  /** Called with the node's warning when its answer may be out of date (it does not hear the cluster). */
  onStale?: (why: string) => void;
  /** HOST:PORT to connect to in place of `server`: a `remotegpu-cli tunnel` to it through DirectLink. */
  via?: string;
}

interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
  received: number;
}

/** Every client of this process shares one clock: no two signed requests get the same time. */
const SHARED_CLOCK = new RequestClock();

export interface LogSlice {
  jobId: number;
  start: number;
  end: number;
  /** The job had ended before `end` was read: this is all of the log. */
  final: boolean;
  state: string;
  node: string;
  data: Buffer;
}

export interface FollowOptions {
  offset?: number;
  tail?: number;
  rank?: number;
  pollMs?: number;
  signal?: AbortSignal;
  onData: (data: Buffer) => void;
}

function header(h: http.IncomingHttpHeaders, name: string): string | undefined {
  const v = h[name];
  return Array.isArray(v) ? v[0] : v;
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) {
      resolve();
      return;
    }
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

export class ApiClient {
  readonly server: string;
  private readonly host: string;
  private readonly port: number;
  private readonly clock: RequestClock;

  constructor(private readonly opts: ClientOptions) {
    this.server = opts.server;
    const target = opts.via ?? opts.server;
    const m = /^\[?([^\]]+?)\]?:(\d+)$/.exec(target);
    if (!m) {
      throw new ApiError(`server ${JSON.stringify(target)} is not HOST:PORT`, "usage");
    }
    this.host = m[1];
    this.port = Number(m[2]);
    this.clock = opts.clock ?? SHARED_CLOCK;
  }

  /** The path with its query, as the Python client builds it (and as it is signed). */
  static withQuery(path: string, params?: Record<string, string | number | boolean | undefined>): string {
    const parts = Object.entries(params ?? {})
      .filter(([, v]) => v !== undefined)
      .map(([k, v]) => `${k}=${typeof v === "boolean" ? (v ? "true" : "false") : v}`);
    return parts.length ? `${path}?${parts.join("&")}` : path;
  }

  /** One request. With `sink`, a successful answer's body goes there as it comes (bounded
   * memory for logs) and `body` holds nothing; `received` counts its bytes either way. */
  private send(method: string, path: string, payload: unknown, signed: boolean, signal?: AbortSignal,
               sink?: (chunk: Buffer) => void): Promise<Answer> {
    const body = payload === undefined ? Buffer.alloc(0) : Buffer.from(JSON.stringify(payload), "utf8");
    const headers: Record<string, string> = { "content-type": "application/json", "content-length": String(body.length) };
    if (signed) {
      if (!this.opts.key || !this.opts.tenant) {
        return Promise.reject(new ApiError("this call needs your key: join first (remotegpu-cli join CODE --server HOST:PORT)",
          "usage"));
      }
      Object.assign(headers, signHeaders(this.opts.key, this.opts.tenant, method, path, body, this.clock.next()));
    }
    return new Promise<Answer>((resolve, reject) => {
      const req = http.request({ host: this.host, port: this.port, method, path, headers, signal,
                                 timeout: this.opts.timeoutMs ?? 15000 }, (res) => {
        const chunks: Buffer[] = [];
        const streaming = sink !== undefined && (res.statusCode ?? 0) < 400;
        let received = 0;
        res.on("data", (c: Buffer) => {
          received += c.length;
          if (streaming) {
            sink(c);
          } else {
            chunks.push(c);
          }
        });
        res.on("end", () => {
          const stale = header(res.headers, STALE_HEADER);
          if (stale && this.opts.onStale) {
            this.opts.onStale(stale);
          }
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks), received });
        });
        res.on("error", (e) => reject(this.unreachable(e)));
        res.on("aborted", () => reject(this.unreachable(new Error("the answer broke off"))));
      });
      req.on("timeout", () => req.destroy(new Error(`no answer in ${(this.opts.timeoutMs ?? 15000) / 1000} s`)));
      req.on("error", (e) => reject(this.unreachable(e)));
      req.end(body);
    });
  }

  private unreachable(e: Error): ApiError {
    if (e instanceof ApiError) {
      return e;
    }
    if (this.opts.via) {
      return new ApiError(`cannot reach ${this.server} through DirectLink (${this.opts.via}): ${e.message}`,
        "unreachable");
    }
    return new ApiError(`cannot reach ${this.server}: ${e.message} (a server of a cluster with DirectLink relays ` +
      "is reached through them when it does not answer directly)", "unreachable");
  }

  /** The JSON of an answer, or ApiError with the node's own message. */
  static parse<T>(a: Answer, what: string): T {
    let body: unknown;
    const text = a.body.toString("utf8");
    try {
      body = text ? JSON.parse(text) : null;
    } catch {
      body = undefined;
    }
    if (a.status >= 400) {
      const obj = (body && typeof body === "object" ? body : {}) as Record<string, unknown>;
      if (a.status === 404 && obj.detail === "Not Found" && !("error" in obj)) {
        throw new ApiError(`this server has no ${what} route: it runs an older mtgpu than this extension`,
          "route-missing", 404);
      }
      const msg = obj.error ?? obj.detail ?? text;
      throw new ApiError(typeof msg === "string" ? msg : JSON.stringify(msg), "answer", a.status, Boolean(obj.refused));
    }
    if (body === undefined) {
      throw new ApiError(`the answer to ${what} is not JSON: ${text.slice(0, 200)}`, "protocol", a.status);
    }
    return body as T;
  }

  async call<T>(method: string, path: string, payload?: unknown, signed = true, signal?: AbortSignal): Promise<T> {
    return ApiClient.parse<T>(await this.send(method, path, payload, signed, signal), `${method} ${path.split("?")[0]}`);
  }

  // ------------------------------------------------------------ the calls
  info(): Promise<Info> {
    return this.call("GET", "/v1/info", undefined, false);
  }

  me(): Promise<Me> {
    return this.call("GET", "/v1/me");
  }

  /** Every member with its GPUs and live use, where the server offers it to remote tenants. */
  nodes(): Promise<NodeUsage[]> {
    return this.call("GET", "/v1/nodes");
  }

  jobs(activeOnly = false): Promise<JobList> {
    return this.call("GET", ApiClient.withQuery("/v1/jobs", { active: activeOnly ? true : undefined }));
  }

  job(jobId: number): Promise<Job> {
    return this.call("GET", `/v1/jobs/${ApiClient.jobId(jobId)}`);
  }

  submit(script: string, overrides: Record<string, string> = {}): Promise<SubmitAnswer> {
    return this.call("POST", "/v1/jobs", { script, overrides });
  }

  cancel(jobId: number): Promise<{ cancelled: number[] }> {
    return this.call("POST", `/v1/jobs/${ApiClient.jobId(jobId)}/cancel`);
  }

  workspaces(): Promise<Workspace[]> {
    return this.call("GET", "/v1/workspaces");
  }

  workspace(name: string): Promise<Workspace> {
    return this.call("GET", `/v1/workspaces/${ApiClient.workspaceName(name)}`);
  }

  createWorkspace(req: {
    template?: string; image?: string; name?: string; resources?: Record<string, string>; ports?: number[];
  }): Promise<WorkspaceCreated> {
    const body: Record<string, unknown> = { resources: req.resources ?? {}, ports: req.ports ?? [] };
    for (const k of ["template", "image", "name"] as const) {
      if (req[k] !== undefined) {
        body[k] = req[k];
      }
    }
    return this.call("POST", "/v1/workspaces", body);
  }

  workspaceAction(name: string, action: "start" | "stop" | "rm"): Promise<Workspace | { removed: string; job_id: number }> {
    return this.call("POST", `/v1/workspaces/${ApiClient.workspaceName(name)}/${action}`);
  }

  /**
   * Bytes [start, end) of a job's log: from `offset` (or its last `tail` lines) to its size
   * now. With `sink`, the bytes go there as they arrive and `data` is empty.
   */
  async logSlice(jobId: number, offset = 0, tail?: number, rank = 0, signal?: AbortSignal,
                 sink?: (chunk: Buffer) => void): Promise<LogSlice> {
    const path = ApiClient.withQuery(LOG_STREAM_PATH.replace("{job_id}", String(ApiClient.jobId(jobId))),
      { offset, rank, tail });
    const a = await this.send("GET", path, undefined, true, signal, sink);
    if (a.status >= 400) {
      ApiClient.parse(a, "job log");
    }
    const start = Number(header(a.headers, LOG_START));
    const end = Number(header(a.headers, LOG_END));
    if (!Number.isInteger(start) || !Number.isInteger(end) || header(a.headers, LOG_START) === undefined) {
      throw new ApiError(`the node's answer for the log of job ${jobId} has no valid ${LOG_START}/${LOG_END} headers`,
        "protocol", a.status);
    }
    if (a.received !== end - start) {
      throw new ApiError(`the log of job ${jobId} broke off: ${a.received} of ${end - start} bytes came`,
        "unreachable", a.status);
    }
    return { jobId, start, end, final: header(a.headers, LOG_FINAL) === "1", state: header(a.headers, LOG_STATE) ?? "",
             node: header(a.headers, LOG_NODE) ?? "", data: a.body };
  }

  /**
   * Follows a job's log until the job has ended (`mt-job logs -f`): each answer's bytes go
   * to `onData` as they arrive, then the next request starts at its end. Resolves with the last slice
   * (its `state` is the job's final state) or, when `signal` aborts, with null.
   */
  async followLog(jobId: number, o: FollowOptions): Promise<LogSlice | null> {
    let offset = o.offset ?? 0;
    let tail = o.tail;
    for (;;) {
      if (o.signal?.aborted) {
        return null;
      }
      let part: LogSlice;
      try {
        part = await this.logSlice(jobId, offset, tail, o.rank ?? 0, o.signal, o.onData);
      } catch (e) {
        if (o.signal?.aborted) {
          return null;
        }
        throw e;
      }
      tail = undefined;
      offset = part.end;
      if (part.final) {
        return part;
      }
      await sleep(o.pollMs ?? 500, o.signal);
    }
  }

  static jobId(jobId: number): number {
    if (!Number.isSafeInteger(jobId) || jobId < 0) {
      throw new ApiError(`${jobId} is not a job id`, "usage");
    }
    return jobId;
  }

  /** Workspace names go into the path as they are: only the names the node accepts are sent. */
  static workspaceName(name: string): string {
    if (!WORKSPACE_NAME.test(name)) {
      throw new ApiError(`${JSON.stringify(name)} is not a workspace name (1-40 lower-case letters, digits, '.', '_' ` +
        "and '-', starting with a letter or digit)", "usage");
    }
    return name;
  }
}

/**
 * The API's answers as the node sends them (mtgpu/server/api/service.py `job_json`,
 * workspaces.py `view`, `nodes_view`, `info`), typed for the fields the extension reads,
 * and the few words the views show for them.
 */

export type JobState = "queued" | "running" | "completed" | "failed" | "cancelled" | "lost" | "stopped";

/** Final states: nothing more will happen to the job (model/job.py `JobState.final`). */
export function isFinal(state: string): boolean {
  return !["queued", "running", "stopped"].includes(state);
}

export interface JobGpu {
  node: string;
  index: number;
  fraction: number;
  vram_bytes: number | null;
  mode: string;
}

export interface Job {
  id: number;
  name: string;
  state: JobState;
  tenant: string;
  exit_code: number | null;
  nodes: string[];
  gpus: JobGpu[];
  reason: string;
  submitted_at: number;
  started_at: number | null;
  ended_at: number | null;
  spec: { workspace: unknown | null; container: string | null; [k: string]: unknown };
  [k: string]: unknown;
}

export type JobList = Job[];

export interface WorkspacePort {
  port: number;
  host_port: number | null;
  url: string | null;
}

export interface Workspace extends Job {
  workspace: {
    name: string;
    source: string;
    image: string | null;
    node: string | null;
    node_address: string | null;
    container: string | null;
    ports: WorkspacePort[];
    command: string[];
  };
}

export interface Me {
  name: string;
  uid: number;
  gid: number;
  clusters: string[];
  cluster_id: string;
  node: string;
}

export interface Info {
  node: string;
  cluster_mode: string;
  cluster_id: string | null;
  ssh_listen: string;
  version: string;
  scheduler: string | null;
  is_scheduler: boolean;
  placements: number;
  [k: string]: unknown;
}

export interface GpuUsage {
  index: number;
  vendor: string;
  model: string;
  vram_total_bytes: number;
  vram_used_bytes: number | null;
  utilization_pct: number | null;
  committed_fraction: number;
  committed_vram_bytes: number;
  exclusive: boolean;
}

export interface NodeUsage {
  name: string;
  address: string;
  role: string;
  state: string;
  reason: string | null;
  cpus: number;
  cpus_committed: number;
  mem_total_bytes: number;
  mem_committed_bytes: number;
  mem_available_bytes: number | null;
  cpu_util_pct: number | null;
  running_jobs: number[];
  gpus: GpuUsage[];
}

export interface SubmitAnswer {
  job_id: number;
  job_ids: number[];
  warning?: string;
}

export interface WorkspaceCreated {
  name: string;
  job_id: number;
  warning?: string;
}

// ------------------------------------------------------------ words for the views
const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

export function formatBytes(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) {
    return "?";
  }
  let v = n;
  let i = 0;
  while (v >= 1024 && i < UNITS.length - 1) {
    v /= 1024;
    i += 1;
  }
  return i === 0 ? `${v} B` : `${v.toFixed(1)} ${UNITS[i]}`;
}

function pct(v: number | null | undefined): string {
  return v === null || v === undefined ? "?" : `${Math.round(v)}%`;
}

/** `node-a:0,node-a:1(0.5)` as the CLIs print a job's GPUs. */
export function gpuText(job: Pick<Job, "gpus">): string {
  if (!job.gpus?.length) {
    return "-";
  }
  return job.gpus.map((g) => `${g.node}:${g.index}` + (g.fraction >= 1 ? "" : `(${Number(g.fraction.toPrecision(2))})`))
    .join(",");
}

export function jobDescription(job: Job): string {
  const parts: string[] = [job.state];
  if (job.nodes.length) {
    parts.push(job.nodes.join(","));
  }
  if (job.gpus.length) {
    parts.push(`GPUs ${gpuText(job)}`);
  }
  if (job.exit_code !== null && job.exit_code !== undefined) {
    parts.push(`exit ${job.exit_code}`);
  }
  if (job.reason) {
    parts.push(job.reason);
  }
  return parts.join(" · ");
}

export function workspaceDescription(ws: Workspace): string {
  const w = ws.workspace;
  const parts: string[] = [ws.state];
  if (w.node) {
    parts.push(w.node);
  }
  const ports = w.ports.map((p) => String(p.port));
  if (ports.length) {
    parts.push(`ports ${ports.join(",")}`);
  }
  if (ws.reason) {
    parts.push(ws.reason);
  }
  return parts.join(" · ");
}

/** One line for a GPU: model, what is committed to jobs and what is measured. */
export function gpuLine(g: GpuUsage): string {
  const committed = g.exclusive ? "exclusive" : g.committed_fraction > 0 ? `${Number((g.committed_fraction * 100).toFixed(0))}% committed` : "free";
  return `GPU ${g.index} ${g.model}: ${pct(g.utilization_pct)} busy, ` +
    `${formatBytes(g.vram_used_bytes)} / ${formatBytes(g.vram_total_bytes)} VRAM, ${committed}`;
}

export function nodeDescription(n: NodeUsage): string {
  const parts = [n.state, n.role, `${n.gpus.length} GPU${n.gpus.length === 1 ? "" : "s"}`,
    `CPU ${pct(n.cpu_util_pct)}`, `${n.cpus_committed}/${n.cpus} cores committed`,
    `${formatBytes(n.mem_committed_bytes)} / ${formatBytes(n.mem_total_bytes)} memory committed`];
  if (n.running_jobs.length) {
    parts.push(`${n.running_jobs.length} running`);
  }
  if (n.reason) {
    parts.push(n.reason);
  }
  return parts.join(" · ");
}

/** "2 running, 1 queued" of a tenant's jobs (workspaces included, as `mt-job list`). */
export function jobCounts(jobs: Job[]): string {
  const counts = new Map<string, number>();
  for (const j of jobs) {
    if (!isFinal(j.state)) {
      counts.set(j.state, (counts.get(j.state) ?? 0) + 1);
    }
  }
  const parts = ["running", "queued", "stopped"].filter((s) => counts.has(s)).map((s) => `${counts.get(s)} ${s}`);
  return parts.length ? parts.join(", ") : "none active";
}

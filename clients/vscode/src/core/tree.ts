/**
 * What the three views show, as plain rows: label, description, tooltip, the context
 * value the menus match and a reference to the thing a command acts on. The vscode side
 * (src/views) turns rows into TreeItems and nothing else, so what a user sees is tested
 * here without VS Code.
 */

import { gpuLine, isFinal, Job, jobCounts, jobDescription, nodeDescription, Workspace, workspaceDescription } from "./models";
import type { ServerEntry } from "./servers";
import type { ServerState, Snapshot } from "./snapshot";

export type Ref =
  | { kind: "server"; server: string }
  | { kind: "node"; server: string; node: string; cluster: string }
  | { kind: "workspace"; server: string; name: string; state: string; node: string | null; cluster: string;
      container: string | null; ports: number[] }
  | { kind: "job"; server: string; id: number; state: string; name: string };

export interface Row {
  id: string;
  label: string;
  description?: string;
  tooltip?: string;
  /** Matched by the menus in package.json (`viewItem == ...`). */
  contextValue?: string;
  /** A codicon name. */
  icon?: string;
  children?: Row[];
  ref?: Ref;
}

/** Finished jobs shown per server, newest first, after every active one. */
export const FINISHED_JOBS_SHOWN = 25;

function message(id: string, label: string, tooltip?: string, icon = "info"): Row {
  return { id, label, tooltip: tooltip ?? label, contextValue: "message", icon };
}

function serverLabel(e: ServerEntry): string {
  return e.cluster_id ? `${e.cluster_id} (${e.server})` : e.server;
}

/** The members a tenant can open a terminal on: the live list, else what the join and DirectLink told. */
function memberNames(s: ServerState): string[] {
  if (s.nodes) {
    return s.nodes.map((n) => n.name);
  }
  const names = new Set<string>();
  if (s.entry.node) {
    names.add(s.entry.node);
  }
  for (const n of s.entry.directlink?.nodes ?? []) {
    names.add(n.name);
  }
  return [...names].sort();
}

function fileProblem(snap: Snapshot, view: string): Row[] {
  return snap.file.problem ? [message(`${view}:file`, snap.file.problem, snap.file.problem, "warning")] : [];
}

// ------------------------------------------------------------ Servers
export function serverRows(snap: Snapshot): Row[] {
  const rows = fileProblem(snap, "servers");
  for (const s of snap.servers) {
    const e = s.entry;
    const id = `server:${e.server}`;
    const children: Row[] = [];
    if (s.error) {
      children.push(message(`${id}:error`, s.error, s.error, "error"));
    }
    if (s.stale) {
      children.push(message(`${id}:stale`, s.stale, s.stale, "warning"));
    }
    if (s.jobs) {
      children.push(message(`${id}:jobs`, `your jobs: ${jobCounts(s.jobs)}`, undefined, "list-unordered"));
    }
    const usage = new Map((s.nodes ?? []).map((n) => [n.name, n]));
    for (const name of memberNames(s)) {
      const n = usage.get(name);
      const nid = `${id}:node:${name}`;
      children.push({
        id: nid,
        label: name,
        description: n ? nodeDescription(n) : (s.info?.node === name ? `${s.info.cluster_mode}` : undefined),
        tooltip: n ? [nodeDescription(n), ...n.gpus.map(gpuLine)].join("\n") : `${name} of ${e.cluster_id}`,
        contextValue: "node",
        icon: "server",
        ref: { kind: "node", server: e.server, node: name, cluster: e.cluster_id },
        children: n ? n.gpus.map((g) => ({ id: `${nid}:gpu:${g.index}`, label: gpuLine(g), icon: "circuit-board",
                                            contextValue: "gpu" })) : undefined,
      });
    }
    if (s.nodesProblem && !s.error) {
      children.push(message(`${id}:nodes`, s.nodesProblem, s.nodesProblem, "info"));
    }
    const mode = s.info ? `${s.info.cluster_mode}, scheduler ${s.info.scheduler ?? "?"}` : undefined;
    rows.push({
      id,
      label: serverLabel(e),
      description: s.error ? "not answering"
        : `${e.tenant}${mode ? ` · ${mode}` : ""}${s.via ? ` · through DirectLink (${s.via})` : ""}`,
      tooltip: `${e.server}: tenant ${e.tenant} (uid ${e.uid}) of ${e.cluster_id}, key ${e.key}`,
      contextValue: "server",
      icon: s.error ? "warning" : "vm",
      ref: { kind: "server", server: e.server },
      children,
    });
  }
  return rows;
}

// ------------------------------------------------------------ Workspaces
function workspaceRow(s: ServerState, ws: Workspace): Row {
  const w = ws.workspace;
  const lines = [`${w.name} (job ${ws.id}): ${ws.state}`, `from ${w.source}`, w.image ? `image ${w.image}` : "",
    w.node ? `on ${w.node}` : "", w.container ? `container ${w.container}` : "",
    ...w.ports.map((p) => `port ${p.port}` + (p.url ? `: ${p.url} (on the node; forward it to reach it here)` : "")),
    ws.reason ? `reason: ${ws.reason}` : ""].filter(Boolean);
  return {
    id: `ws:${s.entry.server}:${ws.id}`,
    label: w.name,
    description: workspaceDescription(ws),
    tooltip: lines.join("\n"),
    contextValue: `workspace-${ws.state}`,
    icon: ws.state === "running" ? "vm-running" : ws.state === "queued" ? "watch" : "vm-outline",
    ref: { kind: "workspace", server: s.entry.server, name: w.name, state: ws.state, node: w.node,
           cluster: s.entry.cluster_id, container: w.container, ports: w.ports.map((p) => p.port) },
  };
}

function grouped(snap: Snapshot, view: string, rowsOf: (s: ServerState) => Row[], empty: string): Row[] {
  const rows = fileProblem(snap, view);
  const one = snap.servers.length === 1;
  for (const s of snap.servers) {
    let children: Row[];
    if (s.error) {
      children = [message(`${view}:${s.entry.server}:error`, s.error, s.error, "error")];
    } else {
      children = rowsOf(s);
      if (!children.length) {
        children = [message(`${view}:${s.entry.server}:empty`, empty)];
      }
    }
    if (one) {
      rows.push(...children);
    } else {
      rows.push({ id: `${view}:server:${s.entry.server}`, label: serverLabel(s.entry), icon: "vm",
                  contextValue: "server", ref: { kind: "server", server: s.entry.server }, children });
    }
  }
  return rows;
}

export function workspaceRows(snap: Snapshot): Row[] {
  return grouped(snap, "workspaces", (s) => (s.workspaces ?? []).map((ws) => workspaceRow(s, ws)),
    "no workspaces: create one (+ above) or with mt-container create on a node");
}

// ------------------------------------------------------------ Jobs
function jobRow(s: ServerState, j: Job): Row {
  return {
    id: `job:${s.entry.server}:${j.id}`,
    label: `${j.id} ${j.name}`,
    description: jobDescription(j),
    tooltip: [`job ${j.id} (${j.name}): ${j.state}`, jobDescription(j)].join("\n"),
    contextValue: isFinal(j.state) ? "job-final" : "job-active",
    icon: j.state === "running" ? "play-circle" : j.state === "queued" ? "watch" : j.state === "completed" ? "pass"
      : j.state === "cancelled" ? "circle-slash" : "error",
    ref: { kind: "job", server: s.entry.server, id: j.id, state: j.state, name: j.name },
  };
}

/** Jobs that are not workspaces (those are in the Workspaces view): every active one, then the newest finished. */
export function visibleJobs(jobs: Job[], finishedShown = FINISHED_JOBS_SHOWN): Job[] {
  const plain = jobs.filter((j) => !j.spec?.workspace);
  const active = plain.filter((j) => !isFinal(j.state)).sort((a, b) => a.id - b.id);
  const finished = plain.filter((j) => isFinal(j.state)).sort((a, b) => b.id - a.id).slice(0, finishedShown);
  return [...active, ...finished];
}

export function jobRows(snap: Snapshot, finishedShown = FINISHED_JOBS_SHOWN): Row[] {
  return grouped(snap, "jobs", (s) => visibleJobs(s.jobs ?? [], finishedShown).map((j) => jobRow(s, j)),
    "no jobs: submit one (the job file open in the editor) or with remotegpu-cli submit");
}

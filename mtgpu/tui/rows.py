"""The terminal app's view model: what each view shows, as plain rows built from what
the clusters answered. Pure functions (no textual, no network), so that the rows, their
order and the filter are unit-tested and the benchmark times the same code the app runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

GIB = 1024 ** 3

SERVER_COLUMNS = ("CLUSTER", "NODE", "STATE", "GPUS", "UTIL %", "VRAM GiB used/total", "FREE", "MY JOBS", "PATH")
# The same columns on a narrow screen (docs/TUI.md): GPU models without vendor and memory
# words, the mean utilization, the VRAM used/total of all GPUs, and FREE as 'GPUS VRAM'.
SERVER_SHORT_COLUMNS = ("CLUSTER", "NODE", "STATE", "GPUS", "UTIL%", "VRAM GiB", "FREE", "MY JOBS", "PATH")
JOB_COLUMNS = ("CLUSTER", "ID", "NAME", "STATE", "NODES", "GPUS", "EXIT", "REASON")
WORKSPACE_COLUMNS = ("CLUSTER", "NAME", "STATE", "NODE", "IMAGE", "PORTS", "REASON")


@dataclass
class ClusterSnapshot:
    """What one joined cluster answered at `fetched_at` (or why it did not: `error`)."""

    cluster: str
    server: str
    tenant: str
    path: str = "direct"
    nodes: list[dict] | None = None
    jobs: list[dict] | None = None
    workspaces: list[dict] | None = None
    error: str | None = None
    fetched_at: float = 0.0


@dataclass(frozen=True)
class Row:
    """One line of a view: `key` stays the same across refreshes (the table updates it in
    place), `ref` is what an action on the line acts on (cluster and job id or workspace)."""

    key: str
    cells: tuple[str, ...]
    ref: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    short: tuple[str, ...] | None = field(default=None, compare=False, hash=False)
    """The cells as a narrow screen shows them (None: the same cells)."""


@lru_cache(maxsize=4096)
def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.0f}" if n >= 10 * GIB or n == 0 else f"{n / GIB:.1f}"


@lru_cache(maxsize=512)
def _pct(p: float | None) -> str:
    return "-" if p is None else f"{p:.0f}"


def gpu_free(g: dict) -> bool:
    """A GPU nothing of the scheduler's holds."""
    return not g.get("exclusive") and not g.get("committed_fraction")


def gpu_columns(gpus: list[dict]) -> tuple[tuple[str, str, str, str], tuple[str, str, str, str]]:
    """A node's GPU columns, wide and narrow, in one pass over its GPUs (a refresh makes
    them for every node): see gpu_cells and gpu_short_cells."""
    if not gpus:
        return ("none", "-", "-", "0/0 GPU, 0 GiB"), ("none", "-", "-", "0/0 0G")
    counts: dict[str, int] = {}
    util, vram = [], []
    util_sum, util_n = 0.0, 0
    free = left = used_all = total_all = 0
    for g in gpus:
        get = g.get
        model = get("model") or "?"
        counts[model] = counts.get(model, 0) + 1
        u = get("utilization_pct")
        if u is None:
            util.append("-")
        else:
            util.append(f"{u:.0f}")
            util_sum += u
            util_n += 1
        total, used = g["vram_total_bytes"], get("vram_used_bytes")
        vram.append(_used_of(used, total))
        used_all += used or 0
        total_all += total
        if not get("exclusive") and not get("committed_fraction"):
            free += 1
        left += max(0, total - max(used or 0, get("committed_vram_bytes") or 0))
    short: dict[str, int] = {}
    for m, n in counts.items():
        k = short_model(m)
        short[k] = short.get(k, 0) + n
    wide = (", ".join(f"{n}x {m}" for m, n in counts.items()), " ".join(util), " ".join(vram),
            f"{free}/{len(gpus)} GPU, {_gib(left)} GiB")
    narrow = ("+".join(f"{n}x {m}" for m, n in short.items()), _pct(util_sum / util_n if util_n else None),
              f"{used_all / GIB:.0f}/{total_all / GIB:.0f}", f"{free}/{len(gpus)} {left / GIB:.0f}G")
    return wide, narrow


def gpu_cells(gpus: list[dict]) -> tuple[str, str, str, str]:
    """A node's GPU columns: the models counted ('8x H100' or '1x A100, 2x T4'),
    utilization % and VRAM used/total GiB per GPU, and the free GPUs with the VRAM left on
    all (total less what is used or committed)."""
    return gpu_columns(gpus)[0]


@lru_cache(maxsize=8192)
def _used_of(used: int | None, total: int) -> str:
    return f"{_gib(used)}/{_gib(total)}"


_VENDOR_WORDS = frozenset(("nvidia", "tesla", "amd", "geforce", "instinct", "intel"))
_FORM_WORDS = ("HBM", "PCIE", "SXM", "NVL")


@lru_cache(maxsize=256)
def short_model(model: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100', 'NVIDIA A100-SXM4-80GB' -> 'A100', 'Tesla T4' -> 'T4':
    the model without its vendor, memory size and form-factor words."""
    words = [w for w in model.split() if w.lower() not in _VENDOR_WORDS]
    kept = []
    for w in words:
        w = w.split("-", 1)[0] if kept or "-" in w else w
        memory_or_form = w[:1].isdigit() and w.upper().endswith("GB") or w.upper().startswith(_FORM_WORDS)
        if not w or (kept and memory_or_form):
            continue
        kept.append(w)
    return " ".join(kept) or model


def gpu_short_cells(gpus: list[dict]) -> tuple[str, str, str, str]:
    """A node's GPU columns on a narrow screen: '8x H100' ('1x A100+2x T4'), the mean
    utilization %, VRAM used/total GiB of all its GPUs, and free GPUs with the VRAM left
    ('2/8 310G')."""
    return gpu_columns(gpus)[1]


def free_text(gpus: list[dict]) -> str:
    """Free GPUs and the VRAM left on all GPUs (total less what is used or committed)."""
    return gpu_cells(gpus)[3]


ACTIVE_STATES = ("queued", "running")  # JobState's non-final states that hold or wait for GPUs


def _jobs_by_node(jobs: list[dict]) -> dict[str, list[int]]:
    """Ids of the caller's active jobs (workspaces included) per node they run on."""
    out: dict[str, list[int]] = {}
    for j in jobs:
        if j["state"] in ACTIVE_STATES:
            for node in j.get("nodes") or []:
                out.setdefault(node, []).append(j["id"])
    return out


def server_rows(snapshots: list[ClusterSnapshot]) -> list[Row]:
    """One row per member of every joined cluster; a cluster that did not answer is one
    row saying so (with its last known members kept, marked stale, when it answered before)."""
    rows: list[Row] = []
    for s in snapshots:
        if s.error is not None and not s.nodes:
            rows.append(Row(f"{s.cluster}!", (s.cluster, s.server, "unreachable", "-", "-", "-", "-", "-",
                                              s.error), {"cluster": s.cluster}))
            continue
        mine = _jobs_by_node(s.jobs or [])
        for n in s.nodes or []:
            gpus = n.get("gpus") or []
            state = n.get("state") or "?"
            if s.error is not None:
                state = f"stale ({state})"
            wide, narrow = gpu_columns(gpus)
            jobs = ",".join(str(i) for i in mine.get(n["name"], [])) or "-"
            path = s.path if s.error is None else f"unreachable: {s.error}"
            rows.append(Row(f"{s.cluster}/{n['name']}", (s.cluster, n["name"], state, *wide, jobs, path),
                            {"cluster": s.cluster, "node": n["name"]},
                            (s.cluster, n["name"], state, *narrow, jobs, path)))
    return rows


def job_rows(snapshots: list[ClusterSnapshot]) -> list[Row]:
    """The caller's jobs on every cluster (workspaces are in their own view)."""
    rows: list[Row] = []
    for s in snapshots:
        for j in s.jobs or []:
            if _is_workspace(j):
                continue
            gpus = j.get("gpus") or []
            rows.append(Row(f"{s.cluster}/{j['id']}", (
                s.cluster, str(j["id"]), j.get("name") or f"job-{j['id']}", j["state"],
                ",".join(j.get("nodes") or []) or "-", str(len(gpus)) if gpus else "-",
                "-" if j.get("exit_code") is None else str(j["exit_code"]), j.get("reason") or "",
            ), {"cluster": s.cluster, "job_id": j["id"], "state": j["state"]}))
    return rows


def workspace_rows(snapshots: list[ClusterSnapshot]) -> list[Row]:
    rows: list[Row] = []
    for s in snapshots:
        for ws in s.workspaces or []:
            w = ws["workspace"]
            ports = [p["port"] for p in w.get("ports") or []]
            rows.append(Row(f"{s.cluster}/{w['name']}", (
                s.cluster, w["name"], ws["state"], w.get("node") or "-", w.get("image") or "-",
                ",".join(str(p) for p in ports) or "-", ws.get("reason") or "",
            ), {"cluster": s.cluster, "name": w["name"], "state": ws["state"], "ports": ports,
                "job_id": ws.get("id"), "node": w.get("node"), "container": w.get("container")}))
    return rows


def _is_workspace(j: dict) -> bool:
    return bool((j.get("spec") or {}).get("workspace"))


def filter_rows(rows: list[Row], text: str) -> list[Row]:
    """The rows where every word of `text` is in some cell (case-insensitive); all rows
    for an empty filter."""
    words = text.lower().split()
    if not words:
        return rows
    return [r for r in rows if all(any(w in c.lower() for c in r.cells) for w in words)]


def _natural(cell: str) -> tuple:
    """Numbers sort as numbers ('9' before '10'), the rest as text."""
    head = cell.split(" ", 1)[0].split("/", 1)[0]
    try:
        return (0, float(head), cell)
    except ValueError:
        return (1, 0.0, cell.lower())


def sort_rows(rows: list[Row], column: int, reverse: bool = False) -> list[Row]:
    """Rows ordered by one column (then by key, so that the order is stable across refreshes)."""
    return sorted(rows, key=lambda r: (_natural(r.cells[column]) if column < len(r.cells) else (2,), r.key),
                  reverse=reverse)


def snapshot_json(s: ClusterSnapshot) -> dict:
    """The servers view of one cluster for scripts (`remotegpu-cli servers --live --json`)."""
    mine = _jobs_by_node(s.jobs or [])
    return {"cluster": s.cluster, "server": s.server, "tenant": s.tenant, "path": s.path, "error": s.error,
            "nodes": [{**n, "my_jobs": mine.get(n["name"], [])} for n in s.nodes or []]}


def job_items(snapshots: list[ClusterSnapshot]) -> list[dict]:
    """The jobs view for scripts (`remotegpu-cli jobs --json` without --server): the same
    jobs as job_rows (workspaces are in their own view), each as the API gives it with
    the "cluster" it is on."""
    return [{**j, "cluster": s.cluster} for s in snapshots for j in s.jobs or [] if not _is_workspace(j)]


def workspace_items(snapshots: list[ClusterSnapshot]) -> list[dict]:
    """The workspaces view for scripts (`remotegpu-cli workspaces --json` without
    --server): each workspace as the API gives it, with the "cluster" it is on."""
    return [{**ws, "cluster": s.cluster} for s in snapshots for ws in s.workspaces or []]

"""Accounting (docs/ACCOUNTING.md): what a finished job used, kept in its record, and the
per-day summary that outlives the record once JOB_RETENTION_DAYS forgets it.

Pure: no clock and no I/O. Every time is one the job's record carries (stamped by the
commands' `at`), so replaying a journal gives the same figures to the second.

What counts is what was *reserved*, from an attempt's start to the moment the cluster took
the reservation back (its end, cancel or requeue): GPU-seconds are each GPU's reserved share
(1 for a whole GPU, 0.5 for `gpus=0.5`, 0 for `gpu-mode=oversubscribe`, which reserves
nothing) times the seconds; CPU-seconds and memory byte-seconds are the cores and bytes
given times the seconds. Every attempt that ran counts (a requeued attempt too). The wait is
from the submission to the first start (a job cancelled before it started waited until then).
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
import re
from dataclasses import dataclass, field
from typing import Callable, Iterator, NamedTuple

from .gpu import normalize_model
from .job import Job, NodeAllocation

DAY_S = 86400.0
# The summary keeps this many days back from the newest forget (a year's report is always whole).
SUMMARY_KEEP_DAYS = 400
# Wait-time histogram bucket edges in seconds (1-2-5 steps, then minutes, hours and days):
# bucket 0 is [0, 1 s), bucket i is [EDGES[i-1], EDGES[i]), the last is 30 days and over.
WAIT_EDGES_S = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 2 * 3600, 4 * 3600, 8 * 3600,
                12 * 3600, 86400, 2 * 86400, 4 * 86400, 7 * 86400, 14 * 86400, 30 * 86400)
PERCENTILES = (50, 90, 99)

_DAY_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
DAY_FORMAT = "YYYY-MM-DD"


class UsageError(ValueError):
    """A bad date or grouping; the message names the value and what is allowed."""


def utc_day(ts: float) -> str:
    """The UTC calendar day of a Unix time, as YYYY-MM-DD."""
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d")


def parse_day(text: str, what: str) -> str:
    """`text` as a YYYY-MM-DD day (checked as a real date); `what` names it in the error."""
    if not _DAY_RE.match(text or ""):
        raise UsageError(f"{what} {text!r} is not a date: give {DAY_FORMAT} (e.g. 2025-01-31)")
    try:
        dt.date.fromisoformat(text)
    except ValueError as e:
        raise UsageError(f"{what} {text!r} is not a date ({e}): give {DAY_FORMAT} (e.g. 2025-01-31)") from None
    return text


def wait_bucket(wait_s: float) -> int:
    return bisect.bisect_right(WAIT_EDGES_S, wait_s)


def exact_percentile(samples: list[float], p: float) -> float | None:
    """Nearest-rank percentile: the smallest sample with at least p% of them at or below it."""
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(p / 100.0 * len(ordered)) - 1)]


def histogram_percentile(counts: dict[int, int], p: float) -> float | None:
    """The nearest-rank percentile as its bucket's upper edge ("waited at most this long");
    the open last bucket gives its lower edge, 30 days."""
    n = sum(counts.values())
    if n <= 0:
        return None
    rank = max(1, math.ceil(p / 100.0 * n))
    seen = 0
    for b in sorted(counts):
        seen += counts[b]
        if seen >= rank:
            return float(WAIT_EDGES_S[min(b, len(WAIT_EDGES_S) - 1)])
    return float(WAIT_EDGES_S[-1])


@dataclass(frozen=True, slots=True)
class UsagePart:
    """A job's use on one node and GPU model ("" model: no GPU there; "" node: it never ran).
    `weight` is the share of the job (its count, run and wait) attributed here: the parts'
    weights add up to 1, so every grouping of a report adds up to the same totals."""

    node: str
    model: str
    weight: float
    gpu_s: float = 0.0
    cpu_s: float = 0.0
    mem_byte_s: float = 0.0

    def to_dict(self) -> dict:
        return {"node": self.node, "model": self.model, "weight": self.weight, "gpu_s": self.gpu_s,
                "cpu_s": self.cpu_s, "mem_byte_s": self.mem_byte_s}

    @classmethod
    def from_dict(cls, d: dict) -> "UsagePart":
        return cls(str(d["node"]), str(d["model"]), float(d["weight"]), float(d.get("gpu_s", 0.0)),
                   float(d.get("cpu_s", 0.0)), float(d.get("mem_byte_s", 0.0)))


@dataclass(frozen=True, slots=True)
class JobUsage:
    """The usage of one finished job, kept in its record (Job.usage, as to_dict())."""

    job_id: int
    tenant: str
    uid: int
    day: str  # UTC day of its end: the day a report counts it on
    state: str
    exit_code: int | None
    submitted_at: float
    started_at: float | None  # its first start (None: it never started)
    ended_at: float
    wait_s: float
    run_s: float  # every attempt that ran, added up
    attempts: int  # attempts that ran
    parts: tuple[UsagePart, ...]

    @property
    def started(self) -> bool:
        return self.started_at is not None

    @property
    def primary(self) -> UsagePart:
        """The part its wait sample belongs to (the model it ran on longest; ties: the first)."""
        return max(self.parts, key=lambda p: p.weight)

    def gpu_s_by_model(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for p in self.parts:
            if p.model:
                out[p.model] = out.get(p.model, 0.0) + p.gpu_s
        return out

    def to_dict(self) -> dict:
        return {
            "job_id": self.job_id, "tenant": self.tenant, "uid": self.uid, "day": self.day, "state": self.state,
            "exit_code": self.exit_code, "submitted_at": self.submitted_at, "started_at": self.started_at,
            "ended_at": self.ended_at, "wait_s": self.wait_s, "run_s": self.run_s, "attempts": self.attempts,
            "parts": [p.to_dict() for p in self.parts],
            # totals for readers of `mt-job show --json` (sacct's figures); from_dict recomputes them
            "gpu_s_by_model": self.gpu_s_by_model(), "cpu_s": sum(p.cpu_s for p in self.parts),
            "mem_byte_s": sum(p.mem_byte_s for p in self.parts),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "JobUsage":
        return cls(
            job_id=int(d["job_id"]), tenant=str(d["tenant"]), uid=int(d.get("uid", -1)), day=str(d["day"]),
            state=str(d.get("state", "")), exit_code=d.get("exit_code"),
            submitted_at=float(d.get("submitted_at", 0.0)),
            started_at=None if d.get("started_at") is None else float(d["started_at"]),
            ended_at=float(d["ended_at"]), wait_s=float(d.get("wait_s", 0.0)), run_s=float(d.get("run_s", 0.0)),
            attempts=int(d.get("attempts", 0)), parts=tuple(UsagePart.from_dict(p) for p in d.get("parts", ())),
        )


ModelOf = Callable[[str, int], str]  # (node, GPU index) -> the model as its backend reports it ("" unknown)


def _runs(job: Job, run_end: float | None) -> list[tuple[float, float, tuple[NodeAllocation, ...]]]:
    """(start, end, allocations) of every attempt that held a reservation."""
    runs = []
    for h in job.history:
        if (h.get("late") or {}).get("taken"):
            continue  # that attempt's end was taken as the job's: it is the current one below
        start, end = h.get("started_at"), h.get("ended_at")
        if start is None or end is None:
            continue  # a workspace stopped while queued: nothing held
        runs.append((float(start), float(end), tuple(NodeAllocation.from_dict(a) for a in h.get("allocations", ()))))
    if job.started_at is not None and run_end is not None:
        runs.append((float(job.started_at), float(run_end), tuple(job.allocations)))
    return runs


def _rank_shares(a: NodeAllocation, model_of: ModelOf) -> dict[str, tuple[float, float]]:
    """model -> (GPU share reserved on this rank, this model's part of the rank's CPU and memory)."""
    fractions: dict[str, float] = {}
    counts: dict[str, int] = {}
    for g in a.gpus:
        model = normalize_model(model_of(a.node, g.index) or "") or "unknown"
        fractions[model] = fractions.get(model, 0.0) + g.fraction
        counts[model] = counts.get(model, 0) + 1
    if not counts:
        return {"": (0.0, 1.0)}
    total_f, total_n = sum(fractions.values()), sum(counts.values())
    return {m: (fractions[m], fractions[m] / total_f if total_f > 0 else counts[m] / total_n) for m in counts}


def job_usage(job: Job, model_of: ModelOf, run_end: float | None, ended_at: float) -> JobUsage:
    """The usage of `job`, final at `ended_at`. `run_end`: when its current attempt's
    reservation ended (None: the current attempt never started, or held nothing)."""
    runs = _runs(job, run_end)
    acc: dict[tuple[str, str], list[float]] = {}  # (node, model) -> [job-seconds, gpu_s, cpu_s, mem_byte_s]
    run_s = 0.0
    for start, end, allocs in runs:
        d = max(0.0, end - start)
        run_s += d
        ranks = allocs or (NodeAllocation(node=""),)
        for a in ranks:
            for model, (gpu_share, part) in _rank_shares(a, model_of).items():
                v = acc.setdefault((a.node, model), [0.0, 0.0, 0.0, 0.0])
                v[0] += d / len(ranks) * part
                v[1] += gpu_share * d
                v[2] += a.cpus * d * part
                v[3] += a.mem_bytes * d * part
    if run_s <= 0:  # never ran, or only for no time: count it by its ranks' shares alone
        last = runs[-1][2] if runs else ()
        for a in last:
            for model, (_share, part) in _rank_shares(a, model_of).items():
                acc.setdefault((a.node, model), [0.0, 0.0, 0.0, 0.0])[0] += part / len(last)
        if not acc:
            acc[("", "")] = [1.0, 0.0, 0.0, 0.0]
    total = sum(v[0] for v in acc.values())
    parts = tuple(UsagePart(node, model, v[0] / total if total > 0 else 1.0 / len(acc), v[1], v[2], v[3])
                  for (node, model), v in sorted(acc.items()))
    starts = [float(h["started_at"]) for h in job.history if h.get("started_at") is not None]
    if job.started_at is not None:
        starts.append(float(job.started_at))
    first = min(starts) if starts else None
    wait_s = max(0.0, (first if first is not None else ended_at) - job.submitted_at)
    return JobUsage(job.id, job.tenant, job.uid, utc_day(ended_at), job.state.value, job.exit_code,
                    job.submitted_at, first, ended_at, wait_s, run_s, len(runs), parts)


class Contribution(NamedTuple):
    """One part of a job's usage, as a report and the summary add it up."""

    tenant: str
    uid: int
    day: str
    node: str
    model: str
    jobs: float
    gpu_s: float
    cpu_s: float
    mem_byte_s: float
    run_s: float
    wait_s: float
    wait_sample: float | None  # the job's wait, on its primary part only (jobs that started)


def contributions(u: JobUsage) -> Iterator[Contribution]:
    primary = u.primary if u.parts else None
    for p in u.parts:
        sample = u.wait_s if (p is primary and u.started) else None
        yield Contribution(u.tenant, u.uid, u.day, p.node, p.model, p.weight, p.gpu_s, p.cpu_s, p.mem_byte_s,
                           u.run_s * p.weight, u.wait_s * p.weight, sample)


CellKey = tuple[str, int, str, str, str]  # (tenant, uid, day, node, model)


@dataclass(slots=True)
class UsageCell:
    jobs: float = 0.0
    gpu_s: float = 0.0
    cpu_s: float = 0.0
    mem_byte_s: float = 0.0
    run_s: float = 0.0
    wait_s: float = 0.0
    waits: dict[int, int] = field(default_factory=dict)  # wait bucket -> jobs (WAIT_EDGES_S)


_CELL_FIELDS = ("jobs", "gpu_s", "cpu_s", "mem_byte_s", "run_s", "wait_s")


class UsageSummary:
    """The usage of forgotten jobs, per (tenant, uid, day, node, GPU model): the figures
    added up, and the waits as a histogram. Kept in the state machine and its snapshots."""

    def __init__(self) -> None:
        self.cells: dict[CellKey, UsageCell] = {}
        self.pruned_before = ""  # days before this were dropped (SUMMARY_KEEP_DAYS)

    def fold(self, usage: JobUsage, at: float) -> None:
        """Add a job whose record is being forgotten at `at`; drop days older than the keep."""
        if at > 0:
            cutoff = utc_day(at - SUMMARY_KEEP_DAYS * DAY_S)
            if cutoff > self.pruned_before:
                self.cells = {k: c for k, c in self.cells.items() if k[2] >= cutoff}
                self.pruned_before = cutoff
        for c in contributions(usage):
            if c.day < self.pruned_before:
                continue
            cell = self.cells.setdefault((c.tenant, c.uid, c.day, c.node, c.model), UsageCell())
            for name in _CELL_FIELDS:
                setattr(cell, name, getattr(cell, name) + getattr(c, name))
            if c.wait_sample is not None:
                b = wait_bucket(c.wait_sample)
                cell.waits[b] = cell.waits.get(b, 0) + 1

    def rows(self) -> list[dict]:
        """Every cell as a plain dict (a copy), in key order."""
        out = []
        for (tenant, uid, day, node, model), c in sorted(self.cells.items()):
            out.append({"tenant": tenant, "uid": uid, "day": day, "node": node, "model": model,
                        **{name: getattr(c, name) for name in _CELL_FIELDS},
                        "waits": {str(b): n for b, n in sorted(c.waits.items())}})
        return out

    def to_dict(self) -> dict:
        return {"version": 1, "pruned_before": self.pruned_before, "cells": self.rows()}

    @classmethod
    def from_dict(cls, d: dict | None) -> "UsageSummary":
        s = cls()
        if not d:
            return s  # a snapshot from before accounting
        s.pruned_before = str(d.get("pruned_before", ""))
        for r in d.get("cells", ()):
            key = (str(r["tenant"]), int(r.get("uid", -1)), str(r["day"]), str(r.get("node", "")),
                   str(r.get("model", "")))
            s.cells[key] = UsageCell(**{name: float(r.get(name, 0.0)) for name in _CELL_FIELDS},
                                     waits={int(b): int(n) for b, n in dict(r.get("waits") or {}).items()})
        return s


def in_range(day: str, since: str | None, until: str | None) -> bool:
    """Both ends inclusive: --since 2025-01-01 --until 2025-01-31 is January."""
    return (since is None or day >= since) and (until is None or day <= until)

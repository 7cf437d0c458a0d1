"""Usage reports (`mtgpu-admin usage`, `mt-job usage`): finished jobs' usage, from the
records still kept and the per-day summary of forgotten ones, grouped by tenant, GPU model,
node or day. Pure: the caller hands in copies of both (docs/ACCOUNTING.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from .usage import (PERCENTILES, Contribution, JobUsage, UsageError, contributions, exact_percentile,
                    histogram_percentile, in_range, wait_bucket)

BY_KEYS = ("tenant", "model", "node", "day")
NONE_KEY = "-"  # model: no GPU; node: the job never ran


@dataclass(slots=True)
class _Group:
    jobs: float = 0.0
    gpu_s_by_model: dict[str, float] = field(default_factory=dict)
    cpu_s: float = 0.0
    mem_byte_s: float = 0.0
    run_s: float = 0.0
    wait_s: float = 0.0
    samples: list[float] = field(default_factory=list)  # exact waits (jobs whose records are kept)
    waits: dict[int, int] = field(default_factory=dict)  # histogram of forgotten jobs' waits

    def add(self, jobs: float, model: str, gpu_s: float, cpu_s: float, mem_byte_s: float, run_s: float,
            wait_s: float) -> None:
        self.jobs += jobs
        if model:
            self.gpu_s_by_model[model] = self.gpu_s_by_model.get(model, 0.0) + gpu_s
        self.cpu_s += cpu_s
        self.mem_byte_s += mem_byte_s
        self.run_s += run_s
        self.wait_s += wait_s

    def wait_figures(self) -> dict:
        """Exact nearest-rank percentiles when every sample is a kept record's; else from the
        histogram (the kept records' waits put into its buckets too), as bucket upper edges."""
        exact = not self.waits
        if exact:
            pick = {p: exact_percentile(self.samples, p) for p in PERCENTILES}
        else:
            counts = dict(self.waits)
            for s in self.samples:
                b = wait_bucket(s)
                counts[b] = counts.get(b, 0) + 1
            pick = {p: histogram_percentile(counts, p) for p in PERCENTILES}
        out = {"wait_samples": len(self.samples) + sum(self.waits.values()), "wait_exact": exact}
        out.update({f"wait_p{p}_s": None if v is None else _r(v) for p, v in pick.items()})
        return out

    def figures(self) -> dict:
        return {
            "jobs": round(self.jobs, 6),
            "gpu_s": _r(sum(self.gpu_s_by_model.values())),
            "gpu_s_by_model": {m: _r(v) for m, v in sorted(self.gpu_s_by_model.items())},
            "cpu_s": _r(self.cpu_s), "mem_byte_s": _r(self.mem_byte_s),
            "run_s": _r(self.run_s), "wait_s": _r(self.wait_s),
            **self.wait_figures(),
        }


def _r(x: float) -> float:
    """Figures to the millisecond: parts of one job weighted by thirds add up without float dust."""
    return round(x, 3)


def _key(by: str, tenant: str, day: str, node: str, model: str) -> str:
    if by == "tenant":
        return tenant
    if by == "day":
        return day
    if by == "node":
        return node or NONE_KEY
    return model or NONE_KEY


def check_by(by: str, allowed: Iterable[str] = BY_KEYS) -> str:
    allowed = tuple(allowed)
    if by not in allowed:
        raise UsageError(f"--by {by!r}: group by one of {', '.join(allowed)}")
    return by


def usage_report(records: Iterable[JobUsage | dict], summary_rows: Iterable[dict], since: str | None,
                 until: str | None, by: str, tenant: tuple[str, int] | None = None) -> dict:
    """The report of the jobs that ended on the days since..until (UTC, both inclusive; None:
    open), grouped `by` (tenant, model, node or day). `tenant`: (name, uid) to report only
    that tenant's. Rows, totals, and wait percentiles per GPU model; seconds throughout."""
    check_by(by)
    if since and until and since > until:
        raise UsageError(f"--since {since} is after --until {until}: give a range that starts before it ends")
    groups: dict[str, _Group] = {}
    total = _Group()
    per_model: dict[str, _Group] = {}
    kept = summarized = 0

    def take(c: Contribution) -> None:
        for g in (groups.setdefault(_key(by, c.tenant, c.day, c.node, c.model), _Group()), total):
            g.add(c.jobs, c.model, c.gpu_s, c.cpu_s, c.mem_byte_s, c.run_s, c.wait_s)
            if c.wait_sample is not None:
                g.samples.append(c.wait_sample)
        if c.wait_sample is not None:
            per_model.setdefault(c.model or NONE_KEY, _Group()).samples.append(c.wait_sample)

    for rec in records:
        u = rec if isinstance(rec, JobUsage) else JobUsage.from_dict(rec)
        if tenant is not None and (u.tenant, u.uid) != tenant:
            continue
        if not in_range(u.day, since, until):
            continue
        kept += 1
        for c in contributions(u):
            take(c)
    for row in summary_rows:
        if tenant is not None and (row["tenant"], row["uid"]) != tenant:
            continue
        if not in_range(row["day"], since, until):
            continue
        summarized += 1
        waits = {int(b): int(n) for b, n in (row.get("waits") or {}).items()}
        for g in (groups.setdefault(_key(by, row["tenant"], row["day"], row["node"], row["model"]), _Group()), total):
            g.add(row["jobs"], row["model"], row["gpu_s"], row["cpu_s"], row["mem_byte_s"], row["run_s"],
                  row["wait_s"])
            for b, n in waits.items():
                g.waits[b] = g.waits.get(b, 0) + n
        if waits:
            pm = per_model.setdefault(row["model"] or NONE_KEY, _Group())
            for b, n in waits.items():
                pm.waits[b] = pm.waits.get(b, 0) + n
    return {
        "by": by, "since": since, "until": until, "days": "UTC, both ends inclusive; a job counts on the day it ended",
        "rows": [{by: k, **groups[k].figures()} for k in sorted(groups)],
        "totals": total.figures(),
        "wait_by_model": [{"model": m, **per_model[m].wait_figures()} for m in sorted(per_model)],
        "sources": {"job_records": kept, "summary_cells": summarized},
    }

"""JOB_RETENTION_DAYS and TENANT_RETENTION_DAYS, applied: the scheduler runs a pass on
its own schedule (hourly), and an admin can run one, or a dry run, at any time.

Jobs: finished jobs whose end is older than the retention are forgotten (their
records leave the state, their usage stays in its per-day summary, docs/ACCOUNTING.md;
every member's agent then deletes their log files).
Tenants: invited tenants with nothing queued or running and no login, no request
and no job for the retention period are removed; every member's agent then
removes their account and home. Local tenants (OS users of a standalone node) only
lose their record: their OS account is not ours. Time is an argument, so the
decisions can be checked at any date (`--as-of`).
"""

from __future__ import annotations

import logging

from ...state import commands as C
from ...state.machine import StateMachine
from ...state.store import Store, commit
from ...storage.retention import RetentionReport

log = logging.getLogger(__name__)

RETENTION_EVERY_S = 3600.0


def retention_report(machine: StateMachine, now: float, job_retention_s: float, tenant_retention_s: float,
                     dry_run: bool) -> RetentionReport:
    jobs = [(j.id, j.state, j.ended_at, j.log_path) for j in machine.jobs.values()]
    last_job: dict[int, float] = {}
    active: dict[int, int] = {}
    for j in machine.jobs.values():
        last_job[j.uid] = max(last_job.get(j.uid, 0.0), j.ended_at or j.started_at or j.submitted_at)
        if not j.state.final:
            active[j.uid] = active.get(j.uid, 0) + 1
    tenants = []
    for t in machine.tenants.values():
        seen = max(x for x in (t.last_login_at, t.last_seen_at) if x is not None) if (t.last_login_at or t.last_seen_at) else None
        tenants.append((t.name, seen, last_job.get(t.uid), active.get(t.uid, 0), t.created_at))
    return RetentionReport.compute(jobs, tenants, now, job_retention_s, tenant_retention_s, dry_run=dry_run)


def apply_retention(store: Store, report: RetentionReport) -> list[str]:
    """Commit what the report removes; returns the problems. Raises ReplicationError when
    the cluster records nothing (the next pass tries again)."""
    problems = []
    for j in report.jobs:
        r = commit(store, C.JOB_FORGET, job_id=int(j.job_id), at=report.now)
        if not r["ok"]:
            problems.append(f"job {j.job_id}: {r['error']}")
    for t in report.tenants:
        r = commit(store, C.TENANT_REMOVE, name=t.name, at=report.now)
        if not r["ok"]:
            problems.append(f"tenant {t.name}: {r['error']}")
    if report.jobs or report.tenants:
        log.info("retention: forgot %d finished jobs, removed %d idle tenants%s", len(report.jobs), len(report.tenants),
                 f" ({'; '.join(problems)})" if problems else "")
    return problems

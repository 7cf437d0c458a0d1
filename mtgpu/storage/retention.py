"""What JOB_RETENTION_DAYS and TENANT_RETENTION_DAYS remove: pure decisions, time injected.

The server runs these on its own schedule and applies the result (forget job records and
logs through state commands; remove accounts with accounts.apply.remove_account); the
admin's `--dry-run` prints `RetentionReport.render()` instead of applying.

Boundaries: an item whose age is exactly the retention period is removed ("kept this
long" has then elapsed); one second younger is kept.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple

from mtgpu.model.job import JobState
from mtgpu.model.units import format_duration


class FinishedJob(NamedTuple):
    job_id: str
    state: str
    ended_at: float | None
    log_path: str | None


class TenantActivity(NamedTuple):
    """A tenant's last signs of life. `created_at` (when it was authorized) is a floor, so a
    tenant invited but not yet seen is not removed the moment it is created."""

    name: str
    last_login_at: float | None
    last_job_at: float | None
    running_jobs: int
    created_at: float | None = None

    @property
    def last_active_at(self) -> float | None:
        times = [t for t in (self.last_login_at, self.last_job_at, self.created_at) if t is not None]
        return max(times) if times else None


def _is_final(state: Any) -> bool:
    try:
        return JobState(getattr(state, "value", state)).final
    except ValueError:
        return False


def jobs_to_forget(jobs: Iterable[tuple], now: float, retention_s: float) -> list[FinishedJob]:
    """Jobs in a final state (completed, failed, cancelled, lost) that ended at least
    retention_s before now. Queued and running jobs, and jobs without an end time, stay."""
    out = []
    for job in jobs:
        j = FinishedJob(*job)
        if _is_final(j.state) and j.ended_at is not None and now - j.ended_at >= retention_s:
            out.append(j)
    return sorted(out, key=lambda j: (j.ended_at, str(j.job_id)))


def tenants_to_remove(tenants: Iterable[tuple], now: float, retention_s: float) -> list[TenantActivity]:
    """Tenants with nothing running and no login, no job (and no authorization) for at least
    retention_s. A tenant with no recorded time at all is kept: it cannot be shown idle."""
    out = []
    for tenant in tenants:
        t = TenantActivity(*tenant)
        last = t.last_active_at
        if t.running_jobs == 0 and last is not None and now - last >= retention_s:
            out.append(t)
    return sorted(out, key=lambda t: (t.last_active_at, t.name))


def _when(ts: float | None) -> str:
    if ts is None:
        return "never"
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _age(now: float, ts: float | None) -> str:
    if ts is None:
        return "-"
    days = (now - ts) / 86400.0
    return f"{days:.1f}d" if days >= 1 else format_duration(now - ts)


@dataclass(frozen=True)
class RetentionReport:
    """What a retention pass removes (or, in a dry run, would remove)."""

    now: float
    job_retention_s: float
    tenant_retention_s: float
    jobs: list[FinishedJob] = field(default_factory=list)
    tenants: list[TenantActivity] = field(default_factory=list)
    dry_run: bool = True

    @classmethod
    def compute(cls, jobs: Iterable[tuple], tenants: Iterable[tuple], now: float, job_retention_s: float,
                tenant_retention_s: float, *, dry_run: bool = True) -> "RetentionReport":
        return cls(now, job_retention_s, tenant_retention_s, jobs_to_forget(jobs, now, job_retention_s),
                   tenants_to_remove(tenants, now, tenant_retention_s), dry_run)

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "now": self.now,
            "job_retention_days": self.job_retention_s / 86400.0,
            "tenant_retention_days": self.tenant_retention_s / 86400.0,
            "jobs": [j._asdict() for j in self.jobs],
            "tenants": [{**t._asdict(), "last_active_at": t.last_active_at} for t in self.tenants],
        }

    def render(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        days_j = self.job_retention_s / 86400.0
        days_t = self.tenant_retention_s / 86400.0
        lines = [f"Retention {'(dry run) ' if self.dry_run else ''}at {_when(self.now)}"]
        lines.append(f"Jobs ended {days_j:g}+ days ago (JOB_RETENTION_DAYS): {verb} {len(self.jobs)}")
        for j in self.jobs:
            lines.append(f"  {j.job_id}  {getattr(j.state, 'value', j.state):<9}  ended {_when(j.ended_at)} "
                         f"({_age(self.now, j.ended_at)} ago)  log {j.log_path or '-'}")
        lines.append(f"Tenants idle {days_t:g}+ days (TENANT_RETENTION_DAYS): {verb} {len(self.tenants)}")
        for t in self.tenants:
            lines.append(f"  {t.name}  last login {_when(t.last_login_at)}  last job {_when(t.last_job_at)}  "
                         f"(idle {_age(self.now, t.last_active_at)}; account and home)")
        return "\n".join(lines)

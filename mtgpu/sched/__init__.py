"""Pure placement: `schedule(snapshot, queue, now)` -> Plan (DESIGN §5).

No I/O, no clock (time is an argument), no logging: the same inputs give the same
plan. `check_satisfiable(spec, snapshot)` is the third verdict, the reason a
request could never run on this cluster.
"""

from __future__ import annotations

from mtgpu.model.cluster import ClusterSnapshot, PendingJob, Plan, TenantUsage

from .engine import Scheduler
from .satisfiable import check_satisfiable


def schedule(
    snapshot: ClusterSnapshot,
    queue: list[PendingJob],
    now: float,
    usage: dict[str, TenantUsage] | None = None,
) -> Plan:
    """Place `queue` on `snapshot` at time `now`; jobs that wait or are refused say why."""
    return Scheduler(snapshot).run(queue, now, usage)


__all__ = ["Scheduler", "check_satisfiable", "schedule"]

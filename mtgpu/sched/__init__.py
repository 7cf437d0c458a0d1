"""Pure placement: `schedule(snapshot, queue, now)` -> Plan (DESIGN §5).

No I/O, no clock (time is an argument), no logging: the same inputs give the same
plan. `check_satisfiable(spec, snapshot)` is the third verdict, the reason a
request could never run on this cluster. `Scheduler` is the incremental engine
`schedule()` wraps; benchmarks drive it directly, one placement at a time.
See docs/SCHEDULING.md for the rules, the queue-order formula and backfill.
"""

from __future__ import annotations

from mtgpu.model.cluster import ClusterSnapshot, PendingJob, Plan, TenantUsage

from .engine import Scheduler
from .request import RankRequest, rank_requests
from .satisfiable import check_satisfiable


def schedule(
    snapshot: ClusterSnapshot,
    queue: list[PendingJob],
    now: float,
    usage: dict[str, TenantUsage] | None = None,
) -> Plan:
    """Place `queue` on `snapshot` at time `now`; jobs that wait or are refused say why."""
    return Scheduler(snapshot).run(queue, now, usage)


__all__ = ["RankRequest", "Scheduler", "check_satisfiable", "rank_requests", "schedule"]

"""Queue order: priority with aging, plus fair share between tenants.

    effective(job) = priority
                     + AGING_PER_HOUR * min(hours waited, AGING_CAP_HOURS)
                     - FAIR_SHARE_WEIGHT * log2(1 + tenant GPU-hours / (share x 1 GPU-hour))

`priority` is the job's `priority=`; hours waited is (now - submitted_at) / 3600;
tenant GPU-hours are the tenant's recent (decayed) usage from `TenantUsage`, plus
what this pass has already started for the tenant (each started job counts its
GPUs times its `time=` limit, or one hour without one). `share` is the tenant's
weight (`TenantUsage.share`, 1 by default): usage is normalized by it, as Slurm's
fair share normalizes usage by shares, so a tenant of share 2 pays half the points
per GPU-hour and two busy tenants end up with GPU time in the ratio of their shares.
The logarithm keeps the penalty meaningful at every scale: at share 1, 1 GPU-hour
costs 1 point, 7 cost 3, 1023 cost 10.

Jobs of one tenant keep their own order (effective priority, then submission
time, then id); tenants compete through their next job, and because every start
raises the tenant's usage, a 500-job burst from one tenant interleaves with the
jobs of others instead of starving them. Aging lets low priorities run eventually:
a job that waited 10 hours has caught up 10 points.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator

from mtgpu.model.cluster import PendingJob, TenantUsage

AGING_PER_HOUR = 1.0
AGING_CAP_HOURS = 168.0
FAIR_SHARE_WEIGHT = 1.0
DEFAULT_RUN_S = 3600.0
CPU_ONLY_GPU_EQUIVALENT = 0.1  # a CPU-only job still counts a little, so bursts interleave


def base_priority(job: PendingJob, now: float) -> float:
    waited_h = max(0.0, now - job.submitted_at) / 3600.0
    return job.spec.priority + AGING_PER_HOUR * min(waited_h, AGING_CAP_HOURS)


def fair_share_penalty(gpu_seconds: float, share: float = 1.0) -> float:
    return FAIR_SHARE_WEIGHT * math.log2(1.0 + max(0.0, gpu_seconds) / (3600.0 * share))


def pass_usage_gpu_seconds(job: PendingJob, gpus_per_rank: float) -> float:
    """The usage a started job charges its tenant within the pass."""
    units = gpus_per_rank * max(1, job.spec.nodes) or CPU_ONLY_GPU_EQUIVALENT
    return units * (job.spec.time_limit_s or DEFAULT_RUN_S)


class QueueOrder:
    """Yields the queue in effective-priority order; `started()` feeds fair share back."""

    def __init__(self, queue: list[PendingJob], now: float, usage: dict[str, TenantUsage] | None) -> None:
        self._usage = {t: u.gpu_seconds for t, u in (usage or {}).items()}
        self._share = {t: u.share for t, u in (usage or {}).items() if u.share > 0}
        per_tenant: dict[str, list[tuple[float, float, int, int]]] = {}
        self._jobs = queue
        for i, job in enumerate(queue):
            per_tenant.setdefault(job.tenant, []).append((-base_priority(job, now), job.submitted_at, job.job_id, i))
        self._lists = {t: sorted(v) for t, v in per_tenant.items()}
        self._pos = dict.fromkeys(self._lists, 0)
        self._heap: list[tuple[float, float, int, str]] = []
        for t in self._lists:
            self._push(t)

    def _push(self, tenant: str) -> None:
        pos = self._pos[tenant]
        lst = self._lists[tenant]
        if pos < len(lst):
            negp, sub, jid, _ = lst[pos]
            key = negp + fair_share_penalty(self._usage.get(tenant, 0.0), self._share.get(tenant, 1.0))
            heapq.heappush(self._heap, (key, sub, jid, tenant))

    def __iter__(self) -> Iterator[PendingJob]:
        while self._heap:
            _, _, _, tenant = heapq.heappop(self._heap)
            pos = self._pos[tenant]
            idx = self._lists[tenant][pos][3]
            self._pos[tenant] = pos + 1
            yield self._jobs[idx]
            self._push(tenant)

    def started(self, job: PendingJob, gpus_per_rank: float) -> None:
        """Charge a job started in this pass to its tenant (call before the next job is drawn)."""
        self._usage[job.tenant] = self._usage.get(job.tenant, 0.0) + pass_usage_gpu_seconds(job, gpus_per_rank)

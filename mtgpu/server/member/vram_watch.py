"""VRAM reservations enforced in shared mode (`[GPU_POLICY]`, docs/ISOLATION.md).

A shared-mode job reserves `vram=` on each of its GPUs; the scheduler packs jobs on a GPU
so that their reservations fit. A job that uses more than it reserved takes memory its
neighbours were promised. The member measures each job's VRAM per GPU (the per-process
figures of NVML, AMD SMI or the simulated backend, summed over the job's processes) and a
job above its reservation for longer than `vram_grace` is stopped and `failed` with the
figures (`vram_overuse = "stop"`, the default), or only warned about in its reason
(`"warn"`), or left alone (`"off"`).

`overuse()` is the pure decision (time passed in); `VramWatch` measures and remembers.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...model.job import GpuMode, Job
from ...model.units import format_size


@dataclass(frozen=True, slots=True)
class Overuse:
    """A job above its reservation on one GPU: how much, and since when."""

    job_id: int
    attempt: int
    rank: int
    gpu: int
    used_bytes: int
    reserved_bytes: int
    since: float


def reservations(job: Job, node: str) -> tuple[int, dict[int, int]]:
    """(rank, {GPU index: reserved bytes}) of the job's shared slots on `node` that reserve VRAM."""
    for rank, a in enumerate(job.allocations):
        if a.node == node:
            return rank, {g.index: g.vram_bytes for g in a.gpus if g.mode is GpuMode.SHARED and g.vram_bytes > 0}
    return -1, {}


def overuse(now: float, used: dict[int, dict[int, int]], reserved: dict[int, dict[int, int]],
            over_since: dict[tuple[int, int], float]) -> tuple[dict[tuple[int, int], float], list[tuple[int, int, float]]]:
    """Fold one measurement in. `used`/`reserved`: job -> GPU -> bytes. Returns the new
    `over_since` ((job, GPU) -> when it went over, kept while it stays over) and the
    (job, GPU, since) pairs over now."""
    new: dict[tuple[int, int], float] = {}
    over = []
    for job_id, gpus in reserved.items():
        for gpu, limit in gpus.items():
            if used.get(job_id, {}).get(gpu, 0) > limit:
                since = over_since.get((job_id, gpu), now)
                new[(job_id, gpu)] = since
                over.append((job_id, gpu, since))
    return new, over


def reason(o: Overuse, grace_s: float, policy: str) -> str:
    what = (f"used {format_size(o.used_bytes)} of VRAM on GPU {o.gpu}, above the {format_size(o.reserved_bytes)} it "
            f"reserved (gpu-mode=shared vram={format_size(o.reserved_bytes)})")
    if policy == "warn":
        return (f"warning: {what}; the jobs sharing the GPU may run out of memory ([GPU_POLICY] vram_overuse = "
                "\"warn\"): reserve what the job uses")
    return (f"{what} for more than {grace_s:g}s: stopped so that the jobs sharing the GPU keep the memory they "
            "reserved ([GPU_POLICY] vram_overuse = \"stop\"); submit it again with a larger vram=")


class VramWatch:
    def __init__(self, node_name: str, policy: str, grace_s: float) -> None:
        self.node_name = node_name
        self.policy = policy
        self.grace_s = grace_s
        self._over_since: dict[tuple[int, int], float] = {}
        self._warned: set[tuple[int, int]] = set()  # (job, attempt) warned about

    def check(self, now: float, jobs: list[Job], pids_of, gpus) -> list[tuple[Overuse, str]]:
        """`jobs`: running here; `pids_of(job_id)`: its live pids; `gpus`: the last GPU sample.
        Returns the overuses to act on now, with their reasons (stop: past the grace;
        warn: once per attempt)."""
        if self.policy == "off":
            return []
        reserved, ranks = {}, {}
        for job in jobs:
            rank, res = reservations(job, self.node_name)
            if res:
                reserved[job.id], ranks[job.id] = res, (job.attempt, rank)
        if not reserved:
            self._over_since = {}
            return []
        used: dict[int, dict[int, int]] = {}
        by_gpu = {g.index: g for g in gpus}
        for job_id, res in reserved.items():
            pids = pids_of(job_id)
            for gpu in res:
                g = by_gpu.get(gpu)
                if g is not None and pids:
                    used.setdefault(job_id, {})[gpu] = sum(p.used_vram_bytes for p in g.processes if p.pid in pids)
        self._over_since, over = overuse(now, used, reserved, self._over_since)
        out = []
        for job_id, gpu, since in over:
            attempt, rank = ranks[job_id]
            o = Overuse(job_id, attempt, rank, gpu, used[job_id][gpu], reserved[job_id][gpu], since)
            if self.policy == "stop" and now - since >= self.grace_s:
                out.append((o, reason(o, self.grace_s, "stop")))
            elif self.policy == "warn" and (job_id, attempt) not in self._warned:
                self._warned.add((job_id, attempt))
                out.append((o, reason(o, self.grace_s, "warn")))
        return out

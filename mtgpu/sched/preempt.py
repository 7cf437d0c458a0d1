"""Which opportunistic jobs to stop so that a blocked guaranteed job fits (pure).

Rules (docs/SCHEDULING.md "Preemption"):
- only a guaranteed job (no `oversubscribe` request) preempts, and only one that fits
  nowhere now, holds aside: a job that could start elsewhere waits for its turn instead;
- only jobs the server marked preemptible are stopped (every GPU slot oversubscribed,
  one node, not a workspace, not preempted too often lately), never a guaranteed one;
- the node chosen needs the fewest victims (then the fewest GPUs taken from them), and
  on it the most recently started ones go first (they lose the least work);
- one-node jobs only: a gang that fits nowhere waits as before;
- a job with victims still stopping for it preempts nothing more; a victim is chosen for
  one job only; at most PREEMPT_DEPTH blocked jobs per pass look for victims.

What is simulated: giving back a victim's slot (nodefit.NodeState.give_back) and, on a
GPU left with no oversubscribed job, the VRAM it measured in use beyond what is
committed there (what the victims used).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mtgpu.model.cluster import PendingJob, Plan, Preemption, RunningAlloc
from mtgpu.model.job import GpuMode, JobSpec

from .nodefit import NodeState

if TYPE_CHECKING:
    from .engine import Scheduler

PREEMPT_DEPTH = 8


def guaranteed(sched: "Scheduler", spec: JobSpec) -> bool:
    return all(not (r.gpu_count and r.mode == GpuMode.OVERSUBSCRIBE) for r in sched.requests(spec))


def _give_back(st: NodeState, victim: RunningAlloc) -> None:
    alloc = victim.allocations[0]
    st.give_back(alloc)
    for s in alloc.gpus:
        g = next((x for x in st.gpus if x.index == s.index), None)
        if g is not None and g.over == 0:
            g.used = min(g.used, g.cvram)  # what the victims used there is free once they stopped


def plan_preemptions(sched: "Scheduler", blocked: list[PendingJob], plan: Plan) -> None:
    running = sched.snapshot.running
    stopping: dict[int, list[RunningAlloc]] = {}
    for r in running:
        if r.preempting_for is not None:
            stopping.setdefault(r.preempting_for, []).append(r)
    victims: dict[int, list[RunningAlloc]] = {}
    for r in running:
        if r.preemptible and r.preempting_for is None and len(r.allocations) == 1:
            row = sched.fleet.row_of.get(r.allocations[0].node)
            if row is not None:
                victims.setdefault(row, []).append(r)
    taken: set[int] = set()
    looked = 0
    for job in blocked:
        if job.job_id in stopping:
            names = ", ".join(str(r.job_id) for r in stopping[job.job_id])
            plan.pending[job.job_id] = (f"waits for job {names}, preempted for it, to stop (it starts once its "
                                        "capacity is free)")
            continue
        if looked >= PREEMPT_DEPTH or not victims:
            continue
        spec = job.spec
        if spec.nodes != 1 or not guaranteed(sched, spec) or sched.fits_now(spec):
            continue
        looked += 1
        able = sched.able(spec)
        best = None
        for req in sched.requests(spec):
            for row, on_node in victims.items():
                if not able[row]:
                    continue
                st = sched.fleet.states[row].copy()
                chosen: list[RunningAlloc] = []
                for v in sorted((v for v in on_node if v.job_id not in taken),
                                key=lambda v: (-v.started_at, -v.job_id)):
                    _give_back(st, v)
                    chosen.append(v)
                    if st.fit(req) is not None:
                        break
                else:
                    continue
                gpus = sum(len(v.allocations[0].gpus) for v in chosen)
                key = (len(chosen), gpus, sched.fleet.names[row])
                if best is None or key < best[0]:
                    best = (key, row, chosen)
        if best is None:
            continue
        _, row, chosen = best
        node = sched.fleet.names[row]
        for v in chosen:
            taken.add(v.job_id)
            plan.preemptions.append(Preemption(v.job_id, job.job_id, node))
        names = ", ".join(str(v.job_id) for v in chosen)
        plan.pending[job.job_id] = (f"preempting opportunistic job {names} on node {node}: it starts once "
                                    f"{'they' if len(chosen) > 1 else 'it'} stopped")

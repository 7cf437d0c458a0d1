"""The scheduling pass: places a queue on a working copy of the cluster."""

from __future__ import annotations

from mtgpu.model.cluster import ClusterSnapshot, PendingJob, Placement, Plan, TenantUsage
from mtgpu.model.job import JobSpec, NodeAllocation

from .nodefit import NodeState
from .order import QueueOrder
from .reasons import join_node_reasons
from .request import RankRequest, rank_requests
from .satisfiable import check_satisfiable


class Scheduler:
    """A working copy of the cluster's capacity that jobs are placed on, one at a time.

    Every placement updates the copy, so two jobs of one pass never double-book."""

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self.snapshot = snapshot
        self.nodes = [NodeState(n) for n in snapshot.nodes]
        self.by_name = {n.name: n for n in self.nodes}
        self._sat_cache: dict[JobSpec, str | None] = {}

    # ---- verdicts --------------------------------------------------------------

    def never_fits(self, spec: JobSpec) -> str | None:
        try:
            return self._sat_cache[spec]
        except KeyError:
            r = self._sat_cache[spec] = check_satisfiable(spec, self.snapshot)
            return r

    # ---- placing ---------------------------------------------------------------

    def _candidates(self, spec: JobSpec) -> list[NodeState]:
        if spec.server is not None:
            n = self.by_name.get(spec.server)
            return [n] if n is not None else []
        return self.nodes

    def place(self, spec: JobSpec, job_id: int = 0) -> tuple[NodeAllocation, ...] | None:
        """Place one job now (all ranks) and commit it to the working copy, or None."""
        for req in rank_requests(spec):
            allocs = self._place_ranks(spec, req)
            if allocs is not None:
                return allocs
        return None

    def _place_ranks(self, spec: JobSpec, req: RankRequest) -> tuple[NodeAllocation, ...] | None:
        used: set[str] = set()
        chosen: list[tuple[NodeState, NodeAllocation]] = []
        for _ in range(spec.nodes):
            best = None
            best_key = None
            for n in self._candidates(spec):
                if n.name in used:
                    continue
                a = n.fit(req)
                if a is None:
                    continue
                key = _pack_key(n, a)
                if best_key is None or key < best_key:
                    best, best_key = (n, a), key
            if best is None:
                return None
            used.add(best[0].name)
            chosen.append(best)
        for n, a in chosen:
            n.take(a)
        return tuple(a for _, a in chosen)

    def why_pending(self, spec: JobSpec) -> str:
        """Each node's named reason for not taking `spec` now."""
        reqs = rank_requests(spec)
        per_node: list[tuple[str, str]] = []
        fitting = 0
        for n in self._candidates(spec):
            reasons = []
            ok = False
            for r in reqs:
                if n.fit(r) is not None:
                    ok = True
                    break
                reasons.append(n.why_not(r))
            if ok:
                fitting += 1
                continue
            if len(reqs) == 1:
                per_node.append((n.name, reasons[0]))
            else:
                per_node.append((n.name, " / ".join(f"{q.label}: {x}" for q, x in zip(reqs, reasons))))
        text = join_node_reasons(per_node)
        if spec.nodes > 1:
            head = f"nodes={spec.nodes}: only {fitting} node{'s' if fitting != 1 else ''} can take a rank now"
            return head + (f"; {text}" if text else "")
        return text or "no node can take it now"

    # ---- the pass --------------------------------------------------------------

    def run(self, queue: list[PendingJob], now: float, usage: dict[str, TenantUsage] | None = None) -> Plan:
        plan = Plan()
        order = QueueOrder(queue, now, usage)
        array_running: dict[int, int] = {}
        for job in order:
            spec = job.spec
            never = self.never_fits(spec)
            if never is not None:
                plan.rejected[job.job_id] = never
                continue
            limit = spec.array.max_running if spec.array is not None else None
            if job.array_parent is not None and limit is not None:
                running = array_running.setdefault(job.array_parent, job.running_in_array)
                if running >= limit:
                    plan.pending[job.job_id] = f"array limit: {running} of %{limit} running"
                    continue
            allocs = self.place(spec, job.job_id)
            if allocs is None:
                plan.pending[job.job_id] = self.why_pending(spec)
                continue
            plan.placements.append(Placement(job.job_id, allocs))
            if job.array_parent is not None:
                array_running[job.array_parent] = array_running.get(job.array_parent, job.running_in_array) + 1
            order.started(job, sum(s.fraction or 0.0 for s in allocs[0].gpus))
        return plan


def _pack_key(node: NodeState, alloc: NodeAllocation) -> tuple:
    """Step-1 packing: prefer the node left with the fewest idle GPUs, then the least CPU."""
    taken = {s.index for s in alloc.gpus}
    idle_left = sum(1 for g in node.gpus if g.idle and g.index not in taken)
    return (idle_left, node.cpus_free - alloc.cpus, node.name)

"""The scheduling engine: an incremental, vectorized placer behind `schedule()`.

`Scheduler(snapshot)` copies the snapshot into a working state (python NodeStates,
the reference for every fit rule, mirrored by numpy arrays in `Fleet`). For each
distinct rank request it caches a score per node (FGD value gain, -inf where the
request does not fit); a placement changes one node, so the next request of that
kind recomputes one row, not the cluster. `place()` is the one code path that
both a scheduling pass (`run`) and the trace benchmark use.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from mtgpu.model.cluster import ClusterSnapshot, PendingJob, Placement, Plan, TenantUsage
from mtgpu.model.job import GpuMode, JobSpec, NodeAllocation

from .fleet import Fleet
from .frag import FragModel, shapes_from_queue
from .holds import CPUS, MEMORY, Holds, JobHolds, Reservation
from .nodefit import NodeState
from .order import QueueOrder
from .preempt import plan_preemptions
from .reasons import join_node_reasons
from .request import RankRequest, rank_requests
from .containers import container_reason, offered_images
from .satisfiable import check_satisfiable, hardware_ids

NEG = -np.inf
TIE_EPS = 1e-9
REASON_SCAN_LIMIT = 64  # nodes examined by name for a pending reason on big clusters
RESERVATION_DEPTH = 16  # blocked jobs per pass that get a computed start time
DEDUPE_ROWS = 48
# Nodes are compared by how much a placement reduces fragmentation, in steps of this share
# of a GPU (like FGD's integer node score); equal steps are ties. Step 0 is exact; 0.02-0.035
# measured best on the openb trace (the exact optimum is too greedy: 95.02 -> 95.34 at 130%).
SCORE_STEP = 0.03
_HASH = 0x9E3779B1  # Fibonacci hashing of the job id picks among equally good nodes


class _Scores:
    __slots__ = ("score", "gpu", "after", "pos")

    def __init__(self, n: int) -> None:
        self.score = np.full(n, NEG)
        self.gpu = np.full(n, -1, dtype=np.int64)
        # V of the node after this placement, where the scored state is the one placing makes
        # (NaN where not known: then the placement recomputes it)
        self.after = np.full(n, np.nan)
        self.pos = 0


_UNKNOWN = object()
_NO_ROWS = np.zeros(0, dtype=bool)  # fragjit.score_and_pick's "no node refused / to check"


class Scheduler:
    """A working copy of the cluster that jobs are placed on one at a time."""

    def __init__(self, snapshot: ClusterSnapshot, workload: list[tuple[RankRequest, float]] | None = None) -> None:
        self.snapshot = snapshot
        self.fleet = Fleet(snapshot)
        self._explicit_workload = workload is not None
        self.set_workload(workload if workload is not None else shapes_from_queue(()))
        # Caches per spec are keyed by a small int, one per distinct spec (`spec_key`): hashing a
        # JobSpec hashes all its fields, and a pass looks each job's spec up several times.
        self._never_cache: dict[int, str | None] = {}
        self._hardware: dict[str, int] | None = None  # satisfiable.hardware_ids, when first needed
        self._able_cache: dict[int, np.ndarray] = {}
        self._pin_cache: dict[int, np.ndarray] = {}
        self._spec_keys: dict[JobSpec, tuple[int, list[RankRequest], int]] = {}
        self._where_keys: dict[tuple, int] = {}
        # the same by object identity; the entry keeps the spec alive, so its id cannot be
        # reused by another object meanwhile
        self._spec_by_id: dict[int, tuple[JobSpec, int, list[RankRequest], int]] = {}
        # (ends_at, allocations) of running jobs with a known end, sorted, for backfill
        self.holds: Holds | None = None  # what the last run() left blocked jobs holding (place_new)
        self._events: list[tuple[float, int, tuple[NodeAllocation, ...]]] = sorted(
            (r.ends_at, r.job_id, r.allocations) for r in snapshot.running if r.ends_at is not None
        )

    # ---- workload and scores --------------------------------------------------

    def set_workload(self, shapes: list[tuple[RankRequest, float]]) -> None:
        """The kinds of jobs to keep room for (FGD's target workload)."""
        f = self.fleet
        self.frag = FragModel(f, shapes)
        self.value = self.frag.value(f.left, f.gmodel, f.cpus_free, f.mem_usable.astype(np.float64))
        self._value_of: dict[int, float] = {}  # V of node states (Fleet.state_id) seen after a placement
        self._scores: dict[RankRequest, _Scores] = {}
        # per spec_key: what _place_fast needs of that spec
        self._fast: dict[int, tuple] = {}

    def _refresh(self, row: int, alloc: NodeAllocation | None = None, after: float = math.nan) -> None:
        """Copy a node's new state into the arrays, with its V (`after`: as scored, when known)."""
        self.fleet.refresh(row, gpus=None if alloc is None else [s.index for s in alloc.gpus])
        self._set_value(row, after)

    def _set_value(self, row: int, after: float) -> None:
        """V of a node whose arrays were just refreshed: `after` as scored, when known (not NaN)."""
        if after == after:  # not NaN
            self.value[row] = after
            return
        f = self.fleet
        sid = f.row_key(row)
        v = self._value_of.get(sid)
        if v is None:
            r = slice(row, row + 1)
            v = self._value_of[sid] = self.frag.value(f.left[r], f.gmodel[r], f.cpus_free[r],
                                                      f.mem_usable[r].astype(np.float64))[0]
        self.value[row] = v

    def scores(self, req: RankRequest) -> _Scores:
        """Per node: how good a home for one rank of `req` now (-inf: does not fit)."""
        s = self._scores.get(req)
        log = self.fleet.log
        if s is None:
            s = self._scores[req] = _Scores(self.fleet.n)
            self._compute(req, s, np.arange(self.fleet.n))
            s.pos = len(log)
        elif s.pos < len(log):
            kind = self._jit_kind(req)
            if kind >= 0:  # the same, in one compiled call
                self._score_jit(kind, req, s, self.fleet.log_rows, s.pos, len(log))
            else:
                rows = self.fleet.changed_since(s.pos)
                # Within a pass a node only loses capacity: where a request did not fit, it still does not.
                rows = rows[s.score[rows] > NEG]
                if len(rows):
                    self._compute(req, s, rows)
            s.pos = len(log)
        return s

    def _jit_kind(self, req: RankRequest) -> int:
        """fragjit.score_rows' kind of request, or -1 (the numpy path: no compiled forms here,
        or a request they do not cover)."""
        if self.frag.jit_form is None or req.vram_bytes is not None:
            return -1
        if not req.gpu_count:
            return 0
        if req.mode == GpuMode.SHARED and req.gpu_count == 1 and req.fraction < 1.0:
            return 1
        return 2 if req.mode == GpuMode.EXCLUSIVE else -1

    def _score_jit(self, kind: int, req: RankRequest, s: _Scores, rows: np.ndarray, log_from: int = 0,
                   log_to: int = 0) -> None:
        self.frag.jit_form.score_rows(kind, rows, log_from, log_to, *self._jit_inputs(req, s))

    def _jit_inputs(self, req: RankRequest, s: _Scores) -> tuple:
        """fragjit.score_rows' arguments after (kind, rows, log_from, log_to): the request, the
        fleet's arrays, its scores and the model (score_and_pick takes them too, then more)."""
        f = self.fleet
        return (f.stamp, req.gpu_count, float(req.fraction), float(req.cpus), int(req.mem_bytes), f.schedulable,
                f.cpus_free, f.mem_usable, f.match_slots(req.vendor, req.model), f.idle, f.open, f.shared_free,
                f.vram_total, f.left, f.gmodel, f.uniform, self.value, s.score, s.gpu, s.after, float(SCORE_STEP),
                NEG, *self.frag.jit_args)

    def _compute(self, req: RankRequest, s: _Scores, rows: np.ndarray) -> None:
        if len(rows) > DEDUPE_ROWS and self._jit_kind(req) < 0:  # (compiled: score_rows dedupes)
            # Many nodes are in the same state (identical and empty at first): score one of each.
            keys = self.fleet.row_keys(rows)
            if len(set(keys.tolist())) < len(rows) // 2:
                _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
                uniq = rows[first]
                self._compute_rows(req, s, uniq)
                s.score[rows] = s.score[uniq][inverse]
                s.gpu[rows] = s.gpu[uniq][inverse]
                s.after[rows] = s.after[uniq][inverse]
                return
        self._compute_rows(req, s, rows)

    def _compute_rows(self, req: RankRequest, s: _Scores, rows: np.ndarray) -> None:
        f = self.fleet
        kind = self._jit_kind(req)
        if kind >= 0:  # the requests most jobs make, in one compiled loop (sched/fragjit.py: the same steps)
            self._score_jit(kind, req, s, np.ascontiguousarray(rows, np.int64))
            return
        fits = f.host_ok(req, rows)
        if req.gpu_count:
            ok = f.gpu_ok(req, rows)
            fits &= ok.sum(axis=1) >= req.gpu_count
        s.gpu[rows] = -1
        s.after[rows] = np.nan
        if not fits.all():  # score only the nodes it fits on
            s.score[rows[~fits]] = NEG
            rows = rows[fits]
            if not len(rows):
                return
            if req.gpu_count:
                ok = ok[fits]
        left = f.left[rows]
        gmodel = f.gmodel[rows]
        cpu = f.cpus_free[rows] - req.cpus
        mem = f.mem_usable[rows].astype(np.float64) - req.mem_bytes
        old = self.value[rows]
        if not req.gpu_count:
            after = s.after[rows] = self.frag.value(left, gmodel, cpu, mem)
            s.score[rows] = self._step(after - old)
            return
        if req.mode == GpuMode.OVERSUBSCRIBE:
            load = np.where(ok, f.load[rows], np.inf)
            s.gpu[rows] = np.argmin(load, axis=1)
            s.score[rows] = -load.min(axis=1)
            return
        if req.gpu_count == 1 and req.mode == GpuMode.SHARED:
            # a fraction takes the same share of every GPU (with vram= too: RankRequest.shared_share)
            share = req.fraction if req.fraction < 1.0 else self._share(req, rows, left)
            # one candidate state per GPU the share could go to
            after = self.frag.value_one_gpu(left, gmodel, share, cpu, mem, ok)
            v = after + share
            best = np.argmax(v, axis=1)
            at = np.arange(len(rows))
            s.gpu[rows] = best
            if req.vram_bytes is None:
                # placing takes exactly that GPU (with vram= the share, and so the CPU weights'
                # free share, differ between GPUs: value_one_gpu approximates, recompute then)
                s.after[rows] = after[at, best]
            s.score[rows] = self._step(v[at, best] - old)
            return
        share = self._share(req, rows, left)
        take = ok & (np.cumsum(ok, axis=1) <= req.gpu_count)
        taken = take * share
        after = self.frag.value(left - taken, gmodel, cpu, mem)
        if req.mode == GpuMode.EXCLUSIVE or (req.fraction >= 1.0 and req.vram_bytes is None):
            # placing takes idle GPUs (share left 1 -> 0), maybe others than these: the same
            # state where all the node's GPUs are of one kind
            s.after[rows] = np.where(f.uniform[rows], after, np.nan)
        s.score[rows] = self._step(after - old + taken.sum(axis=1))

    @staticmethod
    def _step(gain: np.ndarray) -> np.ndarray:
        """Fragmentation removed by a placement (share taken + V after - V before; 0 when
        every kind of job can still use all that is left), in SCORE_STEP steps."""
        if SCORE_STEP <= 0:
            return gain
        return np.floor(gain / SCORE_STEP + 1e-6)

    def _share(self, req: RankRequest, rows: np.ndarray, left: np.ndarray) -> np.ndarray:
        """Per GPU slot: the share of it one GPU of `req` takes."""
        f = self.fleet
        if req.mode == GpuMode.SHARED and req.fraction < 1.0:
            return np.full(left.shape, req.fraction)  # with vram= too (RankRequest.shared_share)
        if req.mode == GpuMode.SHARED and req.vram_bytes is not None:
            total = f.vram_total[rows]
            return np.where(total > 0, np.minimum(1.0, req.vram_bytes / np.maximum(total, 1)), 1.0)
        return left  # a whole GPU takes what is left of it (all of an idle one): f.left[rows]

    # ---- verdicts ---------------------------------------------------------------

    def _spec(self, spec: JobSpec) -> tuple[JobSpec, int, list[RankRequest], int]:
        e = self._spec_by_id.get(id(spec))
        if e is not None and e[0] is spec:
            return e
        k = self._spec_keys.get(spec)
        if k is None:
            reqs = rank_requests(spec)
            # what where a job could ever go, and its reject reason, read (not time=, priority, ...)
            where = (tuple(reqs), spec.nodes, spec.server, spec.exclude, spec.container)
            k = self._spec_keys[spec] = (len(self._spec_keys), reqs, self._where_keys.setdefault(where, len(self._where_keys)))
        e = self._spec_by_id[id(spec)] = (spec, k[0], k[1], k[2])
        return e

    def _where_key(self, spec: JobSpec) -> int:
        """The same int for specs that the same nodes could ever take (`able`, `pinned`,
        `never_fits`: their requests, nodes=, server=, exclude= and container)."""
        return self._spec(spec)[3]

    def spec_key(self, spec: JobSpec) -> int:
        """The same int for equal specs (a cheap dict key)."""
        return self._spec(spec)[1]

    def requests(self, spec: JobSpec) -> list[RankRequest]:
        return self._spec(spec)[2]

    def able(self, spec: JobSpec) -> np.ndarray:
        """Per node: could it ever host one rank of `spec` (any alternative)?"""
        key = self._where_key(spec)
        m = self._able_cache.get(key)
        if m is None:
            m = np.zeros(self.fleet.n, dtype=bool)
            for req in self.requests(spec):
                m |= self.fleet.able(req)
            pin = self.pinned(spec)
            if pin is not None:
                m &= pin
            self._able_cache[key] = m
        return m

    def pinned(self, spec: JobSpec) -> np.ndarray | None:
        """Per node: may `spec` go there at all (`server=`, not an `exclude=` one, and a
        container job only where its image can run); None when every node may."""
        if spec.server is None and spec.container is None and not spec.exclude:
            return None
        key = self._where_key(spec)
        m = self._pin_cache.get(key)
        if m is None:
            m = np.ones(self.fleet.n, dtype=bool)
            if spec.server is not None:
                m[:] = False
                row = self.fleet.row_of.get(spec.server)
                if row is not None:
                    m[row] = True
            for name in spec.exclude:
                row = self.fleet.row_of.get(name)
                if row is not None:
                    m[row] = False
            if spec.container is not None:
                offered = offered_images(self.snapshot)
                for node in self.snapshot.nodes:
                    row = self.fleet.row_of.get(node.name)
                    if row is not None and container_reason(spec.container, node, offered) is not None:
                        m[row] = False
            self._pin_cache[key] = m
        return m

    def never_fits(self, spec: JobSpec) -> str | None:
        """The reject reason (check_satisfiable), with a vectorized fast path for "fits"."""
        key = self._where_key(spec)
        if key in self._never_cache:
            return self._never_cache[key]
        if spec.nodes >= 1 and (spec.server is None or (spec.server in self.fleet.row_of and spec.nodes == 1)) \
                and int(self.able(spec).sum()) >= spec.nodes:
            r = None
        else:
            if self._hardware is None:
                self._hardware = hardware_ids(self.snapshot.nodes)
            r = check_satisfiable(spec, self.snapshot, self._hardware)
        self._never_cache[key] = r
        return r

    # ---- placing ---------------------------------------------------------------

    def place(self, spec: JobSpec, job_id: int = 0, holds: JobHolds | None = None) -> tuple[NodeAllocation, ...] | None:
        """Place every rank of one job now and commit it to the working copy, or None.

        `holds`: what blocked jobs ahead of this one keep back (holds.py); None: nothing.
        `|`-alternatives are equals: a one-node job goes where any of them packs best
        (the earlier alternative on a tie); a gang takes the first alternative all of
        whose ranks fit."""
        placed = self._place_fast(spec, job_id, holds)
        if placed is not _UNKNOWN:
            return placed
        reqs = self.requests(spec)
        if len(reqs) > 1 and spec.nodes == 1:
            ranked = []
            for i, req in enumerate(reqs):
                cand, checks = self._candidates(spec, req, holds)
                best = self._top(cand, checks, req, holds)[1]
                if best > NEG:
                    ranked.append((-best, i, req))
            ranked.sort(key=lambda x: (x[0], x[1]))
            reqs = [r for _, _, r in ranked]
        for req in reqs:
            allocs = self._place_ranks(spec, req, job_id, holds)
            if allocs is not None:
                return allocs
        return None

    def _place_fast(self, spec: JobSpec, job_id: int, holds: JobHolds | None):
        """`place` for most jobs (one rank, no pins, a compiled kind of request whose scores
        exist): the scores brought up to date and the node picked in one compiled call
        (fragjit.score_and_pick: the same choice _place_ranks makes, the nodes the holds
        refuse left out), and the allocation taken; _UNKNOWN where it does not apply (or a
        best node is one where only the allocation tells the holds' verdict), and the
        general path decides."""
        key = self._spec(spec)[1]
        fast = self._fast.get(key)
        if fast is None:
            fast = self._fast_entry(spec, key)
            if fast is None:
                return _UNKNOWN
        req, kind, s, args = fast
        if kind < 0:
            return _UNKNOWN
        refused = checks = _NO_ROWS
        if holds is not None:
            mask, check = holds.refusal(req)
            if mask is not None:
                refused = mask
            if check is not None:
                checks = check
        f = self.fleet
        to = len(f.log)
        row = self.frag.jit_form.score_and_pick(kind, f.log_rows, s.pos, to, *args, int(job_id), _HASH, TIE_EPS,
                                                refused, checks)
        s.pos = to
        if row == -1:
            return None  # it fits nowhere (as _place_ranks finds)
        if row < 0:
            return _UNKNOWN
        alloc = self._take_fast(row, req, kind, int(s.gpu[row]), float(s.after[row]))
        if alloc is None:  # the arrays and the node disagree: as _place_ranks, that node no more
            s.score[row] = NEG
            return self._place_ranks(spec, req, job_id, holds)
        return (alloc,)

    def _fast_entry(self, spec: JobSpec, key: int) -> tuple | None:
        """_place_fast's entry for a spec (kept by its spec_key): (its request, fragjit kind or
        -1 where the fast path does not apply, the request's _Scores, score_and_pick's
        arguments that do not change); None (and nothing kept) while the request has no
        scores yet."""
        reqs = self.requests(spec)
        entry: tuple = (None, -1, None, None)
        kind = self._jit_kind(reqs[0]) if len(reqs) == 1 else -1
        if kind >= 0 and spec.nodes == 1 and self.pinned(spec) is None:
            req = reqs[0]
            s = self._scores.get(req)
            if s is None:
                return None
            entry = (req, kind, s, (*self._jit_inputs(req, s), self.fleet.left_sum))
        self._fast[key] = entry
        return entry

    def _take_fast(self, row: int, req: RankRequest, kind: int, gpu_slot: int, after: float) -> NodeAllocation | None:
        """_alloc_on, NodeState.take and _refresh for a compiled kind of request: only the
        changed GPU (kind 1) or none (kind 0) copied back; None where the node refuses."""
        f = self.fleet
        st = f.states.at(row)
        if kind == 1 and gpu_slot >= 0:
            g = st.gpus[gpu_slot]
            if not (st.schedulable and st.host_fits(req) and g.matches(req) and g.admits(req)):
                return None
            alloc = NodeAllocation(st.name, (g.slot(req),), req.cpus, req.mem_bytes, g.vendor)
            st.take(alloc)
            f.refresh_slot(row, gpu_slot)
        else:
            alloc = st.fit(req)
            if alloc is None:
                return None
            st.take(alloc)
            if not alloc.gpus:
                f.refresh_host(row)
            else:
                f.refresh(row, gpus=[s.index for s in alloc.gpus])
        self._set_value(row, after)
        return alloc

    def fits_now(self, spec: JobSpec) -> bool:
        """Would it fit now if nothing were held?"""
        k = self.frag.jit_form
        for req in self.requests(spec):
            if k is not None:  # the same count, compiled, stopping at spec.nodes
                pin = self.pinned(spec)
                if k.fits_on(self.scores(req).score, NEG, spec.nodes, _NO_ROWS if pin is None else pin):
                    return True
            elif int(self._candidates(spec, req, None)[0].__gt__(NEG).sum()) >= spec.nodes:
                return True
        return False

    def _candidates(self, spec: JobSpec, req: RankRequest,
                    holds: JobHolds | None) -> tuple[np.ndarray, np.ndarray | None]:
        """Per node: the score of one rank of `req` there, -inf where it does not fit or a
        hold refuses it; and the nodes where only the allocation there tells (or None)."""
        score = self.scores(req).score
        pin = self.pinned(spec)
        if pin is not None:
            score = np.where(pin, score, NEG)
        if holds is None:
            return score, None
        return holds.refuse(req, score)

    def _top(self, cand: np.ndarray, checks: np.ndarray | None, req: RankRequest,
             holds: JobHolds | None) -> tuple[np.ndarray, float, np.ndarray | None]:
        """The best score among the nodes the holds let this rank use, and those nodes;
        `cand` is copied before a refused node is marked in it."""
        gpu_choice = self._scores[req].gpu
        own = False
        k = self.frag.jit_form
        while True:
            if k is not None:
                best, ties = k.top(cand, TIE_EPS)
                if best == NEG:
                    return cand, best, None
            else:
                best = float(cand.max()) if cand.size else NEG
                if best == NEG:
                    return cand, best, None
                ties = np.flatnonzero(cand >= best - TIE_EPS)
            if checks is None or holds is None:
                return cand, best, ties
            refused = [r for r in ties[checks[ties]].tolist()
                       if not holds.allows(r, self._alloc_on(r, req, int(gpu_choice[r])))]
            if not refused:
                return cand, best, ties
            if not own:
                cand, own = cand.copy(), True
            cand[refused] = NEG

    def _place_ranks(self, spec: JobSpec, req: RankRequest, job_id: int,
                     holds: JobHolds | None) -> tuple[NodeAllocation, ...] | None:
        nodes = spec.nodes
        cand, checks = self._candidates(spec, req, holds)
        if nodes > 1:
            cand = cand.copy()
            if checks is not None and holds is not None:
                # all or nothing: settle every node the holds must check before the first rank
                # (placing a rank changes only its own node, so the verdicts stay true)
                gpu_choice = self._scores[req].gpu
                for r in np.flatnonzero(checks & (cand > NEG)).tolist():
                    if not holds.allows(r, self._alloc_on(r, req, int(gpu_choice[r]))):
                        cand[r] = NEG
                checks = None
            if int((cand > NEG).sum()) < nodes:
                return None
        allocs: list[NodeAllocation] = []
        gpu_choice = self._scores[req].gpu
        tries = 0
        while len(allocs) < nodes:
            cand, best, ties = self._top(cand, checks, req, holds)
            if best == NEG:
                return None  # holds refuse the rest (a gang), or the arrays and NodeState disagree
            if len(ties) > 1 and not req.gpu_count:
                # a CPU-only job: among equals, the node with the least GPU share left
                free = self.fleet.left_sum[ties]
                ties = ties[free <= free.min() + TIE_EPS]
            row = int(ties[(job_id * _HASH) % len(ties)]) if len(ties) > 1 else int(ties[0])
            alloc = self._alloc_on(row, req, int(gpu_choice[row]))
            if alloc is None:
                tries += 1
                cand = cand.copy()
                cand[row] = NEG
                self._scores[req].score[row] = NEG
                continue
            st = self.fleet.states[row]
            st.take(alloc)
            self._refresh(row, alloc, float(self._scores[req].after[row]))
            allocs.append(alloc)
            if len(allocs) < nodes:
                if cand is self._scores[req].score:
                    cand = cand.copy()
                cand[row] = NEG
        return tuple(allocs)

    def _alloc_on(self, row: int, req: RankRequest, gpu_slot: int) -> NodeAllocation | None:
        st = self.fleet.states[row]
        if req.gpu_count == 1 and req.mode == GpuMode.SHARED and gpu_slot >= 0:
            g = st.gpus[gpu_slot]
            if st.schedulable and st.host_fits(req) and g.matches(req) and g.admits(req):
                return NodeAllocation(st.name, (g.slot(req),), req.cpus, req.mem_bytes, g.vendor)
            return None
        if req.mode == GpuMode.OVERSUBSCRIBE and req.gpu_count == 1 and gpu_slot >= 0:
            g = st.gpus[gpu_slot]
            if st.schedulable and st.host_fits(req) and g.matches(req) and g.admits(req):
                return NodeAllocation(st.name, (g.slot(req),), req.cpus, req.mem_bytes, g.vendor)
            return None
        return st.fit(req)

    # ---- reasons ---------------------------------------------------------------

    def why_pending(self, spec: JobSpec) -> str:
        """Each node's named reason for not taking `spec` now (the first REASON_SCAN_LIMIT
        nodes by name on a big cluster, with a count of the rest)."""
        reqs = self.requests(spec)
        states = self.fleet.states
        per_node: list[tuple[str, str]] = []
        pin = self.pinned(spec)
        if pin is not None:
            if spec.container is not None and spec.server is None:
                offered = offered_images(self.snapshot)
                per_node += [(n.name, why) for n in self.snapshot.nodes[:REASON_SCAN_LIMIT]
                             if (why := container_reason(spec.container, n, offered))]
            states = [states[i] for i in np.flatnonzero(pin)]
        scanned = states[:REASON_SCAN_LIMIT]
        fitting = 0
        for n in scanned:
            reasons = []
            for r in reqs:
                if n.fit(r) is not None:
                    break
                reasons.append(n.why_not(r))
            else:
                if len(reqs) == 1:
                    per_node.append((n.name, reasons[0]))
                else:
                    per_node.append((n.name, " / ".join(f"{q.label}: {x}" for q, x in zip(reqs, reasons))))
                continue
            fitting += 1
        text = join_node_reasons(per_node)
        rest = len(states) - len(scanned)
        if rest > 0:
            text += f"; {rest} more node{'s' if rest != 1 else ''} not listed"
        if spec.nodes > 1:
            total_fit = max(int((self._candidates(spec, r, None)[0] > NEG).sum()) for r in reqs)
            head = f"nodes={spec.nodes}: only {total_fit} node{'s' if total_fit != 1 else ''} can take a rank now"
            return head + (f"; {text}" if text else "")
        return text or "no node can take it now"

    # ---- backfill ----------------------------------------------------------------

    def _reserve(self, spec: JobSpec, now: float) -> Reservation | None:
        """When and where a blocked job could start if running jobs end on time and nothing
        else is placed on those nodes; None when the known end times never free enough."""
        best: Reservation | None = None
        able = self.able(spec)
        for req in self.requests(spec):
            fit_rows = [int(i) for i in np.flatnonzero(self._candidates(spec, req, None)[0] > NEG)]
            fit_set = set(fit_rows)
            t_start = now if len(fit_rows) >= spec.nodes else None
            clones: dict[int, NodeState] = {}
            if t_start is None:
                for t, _, allocs in self._events:
                    if best is not None and t >= best.start_s:
                        break
                    for a in allocs:
                        row = self.fleet.row_of.get(a.node)
                        if row is None or not able[row]:
                            continue
                        c = clones.get(row)
                        if c is None:
                            c = clones[row] = self.fleet.states[row].copy()
                        c.give_back(a)
                        if row not in fit_set and c.fit(req) is not None:
                            fit_set.add(row)
                            fit_rows.append(row)
                    if len(fit_rows) >= spec.nodes:
                        t_start = max(t, now)
                        break
            if t_start is None:
                continue
            if best is None or t_start < best.start_s:
                # hold the nodes that free last first: they are the ones the job waits for;
                # each as it will be then (the releases replayed up to t_start given back)
                rows = fit_rows[-spec.nodes:]
                best = Reservation(t_start, req, {r: clones[r] if r in clones else self.fleet.states[r].copy()
                                                  for r in rows})
        return best

    # ---- the pass --------------------------------------------------------------

    def run(self, queue: list[PendingJob], now: float, usage: dict[str, TenantUsage] | None = None) -> Plan:
        """Place the queue in effective-priority order (see order.py); see docs/SCHEDULING.md."""
        if not self._explicit_workload:
            self.set_workload(shapes_from_queue(self.requests(j.spec)[0] for j in queue))
        plan = Plan()
        order = QueueOrder(queue, now, usage)
        array_running: dict[int, int] = {}
        holds = Holds(self.fleet)
        reserved = 0
        waiting: dict[int, JobSpec] = {}
        held: dict[int, str] = {}
        # what a blocked job's verdicts read: where it could go (_where_key), its end (the
        # holds that bind it) and what the pass did so far (placements, holds)
        held_why: dict[tuple[int, float, int, int], str] = {}
        fits: dict[tuple[int, int], bool] = {}
        # Within a pass capacity is only taken and holds only grow, so a request that
        # could not be placed cannot be placed later in the pass either; and what a
        # blocked request could do (fit now, reserve) is the same until a placement.
        unplaceable: set[int] = set()  # spec keys
        blocked: dict[int, list] = {}  # spec key -> [placements so far, fits_now, reservation]
        not_placed: list[PendingJob] = []  # in queue order: who may preempt (preempt.py)
        for job in order:
            spec = job.spec
            skey = self.spec_key(spec)
            never = self.never_fits(spec)
            if never is not None:
                plan.rejected[job.job_id] = never
                continue
            limit = spec.array.max_running if spec.array is not None else None
            if job.array_parent is not None and limit is not None:
                running = array_running.setdefault(job.array_parent, job.running_in_array)
                if running >= limit:
                    plan.pending[job.job_id] = f"array limit: {running} of its tasks running (%{limit})"
                    continue
            ends = now + spec.time_limit_s if spec.time_limit_s else math.inf
            binding = holds.for_job(ends)
            allocs = None if skey in unplaceable else self.place(spec, job.job_id, binding)
            if allocs is not None:
                plan.placements.append(Placement(job.job_id, allocs))
                if job.array_parent is not None:
                    array_running[job.array_parent] = array_running.get(job.array_parent, job.running_in_array) + 1
                order.started(job, sum(s.fraction for s in allocs[0].gpus))
                if ends != math.inf:
                    bisect.insort(self._events, (ends, job.job_id, allocs))
                holds.placed(allocs, ends)
                continue
            unplaceable.add(skey)
            not_placed.append(job)
            known = blocked.get(skey)
            if known is None or known[0] != len(plan.placements):
                known = blocked[skey] = [len(plan.placements), None, _UNKNOWN]
            # Blocked: it waits, and what it needs is held so later jobs cannot delay it.
            if binding is not None and known[1] is None:
                wkey = (self._where_key(spec), len(plan.placements))
                known[1] = fits.get(wkey)
                if known[1] is None:
                    known[1] = fits[wkey] = self.fits_now(spec)
            if binding is not None and known[1]:
                key = (self._where_key(spec), ends, len(plan.placements), len(holds.holders))
                why = held_why.get(key)
                if why is None:
                    why = held_why[key] = self._why_held(spec, binding, holds)
                held[job.job_id] = why
            else:
                waiting[job.job_id] = spec
            res = None
            if reserved < RESERVATION_DEPTH:
                if known[2] is _UNKNOWN:
                    known[2] = self._reserve(spec, now)
                res = known[2]
            if res is not None:
                reserved += 1
                holds.reserve(job.job_id, res, self.requests(spec))
            else:
                holds.hold_unknown(job.job_id, self.requests(spec), (spec.server, spec.container, spec.exclude),
                                   self.able(spec))
        reasons: dict[int, str] = {}
        for jid, spec in waiting.items():
            wkey = self._where_key(spec)
            r = reasons.get(wkey)
            if r is None:
                r = reasons[wkey] = self.why_pending(spec)
            plan.pending[jid] = r
        plan.pending.update(held)
        if any(r.preemptible or r.preempting_for is not None for r in self.snapshot.running):
            plan_preemptions(self, not_placed, plan)
        self.holds = holds
        return plan

    def place_new(self, queue: list[PendingJob], now: float,
                  usage: dict[str, TenantUsage] | None = None) -> list[Placement]:
        """Place jobs that came after the last run() against what it left: the nodes as its
        placements made them, and the holds of the jobs it found blocked. In effective-
        priority order; it stops at the first job that does not start now, or that needs
        what only a full pass weighs (an array task, a dependency): the next run() decides
        those. Valid while nothing was released since that run (the caller checks): capacity
        was then only taken, so the jobs it found blocked are blocked still, and their holds
        bind every later job as they did in it."""
        holds = self.holds
        if holds is None:
            return []
        placed: list[Placement] = []
        order = QueueOrder(queue, now, usage)
        for job in order:
            spec = job.spec
            if job.array_parent is not None or spec.after or self.never_fits(spec) is not None:
                break
            ends = now + spec.time_limit_s if spec.time_limit_s else math.inf
            allocs = self.place(spec, job.job_id, holds.for_job(ends))
            if allocs is None:
                break
            placed.append(Placement(job.job_id, allocs))
            order.started(job, sum(s.fraction for s in allocs[0].gpus))
            if ends != math.inf:
                bisect.insort(self._events, (ends, job.job_id, allocs))
            holds.placed(allocs, ends)
        return placed

    def _why_held(self, spec: JobSpec, binding: JobHolds, holds: Holds) -> str:
        """Which job ahead holds what this one would take: the earliest hold that refuses it
        on the best node it fits now (the next best, where a gang is refused elsewhere)."""
        first = None
        for req in self.requests(spec):
            cand, _ = self._candidates(spec, req, None)
            gpu_choice = self._scores[req].gpu
            rows = [int(np.argmax(cand))]
            if spec.nodes > 1:
                rows = np.argsort(-cand, kind="stable").tolist()
            for row in rows:
                if cand[row] == NEG:
                    break
                r = binding.first_refusal(req, row, lambda x: self._alloc_on(x, req, int(gpu_choice[x])))
                if r is not None:
                    if first is None or r < first[:2]:
                        first = (*r, row)
                    break
        if first is None:  # not expected: it fits now, so a hold refused it
            holder = holds.holders[0][0] if holds.holders else 0
            return f"held for job {holder}, which waits ahead of it: starting now could delay it"
        seq, what, row = first
        holder, gpus = holds.holders[seq]
        taken = {CPUS: "the CPUs", MEMORY: "the memory"}.get(what, gpus)
        rule = "a job may start ahead of it only when it leaves it that room"
        if any(r.seq == seq for r in holds.reservations):
            rule = "a job may start ahead of it when it leaves it that room at its start, or when its time= ends" \
                   " before that job's start"
        return (f"held for job {holder}, which waits ahead of it: starting now would take {taken} it needs"
                f" on node {self.fleet.names[row]} ({rule})")

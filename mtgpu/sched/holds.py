"""Holds: what a blocked job keeps back so that jobs after it in the queue cannot delay it.

A blocked job B holds, on the nodes it could start on, only what it asked for there: GPUs
of the kinds it asked for, its `cpus=` and its `mem=` (as Slurm's backfill reserves per
node and resource). A later job J may use those nodes as long as B keeps its room:

- B has a reserved start T (running jobs' `time=` free enough by T): on each node of the
  reservation, the node as it will be at T (releases up to T given back, every placement of
  the pass that outlasts T taken) must still fit one rank of B once J's allocation is taken
  too. A J whose `time=` ends by T is not bound by it.
- B's start is unknown: on every node B could ever use, J may take no GPU of a kind B asked
  for, and must leave B's `cpus=` and `mem=` free now (later releases only add to that).

Each blocked job's hold is checked on its own, as each reservation is computed on its own.
docs/SCHEDULING.md "Backfill" states the rule for users.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mtgpu.model.job import NodeAllocation

from .fleet import Fleet
from .nodefit import NodeState
from .request import EPS, RankRequest

NEG = -np.inf
_NONE = np.iinfo(np.int64).max  # "no holder" when looking for the earliest one

CPUS, MEMORY, GPUS = "cpus", "memory", "gpus"


class Reservation:
    """A blocked job's computed start: at `start_s` one rank of `req` fits on each node of
    `at_start` (row -> that node as it will be then)."""

    __slots__ = ("start_s", "req", "at_start", "seq")

    def __init__(self, start_s: float, req: RankRequest, at_start: dict[int, NodeState]) -> None:
        self.start_s = start_s
        self.req = req
        self.at_start = at_start
        self.seq = -1  # its place among the pass's holds, once held

    def short_after(self, row: int, alloc: NodeAllocation) -> str | None:
        """What the job would lack at its start on `row` if `alloc` were taken there too
        (CPUS, MEMORY or GPUS), or None when it would still fit: `NodeState.fit` after
        `take(alloc)`, without copying the node (only the GPUs `alloc` takes)."""
        node, req = self.at_start[row], self.req
        if req.cpus > 0 and node.cpus_free - alloc.cpus + EPS < req.cpus:
            return CPUS
        if req.mem_bytes > 0 and node.mem_usable - alloc.mem_bytes < req.mem_bytes:
            return MEMORY
        if not node.schedulable:
            return GPUS
        if req.gpu_count:
            taken = {s.index: s for s in alloc.gpus}
            fitting = 0
            for g in node.gpus:
                if not g.matches(req):
                    continue
                s = taken.get(g.index)
                if s is not None:
                    g = g.copy()
                    g.take(s)
                fitting += g.admits(req)
            if fitting < req.gpu_count:
                return GPUS
        return None


class Holds:
    """Every hold of one scheduling pass, in queue order (a hold's `seq`)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        n, w = fleet.n, fleet.width
        self.holders: list[tuple[int, str]] = []  # seq -> (job id, the GPUs it asked, for messages)
        self.reservations: list[Reservation] = []
        # Unknown starts, per node: the most cpus= / mem= a holder needs there, and which holder
        # (the first of that size); per GPU slot: held by a holder that could use it, and the first.
        self.cpus = np.zeros(n)
        self.cpus_by = np.zeros(n, dtype=np.int64)
        self.mem = np.zeros(n, dtype=np.int64)
        self.mem_by = np.zeros(n, dtype=np.int64)
        self.slots = np.zeros((n, w), dtype=bool)
        self.slots_by = np.zeros((n, w), dtype=np.int64)
        self.any_cpus = self.any_mem = self.any_slots = False
        self._unknown_seen: set[tuple] = set()
        self.at_start_version = 0  # changes whenever a reservation's node at its start changes
        self._slots_version = 0
        self._overlap: dict[tuple, tuple[int, np.ndarray | None, np.ndarray | None]] = {}
        self._views: dict[float, JobHolds | None] = {}

    def _new_holder(self, job_id: int, reqs: list[RankRequest]) -> int:
        kinds = list(dict.fromkeys(r.kind() for r in reqs if r.gpu_count))
        gpus = " or ".join(kinds)
        self.holders.append((job_id, "the GPUs" if gpus in ("", "GPU") else f"the {gpus} GPUs"))
        return len(self.holders) - 1

    # ---- adding holds ----------------------------------------------------------

    def hold_unknown(self, job_id: int, reqs: list[RankRequest], server: str | None, rows: np.ndarray) -> None:
        """A blocked job without a computed start holds its kinds of GPU, its cpus= and its
        mem= on `rows`, the nodes it could ever use."""
        key = (tuple(reqs), server)
        if key in self._unknown_seen:  # the same holds as a job ahead of it: nothing to add
            return
        self._unknown_seen.add(key)
        seq = self._new_holder(job_id, reqs)
        cpus, mem = reqs[0].cpus, reqs[0].mem_bytes  # the same for every alternative
        if cpus > 0:
            up = rows & (self.cpus < cpus)
            self.cpus[up] = cpus
            self.cpus_by[up] = seq
            self.any_cpus = True
        if mem > 0:
            up = rows & (self.mem < mem)
            self.mem[up] = mem
            self.mem_by[up] = seq
            self.any_mem = True
        f = self.fleet
        for r in reqs:
            if not r.gpu_count:
                continue
            usable = f.match_slots(r.vendor, r.model) & (rows & f.able(r))[:, None]
            if r.vram_bytes is not None:
                usable = usable & (f.vram_total >= r.vram_bytes)
            new = usable & ~self.slots
            if new.any():
                self.slots |= new
                self.slots_by[new] = seq
                self.any_slots = True
                self._slots_version += 1
        self._views.clear()

    def reserve(self, job_id: int, res: Reservation, reqs: list[RankRequest]) -> None:
        """A blocked job holds room for one rank on each node of its reservation."""
        if res.seq >= 0:  # a job of the same spec ahead of it holds the very same room
            return
        res.seq = self._new_holder(job_id, reqs)
        self.reservations.append(res)
        self._views.clear()

    def placed(self, allocs: tuple[NodeAllocation, ...], ends: float) -> None:
        """A job started: where it outlasts a reservation's start, that node has less then."""
        for res in self.reservations:
            if ends > res.start_s:
                for a in allocs:
                    node = res.at_start.get(self.fleet.row_of[a.node])
                    if node is not None:
                        node.take(a)
                        self.at_start_version += 1

    # ---- asking ----------------------------------------------------------------

    def for_job(self, ends: float) -> JobHolds | None:
        """The holds that bind a job ending at `ends` (math.inf: no time=), or None."""
        if ends in self._views:
            return self._views[ends]
        by_row: dict[int, list[Reservation]] = {}
        for res in self.reservations:
            if ends > res.start_s:
                for row in res.at_start:
                    by_row.setdefault(row, []).append(res)
        view = None
        if by_row or self.any_cpus or self.any_mem or self.any_slots:
            view = JobHolds(self, by_row)
        self._views[ends] = view
        return view

    def gpu_overlap(self, req: RankRequest) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Per node, for a job asking GPUs of `req`'s kind: every such GPU there is held
        (refused), or only some are (its allocation decides); None where no node is so."""
        key = (req.vendor, req.model)
        c = self._overlap.get(key)
        if c is None or c[0] != self._slots_version:
            mine = self.fleet.match_slots(req.vendor, req.model)
            some = (mine & self.slots).any(axis=1)
            all_held = some & ~(mine & ~self.slots).any(axis=1)
            partly = some & ~all_held
            c = self._overlap[key] = (self._slots_version, all_held if all_held.any() else None,
                                      partly if partly.any() else None)
        return c[1], c[2]

    def holds_gpu(self, row: int, alloc: NodeAllocation) -> bool:
        """Does `alloc` take a GPU on `row` that a job with an unknown start holds?"""
        index = self.fleet.gindex[row]
        for s in alloc.gpus:
            col = np.flatnonzero(index == s.index)
            if len(col) and self.slots[row, col[0]]:
                return True
        return False


class JobHolds:
    """The holds that bind one job, as the placer asks them."""

    __slots__ = ("holds", "by_row", "check_rows", "_room")

    def __init__(self, holds: Holds, by_row: dict[int, list[Reservation]]) -> None:
        self.holds = holds
        self.by_row = by_row
        self.check_rows: np.ndarray | None = None
        if by_row:
            self.check_rows = np.zeros(holds.fleet.n, dtype=bool)
            self.check_rows[list(by_row)] = True
        self._room: tuple[int, np.ndarray, np.ndarray] | None = None

    def _reserved_room(self) -> tuple[np.ndarray, np.ndarray]:
        """Per node: the CPUs and memory a job may take there and leave every binding
        reservation its cpus= and mem= at its start (inf where none holds any)."""
        version = self.holds.at_start_version
        if self._room is None or self._room[0] != version:
            n = self.holds.fleet.n
            cpus, mem = np.full(n, np.inf), np.full(n, np.inf)
            for row, reservations in self.by_row.items():
                for res in reservations:
                    node = res.at_start[row]
                    if res.req.cpus > 0:
                        cpus[row] = min(cpus[row], node.cpus_free - res.req.cpus)
                    if res.req.mem_bytes > 0:
                        mem[row] = min(mem[row], node.mem_usable - res.req.mem_bytes)
            self._room = (version, cpus, mem)
        return self._room[1], self._room[2]

    def refuse(self, req: RankRequest, score: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """`score` with the nodes the holds refuse to one rank of `req` set to -inf, and the
        nodes where only the allocation there can tell (`allows`; None: no such node)."""
        h = self.holds
        f = h.fleet
        unknown_cpus = h.any_cpus and req.cpus > 0
        unknown_mem = h.any_mem and req.mem_bytes > 0
        all_held = checks = None
        if req.gpu_count:
            if h.any_slots:
                all_held, checks = h.gpu_overlap(req)
            if self.check_rows is not None:  # what it takes of GPUs there depends on its allocation
                checks = self.check_rows if checks is None else checks | self.check_rows
        reserved = bool(self.by_row) and (req.cpus > 0 or req.mem_bytes > 0)
        if not (unknown_cpus or unknown_mem or all_held is not None or reserved):
            return score, checks
        rows = np.flatnonzero(score > NEG)  # judged only where it fits: often few of many nodes
        if not len(rows):
            return score, checks
        # Unknown starts: B's cpus= and mem= stay free now; no GPU of B's kinds is taken.
        bad = f.cpus_free[rows] - h.cpus[rows] < req.cpus - EPS if unknown_cpus else np.zeros(len(rows), dtype=bool)
        if unknown_mem:
            bad |= f.mem_usable[rows] - h.mem[rows] < req.mem_bytes
        if all_held is not None:
            bad |= all_held[rows]
        # Reserved starts: CPUs and memory are counts, so they are judged here; GPUs by `allows`.
        if reserved:
            cpus, mem = self._reserved_room()
            bad |= (req.cpus > cpus[rows] + EPS) | (req.mem_bytes > mem[rows])
        if bad.any():
            score = score.copy()
            score[rows[bad]] = NEG
        return score, checks

    def allows(self, row: int, alloc: NodeAllocation | None) -> bool:
        """May this job take `alloc` on `row` (one of `refuse`'s rows to check)?"""
        if alloc is None:
            return True
        for res in self.by_row.get(row, ()):
            if res.short_after(row, alloc) is not None:
                return False
        return not (alloc.gpus and self.holds.any_slots and self.holds.holds_gpu(row, alloc))

    def first_refusal(self, req: RankRequest, row: int,
                      alloc_on: Callable[[int], NodeAllocation | None]) -> tuple[int, str] | None:
        """(seq, what) of the earliest hold that refuses one rank of `req` on `row`, for the
        held job's message; None if none does."""
        h = self.holds
        f = h.fleet
        found: list[tuple[int, str]] = []
        if h.any_cpus and req.cpus > 0 and f.cpus_free[row] - req.cpus + EPS < h.cpus[row]:
            found.append((int(h.cpus_by[row]), CPUS))
        if h.any_mem and req.mem_bytes > 0 and f.mem_usable[row] - req.mem_bytes < h.mem[row]:
            found.append((int(h.mem_by[row]), MEMORY))
        if h.any_slots and req.gpu_count:
            held = f.match_slots(req.vendor, req.model)[row] & h.slots[row]
            if held.any():
                found.append((int(h.slots_by[row][held].min()), GPUS))
        reservations = self.by_row.get(row)
        if reservations:
            alloc = alloc_on(row)
            for res in reservations:
                what = None if alloc is None else res.short_after(row, alloc)
                if what is not None:
                    found.append((res.seq, what))
        return min(found) if found else None

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
docs/SCHEDULING.md "Backfill and holds" states the rule for users.
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
        self._unknown_version = 0  # changes whenever cpus, mem or slots change
        self._refused: dict[tuple, list] = {}
        self._overlap: dict[tuple, list] = {}  # (vendor, model) -> [all held, partly held, any, any]
        self._views: dict[float, JobHolds | None] = {}

    def _new_holder(self, job_id: int, reqs: list[RankRequest]) -> int:
        kinds = list(dict.fromkeys(r.kind() for r in reqs if r.gpu_count))
        gpus = " or ".join(kinds)
        self.holders.append((job_id, "the GPUs" if gpus in ("", "GPU") else f"the {gpus} GPUs"))
        return len(self.holders) - 1

    # ---- adding holds ----------------------------------------------------------

    def hold_unknown(self, job_id: int, reqs: list[RankRequest], pin: tuple, rows: np.ndarray) -> None:
        """A blocked job without a computed start holds its kinds of GPU, its cpus= and its
        mem= on `rows`, the nodes it could ever use (`pin`: what chose them, e.g. server=)."""
        key = (tuple(reqs), pin)
        if key in self._unknown_seen:  # the same holds as a job ahead of it: nothing to add
            return
        self._unknown_seen.add(key)
        seq = self._new_holder(job_id, reqs)
        cpus, mem = reqs[0].cpus, reqs[0].mem_bytes  # the same for every alternative
        if cpus > 0:
            up = rows & (self.cpus < cpus)
            if up.any():
                self.cpus[up] = cpus
                self.cpus_by[up] = seq
                self.any_cpus = True
                self._unknown_version += 1
        if mem > 0:
            up = rows & (self.mem < mem)
            if up.any():
                self.mem[up] = mem
                self.mem_by[up] = seq
                self.any_mem = True
                self._unknown_version += 1
        f = self.fleet
        for r in reqs:
            if not r.gpu_count:
                continue
            able = rows if len(reqs) == 1 else rows & f.able(r)  # `rows` are where one of them could run
            usable = f.match_slots(r.vendor, r.model) & able[:, None]
            if r.vram_bytes is not None:
                usable = usable & (f.vram_total >= r.vram_bytes)
            new = usable & ~self.slots
            if new.any():
                self.slots |= new
                self.slots_by[new] = seq
                self.any_slots = True
                self._unknown_version += 1
                changed = np.flatnonzero(new.any(axis=1))
                for (vendor, model), c in self._overlap.items():
                    c[0][changed], c[1][changed] = self._overlap_on(vendor, model, changed)
                    c[2], c[3] = bool(c[0].any()), bool(c[1].any())
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

    def gpu_overlap(self, vendor: str | None, model: str | None) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Per node, for a job asking GPUs of this kind: every such GPU there is held
        (refused), or only some are (its allocation decides); None where no node is so.
        Kept per kind, and updated on the nodes where a hold adds GPUs."""
        c = self._overlap.get((vendor, model))
        if c is None:
            all_held, partly = self._overlap_on(vendor, model, slice(None))
            c = self._overlap[(vendor, model)] = [all_held, partly, bool(all_held.any()), bool(partly.any())]
        return (c[0] if c[2] else None), (c[1] if c[3] else None)

    def _overlap_on(self, vendor: str | None, model: str | None,
                    rows: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
        mine = self.fleet.match_slots(vendor, model)[rows]
        held = self.slots[rows]
        some = (mine & held).any(axis=1)
        all_held = some & ~(mine & ~held).any(axis=1)
        return all_held, some & ~all_held

    def unknown_refused(self, req: RankRequest) -> np.ndarray | None:
        """Per node: do the holds of unknown start refuse one rank of `req` there (read only
        where it fits)? None: nowhere. Kept per kind of request and updated, like scores,
        only on the nodes placements changed since, until a hold changes."""
        cpus = req.cpus if self.any_cpus and req.cpus > 0 else 0.0
        mem = req.mem_bytes if self.any_mem and req.mem_bytes > 0 else 0
        gpus = (req.vendor, req.model) if self.any_slots and req.gpu_count else None
        if not cpus and not mem and gpus is None:
            return None
        key = (cpus, mem, gpus)
        log = self.fleet.log
        c = self._refused.get(key)
        if c is None or c[0] != self._unknown_version:
            mask = self._refused_on(cpus, mem, gpus, slice(None))
            c = self._refused[key] = [self._unknown_version, len(log), mask, bool(mask.any())]
        elif c[1] < len(log):
            rows = self.fleet.changed_since(c[1])
            c[2][rows] = self._refused_on(cpus, mem, gpus, rows)
            c[1] = len(log)
            c[3] = bool(c[2].any())
        return c[2] if c[3] else None

    def _refused_on(self, cpus: float, mem: int, gpus: tuple | None, rows: np.ndarray | slice) -> np.ndarray:
        # Unheld nodes hold 0, so these refuse them only where the request does not fit anyway.
        f = self.fleet
        bad = f.cpus_free[rows] - self.cpus[rows] < cpus - EPS if cpus else np.zeros(f.n, dtype=bool)[rows]
        if mem:
            bad |= f.mem_usable[rows] - self.mem[rows] < mem
        if gpus is not None:
            all_held = self.gpu_overlap(*gpus)[0]
            if all_held is not None:
                bad |= all_held[rows]
        return bad

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
        self._room: tuple[int, np.ndarray, np.ndarray, np.ndarray] | None = None

    def _reserved_room(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The reserved nodes, and on each the CPUs and memory a job may take there and leave
        every binding reservation its cpus= and mem= at its start (inf: none asked)."""
        version = self.holds.at_start_version
        if self._room is None or self._room[0] != version:
            rows = np.array(list(self.by_row), dtype=np.int64)
            cpus, mem = np.full(len(rows), np.inf), np.full(len(rows), np.inf)
            for i, row in enumerate(rows.tolist()):
                for res in self.by_row[row]:
                    node = res.at_start[row]
                    if res.req.cpus > 0:
                        cpus[i] = min(cpus[i], node.cpus_free - res.req.cpus)
                    if res.req.mem_bytes > 0:
                        mem[i] = min(mem[i], node.mem_usable - res.req.mem_bytes)
            self._room = (version, rows, cpus, mem)
        return self._room[1], self._room[2], self._room[3]

    def refuse(self, req: RankRequest, score: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """`score` with the nodes the holds refuse to one rank of `req` set to -inf, and the
        nodes where only the allocation there can tell (`allows`; None: no such node)."""
        refused, checks = self.refusal(req)
        if refused is not None:
            score = np.where(refused, NEG, score)
        return score, checks

    def refusal(self, req: RankRequest) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Per node: do the holds refuse one rank of `req` there (None: nowhere; the array may
        be a cache's, not to be changed), and the nodes where only the allocation there can
        tell (`allows`; None: no such node)."""
        h = self.holds
        checks = None
        if req.gpu_count:
            if h.any_slots:
                checks = h.gpu_overlap(req.vendor, req.model)[1]
            if self.check_rows is not None:  # what it takes of GPUs there depends on its allocation
                checks = self.check_rows if checks is None else checks | self.check_rows
        # Unknown starts: B's cpus= and mem= stay free now; no GPU of B's kinds is taken.
        refused = h.unknown_refused(req)
        # Reserved starts: CPUs and memory are counts, so they are judged here; GPUs by `allows`.
        if self.by_row and (req.cpus > 0 or req.mem_bytes > 0):
            rows, cpus, mem = self._reserved_room()
            out = rows[(req.cpus > cpus + EPS) | (req.mem_bytes > mem)]
            if len(out):
                refused = np.zeros(self.holds.fleet.n, dtype=bool) if refused is None else refused.copy()
                refused[out] = True
        return refused, checks

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

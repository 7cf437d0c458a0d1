"""The cluster's capacity as numpy arrays, for filtering and scoring many nodes at once.

Rows are nodes, columns GPU slots (padded to the largest node). The python
`NodeState` objects stay the reference; after each placement the engine calls
`refresh(row)` to copy the one changed node back into the arrays and logs the
row, so caches keyed by request recompute only the rows that changed.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from mtgpu.model.cluster import ClusterSnapshot, NodeView
from mtgpu.model.gpu import model_matches
from mtgpu.model.job import GpuMode

from .nodefit import NodeState
from .request import EPS, RankRequest


def row_sum(values: list[float]) -> float:
    """A node's GPU share left (Fleet.left_sum): its slots added in order from 0.0, the same
    floats as _fill's column by column sum (numpy's sum adds pairwise: other last bits)."""
    acc = 0.0
    for x in values:
        acc += x
    return acc


class NodeStates:
    """The pass's NodeState of each row, made when first read: a pass that places a few jobs
    on a thousand nodes reads a few of them (the arrays are filled from the views)."""

    __slots__ = ("_views", "_made")

    def __init__(self, views: list[NodeView]) -> None:
        self._views = views
        self._made: list[NodeState | None] = [None] * len(views)

    def __len__(self) -> int:
        return len(self._views)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.at(k) for k in range(*i.indices(len(self._views)))]
        return self.at(i)

    def at(self, i: int) -> NodeState:
        """self[i] for an int (no slice test: the placement's commit calls it)."""
        st = self._made[i]
        if st is None:
            st = self._made[i] = NodeState(self._views[i])
        return st

    def __iter__(self) -> Iterator[NodeState]:
        return (self[i] for i in range(len(self._views)))


class Fleet:
    def __init__(self, snapshot: ClusterSnapshot) -> None:
        views = list(snapshot.nodes)
        self.states = NodeStates(views)
        self.names = [v.name for v in views]
        self.row_of = {n: i for i, n in enumerate(self.names)}
        n = len(views)
        self.n = n
        self.width = g = max([len(v.gpus) for v in views] + [1])
        flat = [x for v in views for x in v.gpus]  # every GPU, node after node
        kinds = {kind: i for i, kind in enumerate(dict.fromkeys([(x.vendor, x.model) for x in flat]))}
        self.kinds = list(kinds)  # model id -> (vendor, model); id len(kinds) = no GPU
        self.no_gpu = len(self.kinds)
        self.gmodel = np.full((n, g), self.no_gpu, dtype=np.int32)
        self.gindex = np.full((n, g), -1, dtype=np.int32)
        self.vram_total = np.zeros((n, g), dtype=np.int64)
        self.idle = np.zeros((n, g), dtype=bool)
        self.open = np.zeros((n, g), dtype=bool)  # present and not held exclusively
        self.left = np.zeros((n, g), dtype=np.float64)  # share left for shared jobs (0 if exclusive)
        self.left_sum = np.zeros(n, dtype=np.float64)  # per node, its slots added in order (row_sum)
        self.shared_free = np.zeros((n, g), dtype=np.int64)
        self.meas_free = np.zeros((n, g), dtype=np.int64)
        self.load = np.zeros((n, g), dtype=np.float64)  # for oversubscribe: utilization + used share
        self.cpus_free = np.zeros(n, dtype=np.float64)
        self.mem_usable = np.zeros(n, dtype=np.int64)
        self.schedulable = np.zeros(n, dtype=bool)
        self.cpus_total = np.array([float(v.cpus_total) for v in views], dtype=np.float64)
        self.mem_total = np.array([int(v.mem_total_bytes) for v in views], dtype=np.int64)
        self._ids: dict[bytes, int] = {}
        self.state_id = np.zeros(n, dtype=np.int64)
        self._fill(views, flat, kinds)
        # all of the node's GPUs are of one kind (any k idle GPUs leave the same shares by kind)
        self.uniform = ((self.gmodel == self.gmodel[:, :1]) | (self.gmodel == self.no_gpu)).all(axis=1)
        self.log: list[int] = []  # rows changed, in order
        self.log_rows = np.zeros(max(64, n), dtype=np.int64)  # the same, for compiled code (first len(log))
        self.stamp = np.full(n, -1, dtype=np.int64)  # per row: its last position in `log`
        self._match_cache: dict[tuple[str | None, str | None], np.ndarray] = {}
        self._match_slots: dict[tuple[str | None, str | None], np.ndarray] = {}
        self._gpu_counts: dict[tuple[str | None, str | None, int | None], np.ndarray] = {}

    def _fill(self, views: list[NodeView], flat: list, kinds: dict[tuple[str, str], int]) -> None:
        """Every row at once, from the views: what refresh() copies from a row's NodeState
        (GpuState's properties, here as array arithmetic in the same order, so the same
        floats), written as whole arrays, and the same row keys and ids. One element at a
        time, a thousand nodes took longer than the rest of a pass."""
        n, g = self.n, self.width
        if n == 0:
            self._static = []
            return
        # each attribute of every GPU (`flat`) read once, then put in its (row, slot): the
        # rest stays 0, as a node with fewer GPUs than `width` has it
        counts = np.array([len(v.gpus) for v in views], dtype=np.int64)
        rows = np.repeat(np.arange(n), counts)
        slots = np.arange(len(flat)) - np.repeat(np.cumsum(counts) - counts, counts)

        def grid(values: list, dtype) -> np.ndarray:
            out = np.zeros((n, g), dtype=dtype)
            out[rows, slots] = np.array(values, dtype=dtype)
            return out

        f64, i64 = np.float64, np.int64
        a = {"gmodel": grid([kinds[(x.vendor, x.model)] for x in flat], i64),
             "gindex": grid([x.index for x in flat], i64),
             "total": grid([int(x.vram_total_bytes) for x in flat], i64),
             "used": grid([int(x.vram_used_measured_bytes) for x in flat], i64),
             "util": grid([float(x.utilization_pct) for x in flat], f64),
             "frac": grid([float(x.committed_fraction) for x in flat], f64),
             "cvram": grid([int(x.committed_vram_bytes) for x in flat], i64),
             "excl": grid([bool(x.exclusive) for x in flat], bool),
             "shared": grid([int(x.shared_jobs) for x in flat], i64),
             "over": grid([int(x.oversubscribed_jobs) for x in flat], i64)}
        present = np.arange(g)[None, :] < counts[:, None]
        total, used, excl = a["total"], a["used"], a["excl"]
        self.gmodel[:] = np.where(present, a["gmodel"], self.no_gpu)
        self.gindex[:] = np.where(present, a["gindex"], -1)
        self.vram_total[:] = total
        self.idle[:] = present & ~excl & (a["frac"] <= EPS) & (a["cvram"] == 0) & (a["shared"] == 0) & (a["over"] == 0)
        self.open[:] = present & ~excl
        self.left[:] = np.where(present & ~excl, np.maximum(0.0, 1.0 - a["frac"]), 0.0)
        self.shared_free[:] = np.maximum(0, np.minimum(total - a["cvram"], total - used))
        self.meas_free[:] = np.maximum(0, total - used)
        ratio = np.divide(used, total, out=np.zeros((n, g), dtype=np.float64), where=total != 0)
        self.load[:] = np.where(present, a["util"] / 100.0 + ratio + 0.01 * a["over"], 0.0)
        self.left_sum[:] = 0.0
        for j in range(g):  # in slot order, as refresh adds them (row_sum)
            self.left_sum += self.left[:, j]
        self.cpus_free[:] = [float(v.cpus_total) - float(v.cpus_committed) for v in views]
        mem_free = [int(v.mem_total_bytes) - int(v.mem_committed_bytes) for v in views]
        self.mem_usable[:] = [free if v.mem_available_measured_bytes is None
                              else min(free, int(v.mem_available_measured_bytes)) for free, v in zip(mem_free, views)]
        self.schedulable[:] = [bool(v.schedulable) for v in views]
        # Equal node states get equal ids (exact: the bytes of every array fit and scoring read),
        # so a request is scored once per distinct state among many changed rows.
        static = self._bytes(self.gmodel, self.vram_total)
        self._static = [row.tobytes() for row in static]
        keys = self._bytes(static, self.left, self.idle, self.open, self.shared_free, self.meas_free, self.load,
                           self.cpus_free[:, None], self.mem_usable[:, None], self.schedulable[:, None])
        ids = self._ids
        for i in range(n):
            key = keys[i].tobytes()
            sid = ids.get(key)
            if sid is None:
                sid = ids[key] = len(ids)
            self.state_id[i] = sid

    def _bytes(self, *arrays: np.ndarray) -> np.ndarray:
        """Per row, the bytes of these arrays' rows one after the other (as refresh joins them)."""
        return np.concatenate([np.ascontiguousarray(a).view(np.uint8).reshape(self.n, -1) for a in arrays], axis=1)

    def refresh(self, i: int, log: bool = True, gpus: list[int] | None = None) -> None:
        """Copy node row `i` (only the GPUs of index `gpus`, when given) from its NodeState."""
        s = self.states[i]
        if gpus is None:
            slots = enumerate(s.gpus)
        else:
            slots = [(j, x) for j, x in enumerate(s.gpus) if x.index in gpus]
        for j, x in slots:
            self._copy_gpu(i, j, x)
        self.left_sum[i] = row_sum(self.left[i].tolist())
        self._copy_host(i, s, log)

    def refresh_slot(self, i: int, j: int) -> None:
        """refresh(i, gpus=[that GPU's index]) for the GPU in slot j, with fewer steps (a
        placement's commit: engine.Scheduler._place_fast)."""
        s = self.states.at(i)
        self._copy_gpu(i, j, s.gpus[j])
        self.left_sum[i] = row_sum(self.left[i].tolist())
        self._copy_host(i, s, True)

    def refresh_host(self, i: int) -> None:
        """refresh(i, gpus=[]): a placement that took no GPU (the GPU arrays and left_sum, the
        same sum of the same values, stay)."""
        self._copy_host(i, self.states.at(i), True)

    def _copy_gpu(self, i: int, j: int, x) -> None:
        self.idle[i, j] = x.idle
        self.open[i, j] = not x.exclusive
        self.left[i, j] = 0.0 if x.exclusive else max(0.0, 1.0 - x.frac)
        self.shared_free[i, j] = x.shared_free
        self.meas_free[i, j] = x.measured_free
        self.load[i, j] = x.util / 100.0 + (x.used / x.total if x.total else 0.0) + 0.01 * x.over

    def _copy_host(self, i: int, s: NodeState, log: bool) -> None:
        self.cpus_free[i] = s.cpus_free
        self.mem_usable[i] = s.mem_usable
        self.schedulable[i] = s.schedulable
        self.state_id[i] = -1  # made when read (row_keys): most changed rows are never compared
        if log:
            at = len(self.log)
            self.stamp[i] = at
            self.log.append(i)
            if at == len(self.log_rows):
                self.log_rows = np.concatenate((self.log_rows, np.zeros(at, dtype=np.int64)))
            self.log_rows[at] = i

    def changed_since(self, pos: int) -> np.ndarray:
        """The rows changed since `log` had `pos` entries, each once."""
        log = self.log
        m = len(log) - pos
        if m == 1:
            return np.array(log[pos:], dtype=np.int64)
        if m * 16 > self.n:  # a long stretch of the log: one pass over the stamps is cheaper
            return np.flatnonzero(self.stamp >= pos)
        return np.fromiter(set(log[pos:]), dtype=np.int64)

    def row_keys(self, rows: np.ndarray) -> np.ndarray:
        """An id per row of everything fit and scoring read: equal rows, equal ids."""
        ids = self.state_id[rows]
        if (ids < 0).any():
            for i in rows[ids < 0].tolist():
                self.row_key(i)
            ids = self.state_id[rows]
        return ids

    def row_key(self, i: int) -> int:
        """row_keys for one row."""
        sid = int(self.state_id[i])
        if sid >= 0:
            return sid
        key = b"".join((self._static[i], self.left[i].tobytes(), self.idle[i].tobytes(), self.open[i].tobytes(),
                        self.shared_free[i].tobytes(), self.meas_free[i].tobytes(), self.load[i].tobytes(),
                        self.cpus_free[i:i + 1].tobytes(), self.mem_usable[i:i + 1].tobytes(),
                        b"\1" if self.schedulable[i] else b"\0"))
        ids = self._ids
        sid = ids.get(key)
        if sid is None:
            sid = ids[key] = len(ids)
        self.state_id[i] = sid
        return sid

    # ---- filters -------------------------------------------------------------

    def kind_match(self, vendor: str | None, model: str | None) -> np.ndarray:
        """Bool per model id (plus the trailing no-GPU id): does a GPU of that kind match?"""
        key = (vendor, model)
        m = self._match_cache.get(key)
        if m is None:
            m = np.zeros(len(self.kinds) + 1, dtype=bool)
            for k, (v, mod) in enumerate(self.kinds):
                m[k] = (vendor is None or v == vendor) and (model is None or model_matches(model, mod))
            self._match_cache[key] = m
        return m

    def match_slots(self, vendor: str | None, model: str | None) -> np.ndarray:
        """Per node and GPU slot: is the GPU of that kind? (a few arrays: one per kind asked)"""
        key = (vendor, model)
        slots = self._match_slots.get(key)
        if slots is None:
            slots = self._match_slots[key] = self.kind_match(vendor, model)[self.gmodel]
        return slots

    def gpu_ok(self, req: RankRequest, rows: np.ndarray | slice) -> np.ndarray:
        """Per GPU slot of `rows`: can it take one GPU of `req` now? (exactly GpuState.admits)"""
        match = self.match_slots(req.vendor, req.model)[rows]
        mode = req.mode
        v = req.vram_bytes
        if mode == GpuMode.EXCLUSIVE:
            ok = match & self.idle[rows]
            if v is not None:
                ok &= (self.vram_total[rows] >= v) & (self.meas_free[rows] >= v)
            return ok
        ok = match & self.open[rows]
        if mode == GpuMode.SHARED:
            # RankRequest.shared_vram_bytes and shared_share, per GPU slot
            total = self.vram_total[rows]
            if v is not None:
                need = np.full(total.shape, v, dtype=np.int64)
            else:
                need = (req.fraction * total).astype(np.int64)
            if v is not None and req.fraction >= 1.0:
                share = np.minimum(1.0, v / np.maximum(total, 1))
                share = np.where(total > 0, share, 1.0)
            else:
                share = req.fraction  # a fraction counts as itself, vram= or not
            ok &= (self.shared_free[rows] >= need) & (self.left[rows] + EPS >= share)
        elif v is not None:
            ok &= self.meas_free[rows] >= v
        return ok

    def host_ok(self, req: RankRequest, rows: np.ndarray | slice) -> np.ndarray:
        ok = self.schedulable[rows].copy()
        if req.cpus > 0:
            ok &= self.cpus_free[rows] + EPS >= req.cpus
        if req.mem_bytes > 0:
            ok &= self.mem_usable[rows] >= req.mem_bytes
        return ok

    def able(self, req: RankRequest) -> np.ndarray:
        """Per node: could it ever host one rank of `req`, empty (drained nodes count)?"""
        ok = np.ones(self.n, dtype=bool)
        if req.cpus > 0:
            ok &= self.cpus_total + EPS >= req.cpus
        if req.mem_bytes > 0:
            ok &= self.mem_total >= req.mem_bytes
        if req.gpu_count:
            key = (req.vendor, req.model, req.vram_bytes)
            count = self._gpu_counts.get(key)
            if count is None:  # per node: GPUs of that kind (and VRAM), which never changes
                g = self.kind_match(req.vendor, req.model)[self.gmodel]
                if req.vram_bytes is not None:
                    g &= self.vram_total >= req.vram_bytes
                count = self._gpu_counts[key] = g.sum(axis=1)
            ok &= count >= req.gpu_count
        return ok

"""Fragmentation-aware packing, after FGD (Weng et al., "Beware of Fragmentation:
Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC '23).

A node's GPU capacity is *fragmented* for a kind of job when that job could not use
it: the node lacks CPUs or memory for it, its GPUs are of a model the job excludes,
or too few of its GPUs have the share the job needs. FGD weighs each kind by how
common it is in the workload and places every job where the expected fragmentation
grows least. Written as a value: with `usable_m(node)` the GPU share job kind m could
use on the node (0 when m cannot be placed there at all),

    V(node) = sum_m p_m * usable_m(node)          fragmentation = free share - V

and since a job removes the same share wherever it goes, minimizing the growth of
fragmentation is maximizing V(after) - V(before). Ties (common: identical empty
nodes) are broken by a hash of the job id, so a decision can be replayed.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from mtgpu.model.job import GpuMode

from .fleet import Fleet
from .request import EPS, RankRequest

TYPICAL_SHARE = 1.0
HOST_TABLE_MAX = 4_000_000  # entries of the (CPU level, memory level, kind) table of hostable kinds
# How much a kind of job counts on a node whose free CPUs cannot feed it on every GPU share
# it could use there: (CPUs free / CPUs it would need there) ** CPU_SOFTNESS (capped at 1).
# 0 is FGD's all-or-nothing host test; 0.1-0.25 measured best on the openb trace
# (default at 130%: 95.34 -> 95.83), 1 and above penalize too much.
CPU_SOFTNESS = 0.15

# When the queue says little about the workload, assume a mix of common requests.
PRIOR_SHAPES: tuple[tuple[int, float, float], ...] = (  # (GPUs, share of each, weight)
    (1, 1.0, 4.0), (1, 0.5, 2.0), (2, 1.0, 1.0), (1, 0.25, 1.0),
)


def demand_share(req: RankRequest, typical_vram_bytes: int) -> float:
    """The share of one GPU each GPU of `req` takes, as the frag model counts it."""
    if req.mode == GpuMode.SHARED and req.fraction >= 1.0 and req.vram_bytes is not None:
        return min(1.0, req.vram_bytes / max(1, typical_vram_bytes))
    return req.fraction


_JIT: list = []  # [the fragjit module, or None]: loaded at the first use, once
# Fleets of fewer nodes use the numpy forms: a pass there takes milliseconds either way, and
# a small cluster's scheduler then never loads numba (about 1 s and 110 MB the first time).
JIT_MIN_NODES = 64


def jit():
    """fragjit (compiled loops for value and value_one_gpu), or None where numba is not
    installed (the numpy forms below then)."""
    if not _JIT:
        try:
            from . import fragjit as mod
        except ImportError:
            mod = None
        _JIT.append(mod)
    return _JIT[0]


def allowed_order(allowed: np.ndarray, g_d: np.ndarray) -> np.ndarray:
    """Per GPU model (a row of `allowed`): the groups its GPUs serve, least demand first, then
    -1s. A GPU with share `lg` left counts for exactly those of them with g_d <= lg + eps: a
    prefix (the same additions as testing every group, in the same order per group)."""
    out = np.full(allowed.shape, -1, dtype=np.int64)
    for m in range(allowed.shape[0]):
        ks = np.flatnonzero(allowed[m])
        ks = ks[np.argsort(g_d[ks], kind="stable")]
        out[m, :len(ks)] = ks
    return out


_POW: list = []


def pow_table(mod) -> np.ndarray:
    """fragjit.pow_table for CPU_SOFTNESS, made once per process."""
    if not _POW:
        _POW.append(mod.pow_table(float(CPU_SOFTNESS)))
    return _POW[0]


class FragModel:
    """The workload's kinds of jobs, laid out for vectorized evaluation of V."""

    def __init__(self, fleet: Fleet, shapes: Iterable[tuple[RankRequest | tuple[RankRequest, ...], float]]) -> None:
        """`shapes`: (request, weight) pairs; a request may be a tuple of `|`-alternatives
        (one kind of job that can use any of their GPU kinds)."""
        totals = fleet.vram_total[fleet.gmodel < fleet.no_gpu]
        typical_vram = int(np.median(totals)) if totals.size else 1
        groups: dict[tuple, int] = {}
        g_n: list[int] = []
        g_d: list[float] = []
        g_allowed: list[np.ndarray] = []
        t_grp: list[int] = []
        t_cpu: list[float] = []
        t_mem: list[float] = []
        t_p: list[float] = []
        total_w = 0.0
        shapes = sorted(((sh, w) for sh, w in shapes if w > 0), key=lambda x: -x[1])
        # Like FGD's "typical pods": the most common kinds covering TYPICAL_SHARE of the weight.
        all_w = sum(w for _, w in shapes)
        kept, acc = [], 0.0
        for sh, w in shapes:
            if acc >= TYPICAL_SHARE * all_w:
                break
            kept.append((sh, w))
            acc += w
        shapes = kept
        for shape, w in shapes:
            if w <= 0:
                continue
            alts = shape if isinstance(shape, tuple) else (shape,)
            req = alts[0]
            total_w += w
            if not req.gpu_count or req.mode == GpuMode.OVERSUBSCRIBE:
                continue  # uses no GPU share: the same for every node
            d = demand_share(req, typical_vram)
            allowed = fleet.kind_match(req.vendor, req.model)
            for other in alts[1:]:
                allowed = allowed | fleet.kind_match(other.vendor, other.model)
            key = (req.gpu_count, round(d, 6), allowed.tobytes())
            gi = groups.get(key)
            if gi is None:
                gi = groups[key] = len(g_n)
                g_n.append(req.gpu_count)
                g_d.append(d)
                g_allowed.append(allowed)
            t_grp.append(gi)
            t_cpu.append(req.cpus)
            t_mem.append(float(req.mem_bytes))
            t_p.append(w)
        self.empty = not t_grp
        total_w = total_w or 1.0
        self.g_n = np.array(g_n, dtype=np.int64)
        self.g_d = np.array(g_d, dtype=np.float64)
        self.allowed = (np.stack(g_allowed, axis=1) if g_allowed
                        else np.zeros((len(fleet.kinds) + 1, 0), dtype=bool))  # (model id, group)
        self.t_grp = np.array(t_grp, dtype=np.int64)
        self.t_cpu = np.array(t_cpu, dtype=np.float64)
        self.t_mem = np.array(t_mem, dtype=np.float64)
        self.t_p = np.array(t_p, dtype=np.float64) / total_w
        # GPU share one job of each kind takes on a node (n GPUs x share of each)
        self.t_need = self.g_n[self.t_grp] * self.g_d[self.t_grp] if t_grp else np.zeros(0)
        self.t_need = np.maximum(self.t_need, EPS)
        self.t_cpu_pos = np.maximum(self.t_cpu, EPS)
        self.t_cpu_pow = np.power(self.t_cpu_pos, -CPU_SOFTNESS)
        self.g_need = np.maximum(self.g_n * self.g_d, EPS) if g_n else np.zeros(0)
        # (types, groups): each kind's popularity in its GPU group's column
        self.p_grp = np.zeros((len(t_p), len(g_n)))
        self.p_grp[np.arange(len(t_p)), self.t_grp] = self.t_p
        # The same kinds ordered by group, for per-group sums with np.add.reduceat (every
        # group has at least one kind): a dense (kinds x groups) product costs B x kinds x groups.
        o = np.argsort(self.t_grp, kind="stable")
        self.s_grp = self.t_grp[o]
        self.s_cpu = self.t_cpu[o]
        self.s_mem = self.t_mem[o]
        self.s_p = self.t_p[o]
        self.s_cpu_pow = self.t_cpu_pow[o]
        self.s_start = np.flatnonzero(np.r_[True, self.s_grp[1:] != self.s_grp[:-1]]) if t_grp else np.zeros(0, np.int64)
        self.s_ap = self.s_cpu_pow * self.s_p
        # Which kinds a node can host (CPUs and memory for one job) depends only on where its
        # free CPUs and memory fall among the kinds' distinct CPU and memory levels: a table of
        # p_m where hostable, else 0, indexed by those two level counts (when it is small).
        self.lv_cpu = np.unique(self.s_cpu)
        self.lv_mem = np.unique(self.s_mem)
        self.host_p: np.ndarray | None = None
        if (len(self.lv_cpu) + 1) * (len(self.lv_mem) + 1) * len(self.s_p) <= HOST_TABLE_MAX:
            ci = np.searchsorted(self.lv_cpu, self.s_cpu)  # level of each kind
            mi = np.searchsorted(self.lv_mem, self.s_mem)
            ok = ((np.arange(len(self.lv_cpu) + 1)[:, None, None] > ci)
                  & (np.arange(len(self.lv_mem) + 1)[None, :, None] > mi))
            self.host_p = np.where(ok, self.s_p, 0.0)
            self._host_p2 = self.host_p.reshape(-1, len(self.s_p))
        # kinds of a subset of the groups (those some node of a batch can use), by subset
        self._subsets: dict[bytes, tuple[np.ndarray, ...]] = {}
        # the model as fragjit takes it (contiguous, one dtype each: one compiled form)
        self.jit_form = jit() if fleet.n >= JIT_MIN_NODES else None
        self.jit_args: tuple = ()
        if self.jit_form is not None:
            c = np.ascontiguousarray
            self.jit_args = (c(self.allowed), allowed_order(self.allowed, self.g_d), c(self.g_d), c(self.g_n),
                             c(self.g_need, np.float64), c(self.s_start, np.int64), c(self.s_cpu), c(self.s_mem),
                             c(self.s_p), c(self.s_ap), float(CPU_SOFTNESS), pow_table(self.jit_form), float(EPS))

    def _weights(self, cpu: np.ndarray, mem: np.ndarray, free: np.ndarray,
                 active: np.ndarray | None = None) -> np.ndarray:
        """(B, groups): the popularity of the kinds of each GPU group the node can host
        (only for the `active` groups when given; 0 for the others).

        FGD's test is all or nothing (CPUs and memory for one job of the kind). Here a kind
        counts less where the free CPUs could feed fewer of its jobs than the free GPU share
        could take: (cpus / (its cpus * jobs by GPU share)) ** CPU_SOFTNESS. CPUs eaten by
        CPU-heavy jobs strand GPUs long before the last CPU is gone, and FGD sees that only
        at the cliff."""
        cpu_e = cpu + EPS
        if not len(self.s_start):
            return np.zeros((len(cpu), len(self.g_n)))
        if active is not None:
            n_act = int(np.count_nonzero(active))
            if n_act == 0:
                return np.zeros((len(cpu), len(self.g_n)))
            if 4 * n_act < 3 * len(active):
                return self._weights_of_groups(cpu_e, mem, free, active)
        if self.host_p is not None:
            hp = self.host_p[np.searchsorted(self.lv_cpu, cpu_e, side="right"),
                             np.searchsorted(self.lv_mem, mem, side="right")]  # (B, kinds)
        else:
            hp = np.where((cpu_e[:, None] >= self.s_cpu) & (mem[:, None] >= self.s_mem), self.s_p, 0.0)
        if CPU_SOFTNESS > 0:
            # p * min(1, r) ** s == min(p, p * r ** s), and r ** s factors into per-row, per-kind
            # and per-group powers: s-th powers of B CPU counts and B x groups job counts.
            jobs = np.maximum(1.0, np.floor(free[:, None] / self.g_need + 1e-9))  # (B, groups)
            y = np.power(jobs, -CPU_SOFTNESS)
            y *= np.power(cpu_e, CPU_SOFTNESS)[:, None]
            h = y[:, self.s_grp]
            h *= self.s_ap
            np.minimum(h, hp, out=h)
        else:
            h = hp
        return np.add.reduceat(h, self.s_start, axis=1)

    def _weights_of_groups(self, cpu_e: np.ndarray, mem: np.ndarray, free: np.ndarray,
                           active: np.ndarray) -> np.ndarray:
        """`_weights` for the active groups only (the same operations on fewer kinds)."""
        key = active.tobytes()
        sub = self._subsets.get(key)
        if sub is None:
            gidx = np.flatnonzero(active)
            tidx = np.flatnonzero(active[self.s_grp])
            local = np.searchsorted(gidx, self.s_grp[tidx])
            starts = np.flatnonzero(np.r_[True, local[1:] != local[:-1]])
            sub = self._subsets[key] = (gidx, tidx, local, starts, self.g_need[gidx], self.s_ap[tidx])
        gidx, tidx, local, starts, need, ap = sub
        if self.host_p is not None:
            ij = (np.searchsorted(self.lv_cpu, cpu_e, side="right") * (len(self.lv_mem) + 1)
                  + np.searchsorted(self.lv_mem, mem, side="right"))
            hp = self._host_p2[ij][:, tidx]  # rows, then columns: faster than one 2-d gather
        else:
            hp = np.where((cpu_e[:, None] >= self.s_cpu[tidx]) & (mem[:, None] >= self.s_mem[tidx]),
                          self.s_p[tidx], 0.0)
        if CPU_SOFTNESS > 0:
            jobs = np.maximum(1.0, np.floor(free[:, None] / need + 1e-9))
            y = np.power(jobs, -CPU_SOFTNESS)
            y *= np.power(cpu_e, CPU_SOFTNESS)[:, None]
            h = y[:, local]
            h *= ap
            np.minimum(h, hp, out=h)
        else:
            h = hp
        out = np.zeros((len(cpu_e), len(self.g_n)))
        out[:, gidx] = np.add.reduceat(h, starts, axis=1)
        return out

    def value(self, left: np.ndarray, gmodel: np.ndarray, cpu: np.ndarray, mem: np.ndarray) -> np.ndarray:
        """V for B node states: left (B, G) shares, gmodel (B, G), cpu (B,), mem (B,)."""
        if self.empty:
            return np.zeros(left.shape[0])
        k = self.jit_form
        if k is not None:
            return k.value(np.ascontiguousarray(left, np.float64), np.ascontiguousarray(gmodel, np.int32),
                           np.ascontiguousarray(cpu, np.float64), np.ascontiguousarray(mem, np.float64),
                           *self.jit_args)
        usable = self.allowed[gmodel] & (left[:, :, None] + EPS >= self.g_d)  # (B, G, groups)
        u = np.einsum("bg,bgk->bk", left, usable)
        gu = np.where(usable.sum(axis=1) >= self.g_n, u, 0.0)
        return np.einsum("bk,bk->b", gu, self._weights(cpu, mem, left.sum(axis=1), gu.any(axis=0)))

    def value_one_gpu(self, left: np.ndarray, gmodel: np.ndarray, share: np.ndarray | float,
                      cpu: np.ndarray, mem: np.ndarray, cand: np.ndarray) -> np.ndarray:
        """V after taking `share` (B, G; or one share for every GPU) from one GPU j of each
        node, for every candidate j (`cand`, B x G); -inf elsewhere.

        Only GPU j changes, so the sums over GPUs are updated rather than recomputed. A
        candidate GPU alike the one before it (same kind, share left and share taken) gives
        the same value, so it is skipped: the first of alike GPUs is always scored, and the
        caller takes the first best (skipping only next neighbours keeps that choice)."""
        if self.empty:
            return np.where(cand, 0.0, -np.inf)
        scalar = not isinstance(share, np.ndarray)
        k = self.jit_form
        if k is not None:
            shares = np.full(left.shape, float(share)) if scalar else np.ascontiguousarray(share, np.float64)
            return k.value_one_gpu(np.ascontiguousarray(left, np.float64), np.ascontiguousarray(gmodel, np.int32),
                                   shares, np.ascontiguousarray(cand, np.bool_), np.ascontiguousarray(cpu, np.float64),
                                   np.ascontiguousarray(mem, np.float64), *self.jit_args)
        out = np.full(left.shape, -np.inf)
        if left.shape[1] > 1:
            alike = (left[:, 1:] == left[:, :-1]) & (gmodel[:, 1:] == gmodel[:, :-1]) & cand[:, :-1]
            if not scalar:
                alike &= share[:, 1:] == share[:, :-1]
            cand = cand.copy()
            cand[:, 1:] &= ~alike
        bi, gi = np.nonzero(cand)
        if not len(bi):
            return out
        allowed = self.allowed[gmodel]  # (B, G, groups)
        old = allowed & (left[:, :, None] + EPS >= self.g_d)
        u_old = np.einsum("bg,bgk->bk", left, old)
        c_old = old.sum(axis=1)
        lj = left[bi, gi]
        aj = lj - (share if scalar else share[bi, gi])
        oj = old[bi, gi]
        nj = allowed[bi, gi] & (aj[:, None] + EPS >= self.g_d)
        u_new = u_old[bi] - lj[:, None] * oj + aj[:, None] * nj
        c_new = c_old[bi] - oj + nj
        gu = np.where(c_new >= self.g_n, u_new, 0.0)
        # a one-GPU job takes the same share whichever GPU it goes to (per-GPU only for vram=)
        free = left.sum(axis=1) - (share if scalar else share.max(axis=1))
        out[bi, gi] = np.einsum("mk,mk->m", gu, self._weights(cpu, mem, free, gu.any(axis=0))[bi])
        return out


def shapes_from_queue(reqs: Iterable[RankRequest]) -> list[tuple[RankRequest, float]]:
    """The workload as FGD sees it: the queue's requests, plus a prior of common ones."""
    counts: dict[RankRequest, float] = {}
    for r in reqs:
        counts[r] = counts.get(r, 0.0) + 1.0
    shapes = list(counts.items())
    for n, share, w in PRIOR_SHAPES:
        mode = GpuMode.SHARED if share < 1.0 else GpuMode.EXCLUSIVE
        shapes.append((RankRequest(n, share, mode, None, None, None, 0.0, 0, "prior"), w))
    return shapes

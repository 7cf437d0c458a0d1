"""The fit rules of one node, on a mutable working copy of its capacity.

This is the reference of what "fits" means (DESIGN §3, issue 3): the engine's
vectorized filters only pre-select nodes, and the final choice of GPUs on the
chosen node, plus every pending reason, comes from here.

Usable capacity is the smaller of capacity minus commitments and what telemetry
measures free, so load from outside the scheduler counts.
"""

from __future__ import annotations

from mtgpu.model.cluster import GpuView, NodeView
from mtgpu.model.gpu import model_matches
from mtgpu.model.job import GpuMode, GpuSlot, NodeAllocation
from mtgpu.model.units import format_size

from .reasons import gpu_capacity_reason
from .request import EPS, RankRequest


class GpuState:
    """A GPU's capacity during one pass; changes as the pass places jobs."""

    __slots__ = (
        "index", "vendor", "model", "total", "used", "util",
        "frac", "cvram", "exclusive", "shared_jobs", "over",
    )

    def __init__(self, g: GpuView) -> None:
        self.index = g.index
        self.vendor = g.vendor
        self.model = g.model
        self.total = int(g.vram_total_bytes)
        self.used = int(g.vram_used_measured_bytes)
        self.util = float(g.utilization_pct)
        self.frac = float(g.committed_fraction)
        self.cvram = int(g.committed_vram_bytes)
        self.exclusive = bool(g.exclusive)
        self.shared_jobs = int(g.shared_jobs)
        self.over = int(g.oversubscribed_jobs)

    @property
    def idle(self) -> bool:
        """Free for an exclusive job: nothing committed, nobody oversubscribed."""
        return (not self.exclusive and self.frac <= EPS and self.cvram == 0
                and self.shared_jobs == 0 and self.over == 0)

    @property
    def measured_free(self) -> int:
        return max(0, self.total - self.used)

    @property
    def shared_free(self) -> int:
        """VRAM a new shared job can be guaranteed here: min(uncommitted, measured free)."""
        return max(0, min(self.total - self.cvram, self.total - self.used))

    def matches(self, req: RankRequest) -> bool:
        if req.vendor is not None and self.vendor != req.vendor:
            return False
        return req.model is None or model_matches(req.model, self.model)

    def admits(self, req: RankRequest) -> bool:
        """True when one GPU slot of `req` fits on this GPU now (model already matched)."""
        mode = req.mode
        if mode == GpuMode.EXCLUSIVE:
            if not self.idle:
                return False
            v = req.vram_bytes
            return v is None or (self.total >= v and self.total - self.used >= v)
        if self.exclusive:
            return False
        if mode == GpuMode.SHARED:
            # A whole GPU, shared, no vram=: the whole device and a share of 1, so nothing may be
            # committed or measured there (an oversubscribed job commits nothing, as for any share).
            need = req.shared_vram_bytes(self.total)
            if self.cvram + need > self.total or self.total - self.used < need:
                return False
            return self.frac + req.shared_share(self.total) <= 1.0 + EPS
        # oversubscribe: no guarantee; vram= still asks for that much measured free memory
        v = req.vram_bytes
        return v is None or self.total - self.used >= v

    def slot(self, req: RankRequest) -> GpuSlot:
        if req.mode == GpuMode.EXCLUSIVE:
            return GpuSlot(self.index, 1.0, self.total, GpuMode.EXCLUSIVE)
        if req.mode == GpuMode.SHARED:
            return GpuSlot(self.index, req.shared_share(self.total), req.shared_vram_bytes(self.total), GpuMode.SHARED)
        # Oversubscribed slots carry no guaranteed share and no reserved VRAM.
        return GpuSlot(self.index, 0.0, 0, GpuMode.OVERSUBSCRIBE)

    def take(self, s: GpuSlot) -> None:
        if s.mode == GpuMode.EXCLUSIVE:
            self.exclusive = True
            self.frac = 1.0
            self.cvram = self.total
            self.used = max(self.used, self.total)
        elif s.mode == GpuMode.SHARED:
            self.frac += s.fraction
            self.cvram += s.vram_bytes
            self.used += s.vram_bytes  # not measured yet: count it as used within the pass
            self.shared_jobs += 1
        else:
            self.over += 1

    def give_back(self, s: GpuSlot) -> None:
        """Undo `take` (a running job ending), for backfill's look ahead."""
        if s.mode == GpuMode.EXCLUSIVE:
            self.exclusive = False
            self.frac = max(0.0, self.frac - 1.0)
            self.cvram = 0
            self.used = max(0, self.used - self.total)
        elif s.mode == GpuMode.SHARED:
            self.frac = max(0.0, self.frac - s.fraction)
            self.cvram = max(0, self.cvram - s.vram_bytes)
            self.used = max(0, self.used - s.vram_bytes)
            self.shared_jobs = max(0, self.shared_jobs - 1)
        else:
            self.over = max(0, self.over - 1)

    def copy(self) -> "GpuState":
        c = object.__new__(GpuState)
        for k in GpuState.__slots__:
            setattr(c, k, getattr(self, k))
        return c


class NodeState:
    """A node's capacity during one pass (a working copy of a NodeView)."""

    __slots__ = ("name", "gpus", "cpus_total", "cpus_free", "mem_total", "mem_free", "mem_measured",
                 "schedulable", "unschedulable_reason", "_by_index")

    def __init__(self, n: NodeView) -> None:
        self.name = n.name
        self.gpus = [GpuState(g) for g in n.gpus]
        self._by_index = {g.index: g for g in self.gpus}
        self.cpus_total = float(n.cpus_total)
        self.cpus_free = float(n.cpus_total) - float(n.cpus_committed)
        self.mem_total = int(n.mem_total_bytes)
        self.mem_free = int(n.mem_total_bytes) - int(n.mem_committed_bytes)
        self.mem_measured = None if n.mem_available_measured_bytes is None else int(n.mem_available_measured_bytes)
        self.schedulable = bool(n.schedulable)
        self.unschedulable_reason = n.unschedulable_reason

    @property
    def mem_usable(self) -> int:
        if self.mem_measured is None:
            return self.mem_free
        return min(self.mem_free, self.mem_measured)

    def host_fits(self, req: RankRequest) -> bool:
        if req.cpus > 0 and self.cpus_free + EPS < req.cpus:
            return False
        if req.mem_bytes > 0 and self.mem_usable < req.mem_bytes:
            return False
        return True

    def choose_gpus(self, req: RankRequest) -> list[GpuState] | None:
        """The GPUs this node would give `req` now, or None.

        Within the node: exclusive takes the least-loaded idle GPUs; shared takes the
        GPUs its share fills most (best fit, so whole GPUs stay whole); oversubscribe
        takes the least-utilized."""
        fitting = [g for g in self.gpus if g.matches(req) and g.admits(req)]
        if len(fitting) < req.gpu_count:
            return None
        if req.mode == GpuMode.EXCLUSIVE:
            fitting.sort(key=lambda g: (g.used, g.index))
        elif req.mode == GpuMode.SHARED:
            fitting.sort(key=lambda g: (1.0 - g.frac - req.shared_share(g.total), g.index))
        else:
            fitting.sort(key=lambda g: (g.util, g.used, g.over, g.index))
        return fitting[: req.gpu_count]

    def fit(self, req: RankRequest) -> NodeAllocation | None:
        """The allocation this node would give one rank of `req` now, or None."""
        if not self.schedulable or not self.host_fits(req):
            return None
        slots: tuple[GpuSlot, ...] = ()
        vendor = None
        if req.gpu_count:
            chosen = self.choose_gpus(req)
            if chosen is None:
                return None
            slots = tuple(g.slot(req) for g in chosen)
            vendor = chosen[0].vendor
        return NodeAllocation(self.name, slots, req.cpus, req.mem_bytes, vendor)

    def take(self, alloc: NodeAllocation) -> None:
        self.cpus_free -= alloc.cpus
        self.mem_free -= alloc.mem_bytes
        if self.mem_measured is not None:
            self.mem_measured -= alloc.mem_bytes
        for s in alloc.gpus:
            self._by_index[s.index].take(s)

    def give_back(self, alloc: NodeAllocation) -> None:
        """Undo `take` (a running job ending), for backfill's look ahead."""
        self.cpus_free = min(self.cpus_total, self.cpus_free + alloc.cpus)
        self.mem_free = min(self.mem_total, self.mem_free + alloc.mem_bytes)
        if self.mem_measured is not None:
            self.mem_measured += alloc.mem_bytes
        for s in alloc.gpus:
            g = self._by_index.get(s.index)
            if g is not None:
                g.give_back(s)

    def copy(self) -> "NodeState":
        c = object.__new__(NodeState)
        for k in NodeState.__slots__:
            setattr(c, k, getattr(self, k))
        c.gpus = [g.copy() for g in self.gpus]
        c._by_index = {g.index: g for g in c.gpus}
        return c

    # ---- reasons -------------------------------------------------------------

    def why_not(self, req: RankRequest) -> str:
        """Why one rank of `req` does not fit here now (call only when fit() is None)."""
        if not self.schedulable:
            return self.unschedulable_reason or "not schedulable"
        if req.cpus > 0 and self.cpus_free + EPS < req.cpus:
            return f"not enough free CPUs ({_num(max(0.0, self.cpus_free))} < {_num(req.cpus)})"
        if req.mem_bytes > 0 and self.mem_usable < req.mem_bytes:
            return f"not enough free memory ({format_size(max(0, self.mem_usable))} < {format_size(req.mem_bytes)})"
        if not req.gpu_count:
            return "does not fit"
        return gpu_shortfall(self.gpus, req)


def gpu_shortfall(gpus: list[GpuState], req: RankRequest) -> str:
    """The named reason these GPUs cannot take `req` now."""
    kind = req.kind()
    if not gpus:
        return "no GPU (CPU-only node)"
    matching = [g for g in gpus if g.matches(req)]
    why = gpu_capacity_reason(kind, req.model, req.vendor, [g.total for g in matching], req.gpu_count, req.vram_bytes)
    if why:
        return why
    v = req.vram_bytes
    fitting = sum(1 for g in matching if g.admits(req))
    if req.mode == GpuMode.EXCLUSIVE:
        idle = [g for g in matching if g.idle]
        if v is not None and len(idle) >= req.gpu_count:
            best = max(g.measured_free for g in idle)
            return f"not enough free VRAM on any idle {kind} ({format_size(best)} < {format_size(v)})"
        n_idle = len(idle)
        if n_idle == 0:
            return f"no idle {kind}"
        return f"only {n_idle} idle {kind} ({req.gpu_count} asked)"
    if req.mode == GpuMode.SHARED:
        open_gpus = [g for g in matching if not g.exclusive]
        if not open_gpus:
            return f"every {kind} is held exclusively"
        if req.fraction >= 1.0 and req.vram_bytes is None:
            return f"no unshared {kind} ({fitting} of {req.gpu_count} asked)"
        best = max(open_gpus, key=lambda g: g.shared_free)
        need = req.shared_vram_bytes(best.total)
        if fitting == 0 and best.shared_free < need:
            return f"not enough free VRAM on any {kind} ({format_size(best.shared_free)} < {format_size(need)})"
        if fitting == 0:
            return f"no {kind} has {req.shared_share(best.total):g} of its share left"
        return f"only {fitting} {kind} with room ({req.gpu_count} asked)"
    if fitting == 0 and all(g.exclusive for g in matching):
        return f"every {kind} is held exclusively"
    if v is not None and fitting < req.gpu_count:
        best = max(g.measured_free for g in matching)
        return f"not enough free VRAM on any {kind} ({format_size(best)} < {format_size(v)})"
    return f"only {fitting} {kind} not held exclusively ({req.gpu_count} asked)"


def _num(x: float) -> str:
    return f"{x:g}"

"""One rank's request, resolved from a JobSpec alternative: what the fit rules test.

A `JobSpec` says what the tenant typed; a `RankRequest` is the per-node demand of
one `|`-alternative with the mode and the VRAM rule already decided, so that the
fit code never re-derives them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mtgpu.model.job import GpuAlternative, GpuMode, JobSpec

EPS = 1e-9


@dataclass(frozen=True, slots=True)
class RankRequest:
    """What one rank of a job needs from one node.

    gpu_count: whole GPUs wanted (1 for a fractional request, 0 for CPU-only).
    fraction: the share of each GPU (1.0 for whole GPUs, f < 1 for `t4:0.25`).
    vram_bytes: `vram=` as typed (None when not asked)."""

    gpu_count: int
    fraction: float
    mode: GpuMode
    vendor: str | None
    model: str | None
    vram_bytes: int | None
    cpus: float
    mem_bytes: int
    label: str  # the alternative as typed, for messages ("rtx4090:1")
    # the hash, computed once: requests key the engine's caches, looked up several times per
    # job, and a field-by-field hash (GpuMode's is a python function) was a visible share of a pass
    _hash: int = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.gpu_count, self.fraction, self.mode, self.vendor, self.model,
                                                self.vram_bytes, self.cpus, self.mem_bytes, self.label)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def wants_gpu(self) -> bool:
        return self.gpu_count > 0

    def kind(self) -> str:
        """How messages name the GPUs asked for: the model, the vendor, or "GPU"."""
        return self.model or self.vendor or "GPU"

    def shared_vram_bytes(self, vram_total_bytes: int) -> int:
        """VRAM reserved per GPU in `shared` mode on a device of this size.

        `vram=` when given; else a fraction f is guaranteed f of the device's memory;
        else (a whole GPU in shared mode with no `vram=`) the whole device, which
        makes it fit like an exclusive request while still being a shared slot."""
        if self.vram_bytes is not None:
            return self.vram_bytes
        if self.fraction < 1.0:
            return int(self.fraction * vram_total_bytes)
        return vram_total_bytes

    def shared_share(self, vram_total_bytes: int) -> float:
        """The share of the GPU a shared slot counts for (sum of shares <= 1).

        A fraction counts as itself; a whole-GPU shared request counts as the share of
        memory it reserves, so two `gpus=1 gpu-mode=shared vram=10G` jobs fit a 24G GPU."""
        if self.fraction < 1.0:
            return self.fraction
        if vram_total_bytes <= 0:
            return 1.0
        return min(1.0, self.shared_vram_bytes(vram_total_bytes) / vram_total_bytes)


def rank_requests(spec: JobSpec) -> list[RankRequest]:
    """One RankRequest per `|`-alternative (a single CPU-only one when no GPU is asked)."""
    cpus = float(spec.cpus or 0.0)
    mem = int(spec.mem_bytes or 0)
    if not spec.gpus:
        return [RankRequest(0, 1.0, spec.gpu_mode, None, None, None, cpus, mem, "cpu-only")]
    return [_from_alternative(alt, spec, cpus, mem) for alt in spec.gpus]


def _from_alternative(alt: GpuAlternative, spec: JobSpec, cpus: float, mem: int) -> RankRequest:
    if alt.count <= 0:
        return RankRequest(0, 1.0, spec.gpu_mode, None, None, None, cpus, mem, "cpu-only")
    if alt.fractional:
        # A fraction implies shared; an explicit oversubscribe stays oversubscribe.
        mode = GpuMode.OVERSUBSCRIBE if spec.gpu_mode == GpuMode.OVERSUBSCRIBE else GpuMode.SHARED
        return RankRequest(1, float(alt.count), mode, alt.vendor, alt.model, spec.vram_bytes, cpus, mem, alt.label())
    count = int(round(alt.count)) if abs(alt.count - round(alt.count)) < EPS else int(alt.count) + 1
    return RankRequest(count, 1.0, spec.gpu_mode, alt.vendor, alt.model, spec.vram_bytes, cpus, mem, alt.label())

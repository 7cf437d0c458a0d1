"""GPU inventory and telemetry as every backend reports it (real or simulated)."""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass, field, fields

VENDORS = ("nvidia", "amd", "intel")

# The environment variables that limit which GPUs a process sees, by vendor.
VISIBILITY_VARS: dict[str, tuple[str, ...]] = {
    "nvidia": ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"),
    "amd": ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"),
    "intel": ("ZE_AFFINITY_MASK",),
}

# Words that marketing puts in front of a model and users leave out.
_NOISE_WORDS = ("nvidia", "geforce", "tesla", "quadro", "amd", "radeon", "instinct", "intel", "data", "center", "gpu")


@functools.lru_cache(maxsize=4096)  # a pass normalizes every GPU's model: a few names, thousands of GPUs
def normalize_model(name: str) -> str:
    """The comparable form of a model name: "NVIDIA GeForce RTX 4090" -> "rtx4090",
    "NVIDIA H200" -> "h200", "A100-SXM4-80GB" -> "a100sxm480gb"."""
    words = re.split(r"[^a-z0-9]+", name.lower())
    kept = [w for w in words if w and w not in _NOISE_WORDS]
    return "".join(kept)


def model_matches(requested: str, gpu_model: str) -> bool:
    """True when a requested (normalized) model names this GPU's (normalized) model.

    A request is a prefix of the GPU's model that does not stop inside a number:
    "a100" matches "a100sxm480gb" but "a10" does not match "a100"."""
    if requested == gpu_model:
        return True
    if not gpu_model.startswith(requested):
        return False
    nxt = gpu_model[len(requested)]
    return not (requested[-1:].isdigit() and nxt.isdigit())


@dataclass(slots=True)
class GpuProcess:
    pid: int
    used_vram_bytes: int
    name: str = ""


@dataclass(slots=True)
class GpuInfo:
    """One GPU as measured now."""

    index: int
    vendor: str
    model: str
    vram_total_bytes: int
    vram_used_bytes: int = 0
    utilization_pct: float = 0.0
    uuid: str = ""
    processes: list[GpuProcess] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GpuInfo":
        if d.keys() == _GPU_KEYS and not d["processes"]:
            # what a member sends each second for each GPU (and what to_dict writes): by
            # position, a third of the keyword call's time; other dicts as before
            return cls(d["index"], d["vendor"], d["model"], d["vram_total_bytes"], d["vram_used_bytes"],
                       d["utilization_pct"], d["uuid"], [])
        if d.get("processes"):
            d = {**d, "processes": [GpuProcess(**p) for p in d["processes"]]}
        return cls(**d)


_GPU_KEYS = frozenset(f.name for f in fields(GpuInfo))


@dataclass(slots=True)
class HostInfo:
    """The host's CPU and memory, as measured now."""

    cpu_count: int
    cpu_util_pct: float
    mem_total_bytes: int
    mem_available_bytes: int

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "HostInfo":
        return cls(**d)

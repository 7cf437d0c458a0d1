"""GPU and host telemetry: one backend per node, chosen by GPU_BACKEND."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from mtgpu.agent.telemetry import amd, intel, nvml
from mtgpu.agent.telemetry.base import GpuBackend, NoGpuBackend, TelemetryError
from mtgpu.agent.telemetry.simulated import SimulatedBackend, default_override_path, write_simulated_load

__all__ = [
    "GpuBackend",
    "NoGpuBackend",
    "SimulatedBackend",
    "TelemetryError",
    "BACKEND_KINDS",
    "open_backend",
    "write_simulated_load",
    "default_override_path",
]

log = logging.getLogger(__name__)

BACKEND_KINDS = ("auto", "nvml", "amd", "intel", "simulated")

# kind -> (its name for people, why it cannot work here or None, how to open it, the fix).
# Looked up through the modules at call time, so tests can stand in for the hardware.
_REAL: dict[str, tuple[str, Callable[[], str | None], Callable[[], GpuBackend], str]] = {
    "nvml": ("NVIDIA NVML", lambda: nvml.unavailable_reason(), lambda: nvml.NvmlBackend(), "install the NVIDIA driver"),
    "amd": ("AMD SMI", lambda: amd.unavailable_reason(), lambda: amd.AmdSmiBackend(), "install ROCm with its amdsmi Python module"),
    "intel": ("Intel xpu-smi/sysfs", lambda: intel.unavailable_reason(), lambda: intel.IntelBackend(), "install xpu-smi or the xe driver"),
}


def open_backend(kind: str, simulated_gpus: list[dict], state_dir: Path, seed: str) -> GpuBackend:
    """The GPU backend GPU_BACKEND names. "auto" takes the first of NVML, AMD SMI and Intel
    that sees a GPU, else a CPU-only backend; a vendor named explicitly must work, or
    TelemetryError says so. `seed` (e.g. the node name) makes simulated uuids unique."""
    if kind == "simulated":
        return SimulatedBackend(simulated_gpus, override_path=default_override_path(state_dir), seed=seed)
    if kind == "auto":
        for name, (label, unavailable_reason, backend_cls, _fix) in _REAL.items():
            reason = unavailable_reason()
            if reason is not None:
                log.debug("GPU_BACKEND auto: %s not used: %s", label, reason)
                continue
            try:
                backend = backend_cls()
            except TelemetryError as e:
                log.warning("GPU_BACKEND auto: %s looked usable but did not open: %s", label, e)
                continue
            log.info("GPU_BACKEND auto: using %s (%s)", label, name)
            return backend
        log.info("GPU_BACKEND auto: no GPU found; this node is CPU-only")
        return NoGpuBackend()
    if kind in _REAL:
        label, unavailable_reason, backend_cls, fix = _REAL[kind]
        reason = unavailable_reason()
        if reason is None:
            try:
                return backend_cls()
            except TelemetryError as e:
                reason = str(e)
        raise TelemetryError(
            f"GPU_BACKEND = {kind!r} but {label} is not usable on this machine: {reason}. "
            f"Fix: {fix}, or set GPU_BACKEND = \"auto\" (uses whatever GPUs are present; none is fine)."
        )
    raise TelemetryError(f"GPU_BACKEND = {kind!r} is not a GPU backend; allowed: {', '.join(BACKEND_KINDS)}")

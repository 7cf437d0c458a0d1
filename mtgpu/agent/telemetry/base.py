"""The contract every GPU telemetry backend keeps, so the agent cannot tell them apart."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from mtgpu.model.gpu import GpuInfo


class TelemetryError(Exception):
    """A backend cannot be opened or used; the message names the setting, the value and the fix."""


@runtime_checkable
class GpuBackend(Protocol):
    """Measures this node's GPUs. `sample` is called about once a second, so it must be cheap;
    `close` releases the vendor library."""

    name: str  # "nvml", "amd", "intel", "simulated" or "none"

    def sample(self) -> list[GpuInfo]: ...

    def close(self) -> None: ...


class NoGpuBackend:
    """A CPU-only node: no GPUs, nothing to measure."""

    name = "none"

    def sample(self) -> list[GpuInfo]:
        return []

    def close(self) -> None:
        pass

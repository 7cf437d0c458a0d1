"""NVIDIA GPUs through NVML (the `pynvml` module of nvidia-ml-py).

Static facts (name, uuid) are read once when the backend opens; each sample asks
NVML for memory, utilization and the compute and graphics processes. A field a GPU
does not support (or that the agent may not read) is reported as zero/empty; a GPU
that fails outright (fell off the bus) is left out of the sample, with a warning.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any, Callable

import pynvml

from mtgpu.agent.telemetry.base import TelemetryError
from mtgpu.model.gpu import GpuInfo, GpuProcess

log = logging.getLogger(__name__)


def unavailable_reason(nvml: ModuleType | Any = pynvml) -> str | None:
    """Why NVML cannot be used here, or None when it can (initializes and sees a GPU)."""
    try:
        nvml.nvmlInit()
    except (nvml.NVMLError, OSError) as e:
        return f"NVML did not initialize ({e}): no NVIDIA driver is loaded"
    try:
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as e:
        return f"NVML could not count GPUs ({e})"
    finally:
        _shutdown_quietly(nvml)
    return None if count > 0 else "NVML sees no NVIDIA GPU"


def available(nvml: ModuleType | Any = pynvml) -> bool:
    """True when NVML initializes and sees at least one GPU."""
    return unavailable_reason(nvml) is None


def _shutdown_quietly(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - nothing useful to do when shutdown fails
        pass


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class NvmlBackend:
    """Samples every GPU NVML sees, by NVML index."""

    name = "nvml"

    def __init__(self, nvml: ModuleType | Any = pynvml) -> None:
        self._nvml = nvml
        # Fields some GPUs or containers cannot give: reported as zero/empty, never fatal.
        self._unsupported: tuple[type[BaseException], ...] = (nvml.NVMLError_NotSupported, nvml.NVMLError_NoPermission)
        try:
            nvml.nvmlInit()
        except (nvml.NVMLError, OSError) as e:
            raise TelemetryError(f"NVML did not initialize ({e}): no NVIDIA driver is loaded") from e
        self._open = True
        try:
            count = nvml.nvmlDeviceGetCount()
            self._devices: list[tuple[int, Any, str, str]] = []
            for index in range(count):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                model = _text(nvml.nvmlDeviceGetName(handle))
                uuid = _text(self._field(nvml.nvmlDeviceGetUUID, handle, default=""))
                self._devices.append((index, handle, model, uuid))
        except nvml.NVMLError as e:
            self.close()
            raise TelemetryError(f"NVML could not list the GPUs ({e})") from e
        self._failing: set[int] = set()

    def device_nodes(self) -> dict[int, str]:
        """Each GPU's device node by NVML index: /dev/nvidiaN with N its minor number as NVML
        reports it (not always the index); the index where NVML cannot say."""
        out = {}
        get_minor = getattr(self._nvml, "nvmlDeviceGetMinorNumber", None)
        for index, handle, _model, _uuid in self._devices:
            minor = None
            if get_minor is not None:
                try:
                    minor = int(get_minor(handle))
                except (self._nvml.NVMLError, TypeError, ValueError):
                    minor = None
            out[index] = f"/dev/nvidia{index if minor is None else minor}"
        return out

    def _field(self, fn: Callable[..., Any], *args: Any, default: Any) -> Any:
        try:
            return fn(*args)
        except self._unsupported:
            return default

    def sample(self) -> list[GpuInfo]:
        out: list[GpuInfo] = []
        for index, handle, model, uuid in self._devices:
            try:
                out.append(self._sample_device(index, handle, model, uuid))
            except self._nvml.NVMLError as e:
                if index not in self._failing:
                    log.warning("NVML GPU %d (%s) could not be read and is left out: %s", index, uuid, e)
                    self._failing.add(index)
                continue
            if index in self._failing:
                log.warning("NVML GPU %d (%s) can be read again", index, uuid)
                self._failing.discard(index)
        return out

    def _sample_device(self, index: int, handle: Any, model: str, uuid: str) -> GpuInfo:
        nvml = self._nvml
        mem = self._field(nvml.nvmlDeviceGetMemoryInfo, handle, default=None)
        util = self._field(nvml.nvmlDeviceGetUtilizationRates, handle, default=None)
        return GpuInfo(
            index=index,
            vendor="nvidia",
            model=model,
            uuid=uuid,
            vram_total_bytes=int(mem.total) if mem is not None else 0,
            vram_used_bytes=int(mem.used) if mem is not None else 0,
            utilization_pct=float(util.gpu) if util is not None else 0.0,
            processes=self._processes(handle),
        )

    def _processes(self, handle: Any) -> list[GpuProcess]:
        nvml = self._nvml
        used_by_pid: dict[int, int] = {}
        for fn in (nvml.nvmlDeviceGetComputeRunningProcesses, nvml.nvmlDeviceGetGraphicsRunningProcesses):
            for p in self._field(fn, handle, default=[]):
                used = int(p.usedGpuMemory or 0)  # None when the driver cannot tell (e.g. Windows WDDM, MIG)
                # A process doing both compute and graphics is listed twice: count it once.
                used_by_pid[int(p.pid)] = max(used, used_by_pid.get(int(p.pid), 0))
        return [GpuProcess(pid=pid, used_vram_bytes=used, name=self._process_name(pid)) for pid, used in used_by_pid.items()]

    def _process_name(self, pid: int) -> str:
        try:
            return _text(self._nvml.nvmlSystemGetProcessName(pid))
        except self._nvml.NVMLError:
            return ""  # the process ended between listing and naming, or is not ours to see

    def close(self) -> None:
        if self._open:
            self._open = False
            _shutdown_quietly(self._nvml)

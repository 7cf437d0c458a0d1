"""AMD GPUs through AMD SMI (the `amdsmi` Python module shipped with ROCm).

Per GPU, in `amdsmi_get_processor_handles` order (our index): the model from
`amdsmi_get_gpu_asic_info()["market_name"]`, the uuid from `amdsmi_get_gpu_device_uuid`
and the PCI address from `amdsmi_get_gpu_device_bdf` ("0000:c1:00.0": it finds the GPU's
DRM nodes for fencing, drm.py), read once; then per sample the VRAM from
`amdsmi_get_gpu_vram_usage` (reported in MiB), utilization from
`amdsmi_get_gpu_activity()["gfx_activity"]` and processes from
`amdsmi_get_gpu_process_list` (dicts since ROCm 6.1; older releases return handles
that `amdsmi_get_gpu_process_info` resolves). A field the GPU does not support reads
as zero/empty.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any, Callable

from mtgpu.agent.telemetry import drm
from mtgpu.agent.telemetry.base import TelemetryError
from mtgpu.model.gpu import GpuInfo, GpuProcess

log = logging.getLogger(__name__)

_MIB = 1024 * 1024


def _import_amdsmi() -> Any:
    return importlib.import_module("amdsmi")


def unavailable_reason(amdsmi: Any | None = None) -> str | None:
    """Why AMD SMI cannot be used here, or None when it can (imports, initializes, sees a GPU)."""
    try:
        smi = amdsmi if amdsmi is not None else _import_amdsmi()
    except ImportError as e:
        return f"the amdsmi Python module is not installed ({e})"
    try:
        smi.amdsmi_init()
    except Exception as e:  # noqa: BLE001 - amdsmi raises its own exception types, and OSError without a driver
        return f"AMD SMI did not initialize ({e}): the amdgpu driver is not loaded"
    try:
        handles = smi.amdsmi_get_processor_handles()
    except Exception as e:  # noqa: BLE001
        return f"AMD SMI could not list GPUs ({e})"
    finally:
        _shutdown_quietly(smi)
    return None if handles else "AMD SMI sees no AMD GPU"


def available(amdsmi: Any | None = None) -> bool:
    """True when amdsmi imports, initializes and sees at least one GPU; False when it is not installed."""
    return unavailable_reason(amdsmi) is None


def _shutdown_quietly(smi: Any) -> None:
    try:
        smi.amdsmi_shut_down()
    except Exception:  # noqa: BLE001
        pass


def _number(value: Any) -> float:
    """AMD SMI writes "N/A" for values it does not have."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


class AmdSmiBackend:
    """Samples every GPU AMD SMI sees."""

    name = "amd"

    def __init__(self, amdsmi: Any | None = None) -> None:
        try:
            smi = amdsmi if amdsmi is not None else _import_amdsmi()
        except ImportError as e:
            raise TelemetryError(f"the amdsmi Python module is not installed ({e})") from e
        self._smi = smi
        self._error: type[BaseException] = getattr(smi, "AmdSmiException", Exception)
        try:
            smi.amdsmi_init()
        except Exception as e:  # noqa: BLE001
            raise TelemetryError(f"AMD SMI did not initialize ({e}): the amdgpu driver is not loaded") from e
        self._open = True
        self._warned: set[str] = set()
        get_bdf = getattr(smi, "amdsmi_get_gpu_device_bdf", None)
        try:
            self._devices: list[tuple[int, Any, str, str]] = []
            self._pci: dict[int, str | None] = {}  # GPU index -> its PCI address as AMD SMI prints it
            for index, handle in enumerate(smi.amdsmi_get_processor_handles()):
                asic = self._field("asic_info", smi.amdsmi_get_gpu_asic_info, handle, default={})
                model = str(asic.get("market_name") or "AMD GPU")
                uuid = str(self._field("uuid", smi.amdsmi_get_gpu_device_uuid, handle, default=""))
                self._devices.append((index, handle, model, uuid))
                self._pci[index] = str(self._field("PCI address", get_bdf, handle, default="")) if get_bdf else None
        except self._error as e:
            self.close()
            raise TelemetryError(f"AMD SMI could not list the GPUs ({e})") from e

    def device_nodes(self, sys_root: Path = drm.SYS_ROOT, dev_root: Path = drm.DEV_ROOT) -> dict[int, tuple[str, ...]]:
        """Each GPU's DRM nodes by index (/dev/dri/cardN and /dev/dri/renderDN of its PCI
        device): a job that was not given the GPU is denied them. /dev/kfd is not among them:
        it serves every GPU, and the KFD driver itself refuses a GPU whose render node the
        job's device cgroup denies. GPUs whose nodes cannot be found are left out (drm.py)."""
        return drm.nodes_by_gpu(self._pci, "AMD SMI (amdsmi_get_gpu_device_bdf)", sys_root, dev_root)

    def _field(self, what: str, fn: Callable[..., Any], *args: Any, default: Any) -> Any:
        try:
            return fn(*args)
        except self._error as e:
            if what not in self._warned:
                self._warned.add(what)
                log.warning("AMD SMI cannot read %s (reported as empty from now on): %s", what, e)
            return default

    def sample(self) -> list[GpuInfo]:
        return [self._sample_device(index, handle, model, uuid) for index, handle, model, uuid in self._devices]

    def _sample_device(self, index: int, handle: Any, model: str, uuid: str) -> GpuInfo:
        smi = self._smi
        vram = self._field("vram usage", smi.amdsmi_get_gpu_vram_usage, handle, default={})
        activity = self._field("activity", smi.amdsmi_get_gpu_activity, handle, default={})
        return GpuInfo(
            index=index,
            vendor="amd",
            model=model,
            uuid=uuid,
            vram_total_bytes=int(_number(vram.get("vram_total")) * _MIB),
            vram_used_bytes=int(_number(vram.get("vram_used")) * _MIB),
            utilization_pct=_number(activity.get("gfx_activity")),
            processes=self._processes(handle),
        )

    def _processes(self, handle: Any) -> list[GpuProcess]:
        smi = self._smi
        out: list[GpuProcess] = []
        for entry in self._field("process list", smi.amdsmi_get_gpu_process_list, handle, default=[]):
            info = entry if isinstance(entry, dict) else self._field(
                "process info", smi.amdsmi_get_gpu_process_info, handle, entry, default=None
            )
            if not info:
                continue
            usage = info.get("memory_usage") or {}
            used = usage.get("vram_mem", info.get("mem", 0))
            name = str(info.get("name") or "")
            out.append(GpuProcess(pid=int(info["pid"]), used_vram_bytes=int(_number(used)), name="" if name == "N/A" else name))
        return out

    def close(self) -> None:
        if self._open:
            self._open = False
            _shutdown_quietly(self._smi)

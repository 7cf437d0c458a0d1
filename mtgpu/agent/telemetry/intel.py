"""Intel discrete GPUs, through `xpu-smi` when it is installed, else the `xe` driver's sysfs.

With xpu-smi: `xpu-smi discovery -j` once at open (device_id, device_name, uuid,
pci_bdf_address, memory_physical_size_byte; `discovery -d ID -j` when the list lacks the
size), then `xpu-smi stats -d ID -j` for XPUM_STATS_MEMORY_USED (MiB) and
XPUM_STATS_GPU_UTILIZATION (%). xpu-smi is a process start per device, so stats are
refreshed at most every `stats_interval_s` and reused in between.

Without it: every /sys/class/drm/cardN whose device/vendor is 0x8086 and that has
local memory (device/tileT[/memory]/physical_vram_size_bytes, summed over tiles;
integrated GPUs have none and are skipped). sysfs gives only the inventory: used
VRAM, utilization and processes read as zero/empty.

Either way each GPU's PCI address is kept (xpu-smi's pci_bdf_address, or the card's
device/uevent PCI_SLOT_NAME): `device_nodes` finds its DRM nodes from it (drm.py).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from mtgpu.agent.telemetry import drm
from mtgpu.agent.telemetry.base import TelemetryError
from mtgpu.model.gpu import GpuInfo

log = logging.getLogger(__name__)

_MIB = 1024 * 1024
SYSFS_DRM = Path("/sys/class/drm")
_INTEL_PCI_VENDOR = "0x8086"

Runner = Callable[[list[str]], str]


def _run_xpu_smi(args: list[str]) -> str:
    done = subprocess.run(["xpu-smi", *args], capture_output=True, text=True, timeout=10, check=False)
    if done.returncode != 0:
        raise TelemetryError(f"xpu-smi {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip(), 0)
    except (OSError, ValueError):
        return None


def sysfs_cards(drm_root: Path = SYSFS_DRM) -> list[tuple[str, str, int]]:
    """(card name, PCI device id, local memory bytes) of each Intel GPU with local memory."""
    cards = []
    for card in sorted(drm_root.glob("card[0-9]*"), key=lambda p: int(re.sub(r"\D", "", p.name) or 0)):
        if "-" in card.name:  # connectors such as card0-DP-1
            continue
        device = card / "device"
        try:
            if (device / "vendor").read_text().strip() != _INTEL_PCI_VENDOR:
                continue
            device_id = (device / "device").read_text().strip()
        except OSError:
            continue
        tiles = sorted(device.glob("tile[0-9]*"))
        vram = sum(
            _read_int(t / "memory" / "physical_vram_size_bytes") or _read_int(t / "physical_vram_size_bytes") or 0
            for t in tiles
        )
        if vram > 0:
            cards.append((card.name, device_id, vram))
    return cards


def unavailable_reason(drm_root: Path = SYSFS_DRM) -> str | None:
    """Why no Intel GPU can be measured here, or None when one can."""
    if shutil.which("xpu-smi") or sysfs_cards(drm_root):
        return None
    return "neither xpu-smi nor an Intel GPU with local memory (xe driver sysfs) is present"


def available(drm_root: Path = SYSFS_DRM) -> bool:
    """False when neither xpu-smi nor an Intel discrete GPU in sysfs is present."""
    return unavailable_reason(drm_root) is None


class IntelBackend:
    """Intel GPUs by xpu-smi device id (xpu-smi) or by sysfs card order (sysfs)."""

    name = "intel"

    def __init__(
        self,
        run: Runner | None = None,
        drm_root: Path = SYSFS_DRM,
        stats_interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._run = run if run is not None else (_run_xpu_smi if shutil.which("xpu-smi") else None)
        self._interval_s = stats_interval_s
        self._clock = clock
        self._stats: dict[int, tuple[int, float]] = {}  # device id -> (used bytes, utilization %)
        self._stats_at: float | None = None
        self._pci: dict[int, str | None] = {}  # GPU index -> its PCI address
        if self._run is not None:
            try:
                self._devices = self._discover(self._run, self._pci)
            except (OSError, ValueError, KeyError, TypeError, subprocess.TimeoutExpired) as e:
                raise TelemetryError(f"xpu-smi discovery could not be read: {e}") from e
        else:
            self._devices = []
            for i, (card, dev_id, vram) in enumerate(sysfs_cards(drm_root)):
                self._devices.append(GpuInfo(index=i, vendor="intel", model=f"Intel GPU {dev_id}",
                                             vram_total_bytes=vram, uuid=f"{card}:{dev_id}"))
                self._pci[i] = drm.pci_address_of(Path(drm_root) / card / "device")
        if not self._devices:
            raise TelemetryError("no Intel GPU found (xpu-smi lists none, sysfs shows no Intel GPU with local memory)")

    @staticmethod
    def _discover(run: Runner, pci: dict[int, str | None]) -> list[GpuInfo]:
        """The GPUs xpu-smi lists; fills `pci` (device id -> PCI address) as it goes."""
        listing = json.loads(run(["discovery", "-j"]))
        devices = []
        for d in listing.get("device_list", []):
            device_id = int(d["device_id"])
            size = d.get("memory_physical_size_byte")
            pci[device_id] = d.get("pci_bdf_address")
            if size is None:
                detail = json.loads(run(["discovery", "-d", str(device_id), "-j"]))
                size = detail.get("memory_physical_size_byte", 0)
                pci[device_id] = pci[device_id] or detail.get("pci_bdf_address")
            devices.append(
                GpuInfo(
                    index=device_id,
                    vendor="intel",
                    model=str(d.get("device_name") or "Intel GPU"),
                    vram_total_bytes=int(size or 0),
                    uuid=str(d.get("uuid") or ""),
                )
            )
        return devices

    def device_nodes(self, sys_root: Path = drm.SYS_ROOT, dev_root: Path = drm.DEV_ROOT) -> dict[int, tuple[str, ...]]:
        """Each GPU's DRM nodes by index (/dev/dri/cardN and /dev/dri/renderDN of its PCI
        device): a job that was not given the GPU is denied them. GPUs whose nodes cannot be
        found are left out, with a warning (drm.py)."""
        source = "xpu-smi discovery (pci_bdf_address)" if self._run is not None else "sysfs (device/uevent)"
        return drm.nodes_by_gpu(self._pci, source, sys_root, dev_root)

    def _refresh_stats(self) -> None:
        now = self._clock()
        if self._run is None or (self._stats_at is not None and now - self._stats_at < self._interval_s):
            return
        self._stats_at = now
        for gpu in self._devices:
            try:
                self._stats[gpu.index] = _parse_stats(json.loads(self._run(["stats", "-d", str(gpu.index), "-j"])))
            except (TelemetryError, OSError, ValueError, subprocess.TimeoutExpired) as e:
                log.warning("xpu-smi stats for Intel GPU %d failed, keeping the last values: %s", gpu.index, e)

    def sample(self) -> list[GpuInfo]:
        self._refresh_stats()
        out = []
        for gpu in self._devices:
            used, util = self._stats.get(gpu.index, (0, 0.0))
            out.append(
                GpuInfo(
                    index=gpu.index, vendor="intel", model=gpu.model, uuid=gpu.uuid,
                    vram_total_bytes=gpu.vram_total_bytes, vram_used_bytes=used, utilization_pct=util,
                )
            )
        return out

    def close(self) -> None:
        pass


def _parse_stats(stats: dict[str, Any]) -> tuple[int, float]:
    used_mib = 0.0
    util = 0.0
    for metric in stats.get("device_level", []):
        kind = metric.get("metrics_type")
        if kind == "XPUM_STATS_MEMORY_USED":
            used_mib = float(metric.get("value", 0))
        elif kind == "XPUM_STATS_GPU_UTILIZATION":
            util = float(metric.get("value", 0))
    return int(used_mib * _MIB), util

"""GPUs that do not exist, reported exactly as a real backend reports real ones.

The inventory comes from the config's `[[SIMULATED_GPUS]]` entries. The load
(used VRAM, utilization, processes) starts at the configured values and can be
changed while the node runs through an override file, by default
`STATE_DIR/simulated-gpus.json`:

    {"0": {"used_vram_bytes": 8589934592, "utilization_pct": 75.0,
           "processes": [{"pid": 4242, "used_vram_bytes": 8589934592, "name": "train.py"}]},
     "3": {"utilization_pct": 10}}

Keys are GPU indices; every field is optional and a missing one keeps the configured
value, except that when `processes` is given without `used_vram_bytes` the used VRAM
is the configured value plus the processes' memory. No file means no override.
The file is stat'ed once per sample and re-read only when its mtime, size or inode
changes. A file that cannot be read or is malformed leaves the last good override in
force (one warning until it is fixed). `write_simulated_load` updates it atomically.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from mtgpu.agent.telemetry.base import TelemetryError
from mtgpu.model.gpu import VENDORS, GpuInfo, GpuProcess

log = logging.getLogger(__name__)

OVERRIDE_FILE_NAME = "simulated-gpus.json"

_ENTRY_KEYS = ("model", "vendor", "vram_bytes", "count", "used_vram_bytes", "utilization_pct")
_OVERRIDE_KEYS = ("used_vram_bytes", "utilization_pct", "processes")
_PROCESS_KEYS = ("pid", "used_vram_bytes", "name")


@dataclass(frozen=True, slots=True)
class GpuLoad:
    """What one simulated GPU's override file entry says; None fields keep the configured value."""

    used_vram_bytes: int | None = None
    utilization_pct: float | None = None
    processes: tuple[GpuProcess, ...] | None = None


@dataclass(slots=True)
class _SimGpu:
    index: int
    vendor: str
    model: str
    uuid: str
    vram_total_bytes: int
    used_vram_bytes: int
    utilization_pct: float
    processes: list[GpuProcess] = field(default_factory=list)


def _non_negative_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a whole number of bytes >= 0, got {value!r}")
    return value


def _percent(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
        raise ValueError(f"{what} must be a number from 0 to 100, got {value!r}")
    return float(value)


def _expand(gpus: list[dict], seed: str) -> list[_SimGpu]:
    """One _SimGpu per simulated GPU, indexed 0..N-1 across all entries in config order."""
    out: list[_SimGpu] = []
    for n, entry in enumerate(gpus, start=1):
        where = f"[[SIMULATED_GPUS]] entry {n}"
        unknown = sorted(set(entry) - set(_ENTRY_KEYS))
        if unknown:
            raise TelemetryError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(_ENTRY_KEYS)}")
        model = entry.get("model")
        if not isinstance(model, str) or not model.strip():
            raise TelemetryError(f"{where}: model must be a GPU model name such as \"rtx4090\", got {model!r}")
        vendor = entry.get("vendor") or "nvidia"
        if vendor not in VENDORS:
            raise TelemetryError(f"{where}: vendor must be one of {', '.join(VENDORS)}, got {vendor!r}")
        try:
            vram = _non_negative_int(entry.get("vram_bytes"), "vram_bytes")
            count = _non_negative_int(1 if entry.get("count") is None else entry["count"], "count")
            used = _non_negative_int(entry.get("used_vram_bytes") or 0, "used_vram_bytes")
            util = _percent(entry.get("utilization_pct") or 0, "utilization_pct")
        except ValueError as e:
            raise TelemetryError(f"{where}: {e}") from e
        if vram == 0:
            raise TelemetryError(f"{where}: vram_bytes must be more than 0")
        if used > vram:
            raise TelemetryError(f"{where}: used_vram_bytes ({used}) exceeds vram_bytes ({vram})")
        for _ in range(count):
            index = len(out)
            out.append(_SimGpu(index, vendor, model, f"SIM-{seed}-{index}", vram, used, util))
    return out


def parse_override(doc: Any) -> dict[int, GpuLoad]:
    """The override file's JSON document -> load per GPU index; ValueError names what is wrong."""
    if not isinstance(doc, dict):
        raise ValueError("the file must hold a JSON object keyed by GPU index")
    loads: dict[int, GpuLoad] = {}
    for key, entry in doc.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise ValueError(f"key {key!r} is not a GPU index such as \"0\"")
        if not isinstance(entry, dict):
            raise ValueError(f"GPU {key}: expected an object, got {entry!r}")
        unknown = sorted(set(entry) - set(_OVERRIDE_KEYS))
        if unknown:
            raise ValueError(f"GPU {key}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(_OVERRIDE_KEYS)}")
        used = entry.get("used_vram_bytes")
        util = entry.get("utilization_pct")
        procs = entry.get("processes")
        loads[int(key)] = GpuLoad(
            used_vram_bytes=None if used is None else _non_negative_int(used, f"GPU {key} used_vram_bytes"),
            utilization_pct=None if util is None else _percent(util, f"GPU {key} utilization_pct"),
            processes=None if procs is None else tuple(_parse_process(p, f"GPU {key} process") for p in _as_list(procs, key)),
        )
    return loads


def _as_list(value: Any, key: str) -> list:
    if not isinstance(value, list):
        raise ValueError(f"GPU {key}: processes must be a list, got {value!r}")
    return value


def _parse_process(p: Any, what: str) -> GpuProcess:
    if not isinstance(p, dict) or set(p) - set(_PROCESS_KEYS) or "pid" not in p:
        raise ValueError(f"{what}: expected {{\"pid\": .., \"used_vram_bytes\": .., \"name\": ..}}, got {p!r}")
    name = p.get("name") or ""
    if not isinstance(name, str):
        raise ValueError(f"{what}: name must be a string, got {name!r}")
    return GpuProcess(
        pid=_non_negative_int(p["pid"], f"{what} pid"),
        used_vram_bytes=_non_negative_int(p.get("used_vram_bytes", 0), f"{what} used_vram_bytes"),
        name=name,
    )


class SimulatedBackend:
    """Reports the configured GPUs, with the load the override file sets."""

    name = "simulated"

    def __init__(self, gpus: list[dict], override_path: Path | None = None, seed: str = "sim") -> None:
        self._gpus = _expand(gpus, seed)
        self._override_path = override_path
        self._loads: dict[int, GpuLoad] = {}
        self._seen: tuple[int, int, int] | None = None  # (mtime_ns, size, inode) of the file last read
        self._broken_warned = False

    @property
    def override_path(self) -> Path | None:
        return self._override_path

    def _refresh_override(self) -> None:
        if self._override_path is None:
            return
        try:
            st = os.stat(self._override_path)
        except FileNotFoundError:
            if self._seen is not None:
                log.info("simulated GPU override file %s removed: back to the configured load", self._override_path)
            self._seen, self._loads, self._broken_warned = None, {}, False
            return
        except OSError as e:
            self._warn_broken(f"cannot stat it: {e}")
            return
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key == self._seen:
            return
        self._seen = key  # even when broken: retried only once the file changes again
        try:
            loads = parse_override(json.loads(Path(self._override_path).read_text()))
        except (OSError, ValueError) as e:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
            self._warn_broken(str(e))
            return
        self._loads, self._broken_warned = loads, False

    def _warn_broken(self, why: str) -> None:
        if not self._broken_warned:
            self._broken_warned = True
            log.warning(
                "simulated GPU override file %s is not usable (%s); keeping the last good values until it is fixed",
                self._override_path, why,
            )

    def sample(self) -> list[GpuInfo]:
        self._refresh_override()
        out = []
        for g in self._gpus:
            load = self._loads.get(g.index, GpuLoad())
            processes = list(load.processes) if load.processes is not None else list(g.processes)
            if load.used_vram_bytes is not None:
                used = load.used_vram_bytes
            else:
                used = g.used_vram_bytes + sum(p.used_vram_bytes for p in (load.processes or ()))
            out.append(
                GpuInfo(
                    index=g.index,
                    vendor=g.vendor,
                    model=g.model,
                    uuid=g.uuid,
                    vram_total_bytes=g.vram_total_bytes,
                    vram_used_bytes=min(used, g.vram_total_bytes),
                    utilization_pct=load.utilization_pct if load.utilization_pct is not None else g.utilization_pct,
                    processes=[GpuProcess(p.pid, p.used_vram_bytes, p.name) for p in processes],
                )
            )
        return out

    def close(self) -> None:
        pass


def default_override_path(state_dir: Path) -> Path:
    return Path(state_dir) / OVERRIDE_FILE_NAME


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serializes writers (tests, admin CLI) so that two updates cannot lose each other."""
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_simulated_load(
    path: Path,
    index: int,
    used_vram_bytes: int | None = None,
    utilization_pct: float | None = None,
    processes: list[dict] | list[GpuProcess] | None = None,
) -> None:
    """Sets the load simulated GPU `index` reports (None leaves a field as it is) by rewriting
    the override file atomically (temp file + os.replace), so a reader never sees half a file."""
    path = Path(path)
    entry: dict[str, Any] = {}
    if used_vram_bytes is not None:
        entry["used_vram_bytes"] = used_vram_bytes
    if utilization_pct is not None:
        entry["utilization_pct"] = utilization_pct
    if processes is not None:
        entry["processes"] = [
            {"pid": p.pid, "used_vram_bytes": p.used_vram_bytes, "name": p.name} if isinstance(p, GpuProcess) else dict(p)
            for p in processes
        ]
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"index must be a GPU index >= 0, got {index!r}")
    parse_override({str(index): entry})  # refuse to write what the backend would refuse to read

    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        try:
            doc = json.loads(path.read_text())
            parse_override(doc)
        except FileNotFoundError:
            doc = {}
        except (OSError, ValueError) as e:
            log.warning("replacing unusable simulated GPU override file %s (%s)", path, e)
            doc = {}
        doc.setdefault(str(index), {}).update(entry)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

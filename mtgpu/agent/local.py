"""The node agent: measures this machine and starts, watches and stops the jobs
the committed plan gives it. It never places a job.

Runner state returned by `start` is kept in STATE_DIR/agent/<job_id>.json, so a
restarted agent can re-attach (runner.load_state) to jobs that kept running.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..model.gpu import GpuInfo, HostInfo
from .procs import boot_id
from .runners.base import NEVER_STARTED, RUNNING, UNSUPERVISED, Launch, LocalRun, Runner
from .podman.cdi import make_sim_nodes, remove_sim_nodes, spec_name
from .podman.setup import ContainerSettings, ContainerSetup, open_containers
from .podman.tenant import PodmanHost
from .runners.cgroups import device_numbers, parent_for
from .runners.native import NativeRunner
from .telemetry import open_backend
from .telemetry.base import GpuBackend
from .telemetry.host import sample_host

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Reattach:
    """What became of a run recorded on disk when the agent last stopped."""

    job_id: int
    attempt: int
    outcome: str  # runners.base: RUNNING, UNSUPERVISED, ENDED, NEVER_STARTED or LOST


class LocalAgent:
    def __init__(self, state_dir: Path, runner: Runner, backend: GpuBackend) -> None:
        self.state_dir = Path(state_dir)
        self.runner = runner
        self.backend = backend
        self._dir = self.state_dir / "agent"
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._active: dict[int, int] = {}  # job id -> attempt running here
        self._started: dict[int, float] = {}  # job id -> when it started (monotonic; its time limit counts from it)
        self._stopping: set[int] = set()
        self._last_gpus: list[GpuInfo] = []
        self._lock = threading.Lock()
        self.containers: ContainerSetup | None = None  # set by open() when containers are enabled
        self.gpu_devices: dict[int, tuple[str, ...]] = {}  # each GPU's device nodes (fencing); set by open()
        self._sim_nodes: str | None = None

    @classmethod
    def open(cls, state_dir: Path, gpu_backend: str, simulated_gpus: list[dict], node_name: str,
             containers: ContainerSettings | None = None) -> "LocalAgent":
        """The agent of the member `node_name`. Its jobs' cgroups live under `mtgpu-NODE_NAME-KEY`
        (cgroups.parent_for): two members on one machine (a test cluster, or two clusters
        that both have an m1) run jobs with the same id, and must never share (or kill)
        each other's job cgroups. With `containers`
        (enabled), container jobs run in rootless Podman (runners/podman.py)."""
        backend = open_backend(gpu_backend, simulated_gpus, Path(state_dir), node_name)
        if containers is None:
            runner: Runner = NativeRunner(Path(state_dir) / "runs", cgroup_parent=parent_for(node_name, state_dir))
            agent = cls(state_dir, runner, backend)
        else:
            try:
                setup = open_containers(Path(state_dir), node_name, containers, backend)
            except Exception:
                backend.close()
                raise
            agent = cls(state_dir, setup.runner, backend)
            agent.containers = setup
        agent._find_gpu_devices(node_name)
        return agent

    def _find_gpu_devices(self, node_name: str) -> None:
        """Each GPU's device nodes, which a job that was not given that GPU is denied
        (docs/ISOLATION.md), from the backend's `device_nodes()` (index -> one path or a
        tuple of paths): NVIDIA's /dev/nvidiaN by NVML's minor number; AMD's and Intel's
        /dev/dri/cardN and renderDN of the GPU's PCI device (telemetry/drm.py; AMD's shared
        /dev/kfd stays open, the KFD driver checks the render node). Simulated GPUs get
        real device nodes of their own (numbers no real device has) so that fencing is
        tested without hardware. Paths that do not exist are left out, and so is a GPU
        with none left."""
        try:
            gpus = self.backend.sample()
        except Exception as e:  # noqa: BLE001 - telemetry problems are reported by the telemetry path
            log.warning("GPU device nodes unknown (%s): other GPUs are not fenced off jobs", e)
            return
        if self.backend.name == "simulated":
            name = spec_name(node_name, PodmanHost(self.state_dir).key)
            try:
                paths = make_sim_nodes(name, [g.index for g in gpus])
            except OSError as e:
                log.warning("simulated GPUs get no device nodes (%s): other GPUs are not fenced off jobs", e)
                return
            self._sim_nodes = name
            self.gpu_devices = {g.index: (p,) for g, p in zip(gpus, paths)}
        elif hasattr(self.backend, "device_nodes"):
            missing = []
            for i, paths in sorted(self.backend.device_nodes().items()):
                paths = (paths,) if isinstance(paths, str) else tuple(paths)
                present = tuple(p for p in paths if os.path.exists(p))
                if present:
                    self.gpu_devices[i] = present
                else:
                    missing.append(f"GPU {i}: {', '.join(paths)}")
            if missing:
                log.warning("GPU device nodes missing from this machine's /dev (%s): those GPUs are not fenced off "
                            "other jobs", "; ".join(missing))
        cgroups = getattr(self.runner, "cgroups", None)
        if cgroups is not None:  # tenants' sessions and their own podman hold no GPU
            cgroups.fence_sessions(device_numbers(p for paths in self.gpu_devices.values() for p in paths))
        why = cgroups.device_fencing_problem() if self.gpu_devices and cgroups is not None else None
        if why:  # the probe's result: v1 devices controller not writable, or no device eBPF program on v2
            log.warning("GPU device fencing is unavailable on this node: %s; a native job can open every GPU's "
                        "device node (container jobs still get only their GPUs)", why)

    # ------------------------------------------------------------ measuring
    def sample(self) -> tuple[list[GpuInfo], HostInfo]:
        self._last_gpus = self.backend.sample()
        return self._last_gpus, sample_host()

    def last_gpus(self) -> list[GpuInfo]:
        """The GPUs as last sampled."""
        return list(self._last_gpus)

    # ------------------------------------------------------------ acting
    def start(self, launch: Launch, attempt: int = 0) -> dict:
        """Start one rank of a job; returns what was enforced. Raises RunnerError when it cannot start.

        The record of (job, attempt) is written before the process starts, so after a
        crash the agent knows whether this attempt may have run (never start it twice)."""
        for d, mode, owner in ((Path(launch.log_path).parent.parent, 0o755, None),
                               (Path(launch.log_path).parent, 0o700, (launch.uid, launch.gid))):
            if not d.is_dir():
                d.mkdir(parents=True, exist_ok=True)
                os.chmod(d, mode)
                if owner:
                    os.chown(d, *owner)
        if (self.state_dir / "runs" / str(launch.job_id)).exists():
            self._discard_old_run(launch.job_id)
        self._save(launch.job_id, {"attempt": attempt, "runner": None})
        with self._lock:
            self._active[launch.job_id] = attempt
        try:
            state = self.runner.start(launch)
        except Exception:
            with self._lock:
                self._active.pop(launch.job_id, None)
            self._drop_record(launch.job_id)
            raise
        started = time.monotonic()
        self._save(launch.job_id, {"attempt": attempt, "runner": state, "started_mono": started, "boot": boot_id()})
        with self._lock:
            self._started[launch.job_id] = started
        return self.runner.enforced(launch.job_id)

    def runs(self) -> dict[int, LocalRun]:
        """Every run this machine knows (being stopped excepted): its attempt, and how it
        ended, None while it runs. Ended runs stay until forget()."""
        with self._lock:
            candidates = {j: a for j, a in self._active.items() if j not in self._stopping}
            started = dict(self._started)
        return {j: LocalRun(j, a, self.runner.poll(j), started.get(j)) for j, a in candidates.items()}

    def terminate(self, job_id: int) -> None:
        """SIGTERM a run and return at once (preemption: it may end by itself; stop() ends it)."""
        with self._lock:
            if job_id not in self._active or job_id in self._stopping:
                return
        terminate = getattr(self.runner, "terminate", None)
        if terminate is not None:
            terminate(job_id)

    def stop(self, job_id: int, grace_s: float = 3.0) -> None:
        """Stop a run; it stays known (ended, `stopped`) until forget()."""
        with self._lock:
            if job_id not in self._active:
                return
            self._stopping.add(job_id)
        try:
            self.runner.stop(job_id, grace_s=grace_s)
        finally:
            with self._lock:
                self._stopping.discard(job_id)

    def fence_unsupervised(self, why: str) -> list[int]:
        """Kill every job that runs on without its supervisor (shim), which would have
        fenced it: this member's lease has lapsed. Returns their ids."""
        unsupervised = getattr(self.runner, "unsupervised", None)
        if unsupervised is None:
            return []
        with self._lock:
            jobs = [j for j in self._active if j not in self._stopping and unsupervised(j)]
            self._stopping.update(jobs)
        try:
            for job_id in jobs:
                self.runner.fence(job_id, why)
        finally:
            with self._lock:
                self._stopping.difference_update(jobs)
        return jobs

    def forget(self, job_id: int) -> None:
        """Drop a job whose end has been recorded."""
        with self._lock:
            self._active.pop(job_id, None)
            self._started.pop(job_id, None)
            self._stopping.discard(job_id)
        try:
            self.runner.forget(job_id)
        except OSError as e:
            log.warning("job %d: cleanup failed: %s", job_id, e)
        self._drop_record(job_id)

    def _discard_old_run(self, job_id: int) -> None:
        """The run folder of an earlier attempt of this job: make sure nothing of it
        still runs, then remove it."""
        try:
            state = self._load(self._dir / f"{job_id}.json").get("runner") or {}
            if self.runner.load_state(job_id, state) in (RUNNING, UNSUPERVISED):
                self.runner.stop(job_id, grace_s=1.0)
            self.runner.forget(job_id)
        except OSError as e:
            log.warning("job %d: removing the earlier run failed: %s", job_id, e)
        shutil.rmtree(self.state_dir / "runs" / str(job_id), ignore_errors=True)

    def _drop_record(self, job_id: int) -> None:
        try:
            (self._dir / f"{job_id}.json").unlink()
        except FileNotFoundError:
            pass

    def gpu_indices(self) -> list[int]:
        return [g.index for g in self._last_gpus]

    def recover(self) -> list[Reattach]:
        """After a restart: re-attach to every run recorded on disk, whatever the state
        says of its job (the state may be stale or still arriving; the agent loop
        decides). A run that never started is discarded: it may be started again."""
        results = []
        for path in sorted(self._dir.glob("*.json"), key=lambda p: p.name):
            stem = path.name[: -len(".json")]
            if not stem.isdigit():
                continue
            job_id = int(stem)
            record = self._load(path)
            attempt = int(record.get("attempt", 0))
            if not (self.state_dir / "runs" / str(job_id)).exists():
                outcome = NEVER_STARTED
            else:
                outcome = self.runner.load_state(job_id, record.get("runner") or {})
            if outcome == NEVER_STARTED:
                self._discard_old_run(job_id)
                self._drop_record(job_id)
            else:
                with self._lock:
                    self._active[job_id] = attempt
                    if record.get("boot") == boot_id() and isinstance(record.get("started_mono"), (int, float)):
                        self._started[job_id] = float(record["started_mono"])
            results.append(Reattach(job_id, attempt, outcome))
        if self.containers is not None:
            self.containers.sweep_later()
        return results

    def _save(self, job_id: int, state: dict) -> None:
        """Durable before the run starts (even across a power cut): a run without its
        record could be started a second time."""
        tmp = self._dir / f"{job_id}.json.tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps(state))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._dir / f"{job_id}.json")
        fd = os.open(self._dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @staticmethod
    def _load(path: Path) -> dict:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return {}

    def close(self) -> None:
        if self.containers is not None:
            self.containers.close()
        if self._sim_nodes is not None:
            remove_sim_nodes(self._sim_nodes)
        cgroups = getattr(self.runner, "cgroups", None)
        if cgroups is not None:
            cgroups.release()
        self.backend.close()


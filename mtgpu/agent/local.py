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
from dataclasses import dataclass
from pathlib import Path

from ..model.gpu import GpuInfo, HostInfo
from .runners.base import ExitInfo, Launch, Runner
from .runners.native import NativeRunner
from .telemetry import open_backend
from .telemetry.base import GpuBackend
from .telemetry.host import sample_host

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Reattach:
    """What became of a job that was running when the agent last stopped."""

    job_id: int
    outcome: str  # "running" | "ended" | "never-started" | "lost"
    exit: ExitInfo | None = None


class LocalAgent:
    def __init__(self, state_dir: Path, runner: Runner, backend: GpuBackend) -> None:
        self.state_dir = Path(state_dir)
        self.runner = runner
        self.backend = backend
        self._dir = self.state_dir / "agent"
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._active: dict[int, int] = {}  # job id -> attempt running here
        self._stopping: set[int] = set()
        self._last_gpus: list[GpuInfo] = []
        self._lock = threading.Lock()

    @classmethod
    def open(cls, state_dir: Path, gpu_backend: str, simulated_gpus: list[dict], seed: str) -> "LocalAgent":
        backend = open_backend(gpu_backend, simulated_gpus, Path(state_dir), seed)
        return cls(state_dir, NativeRunner(Path(state_dir) / "runs"), backend)

    # ------------------------------------------------------------ measuring
    def sample(self) -> tuple[list[GpuInfo], HostInfo]:
        self._last_gpus = self.backend.sample()
        return self._last_gpus, sample_host()

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
        self._save(launch.job_id, {"attempt": attempt, "runner": state})
        return self.runner.enforced(launch.job_id)

    def reap(self) -> list[tuple[int, ExitInfo]]:
        """The jobs that ended since the last call (jobs being stopped are left to stop())."""
        ended = []
        with self._lock:
            candidates = [j for j in self._active if j not in self._stopping]
        for job_id in candidates:
            info = self.runner.poll(job_id)
            if info is not None:
                ended.append((job_id, info))
        return ended

    def stop(self, job_id: int, grace_s: float = 3.0) -> None:
        with self._lock:
            if job_id not in self._active:
                return
            self._stopping.add(job_id)
        try:
            self.runner.stop(job_id, grace_s=grace_s)
        finally:
            self.forget(job_id)

    def forget(self, job_id: int) -> None:
        """Drop a job whose end has been recorded."""
        with self._lock:
            self._active.pop(job_id, None)
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
            if self.runner.load_state(job_id, self._load(self._dir / f"{job_id}.json").get("runner") or {}):
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

    def active(self) -> set[int]:
        with self._lock:
            return set(self._active)

    def attempts(self) -> dict[int, int]:
        """The attempt of each job running here."""
        with self._lock:
            return dict(self._active)

    def gpu_indices(self) -> list[int]:
        return [g.index for g in self._last_gpus]

    def recorded_attempt(self, job_id: int) -> int | None:
        """The attempt of this job a run record on disk says was started here (by this
        server or an earlier one), or None."""
        if job_id in self._active:
            return self._active[job_id]
        record = self._load(self._dir / f"{job_id}.json")
        return record.get("attempt") if record else None

    def reattach(self, job_ids: list[int]) -> list[Reattach]:
        """After a restart: find out, for each job the state says runs here, what became of it."""
        results = []
        for job_id in job_ids:
            record = self._load(self._dir / f"{job_id}.json")
            run_dir = self.state_dir / "runs" / str(job_id)
            if not run_dir.exists():
                self._drop_record(job_id)
                results.append(Reattach(job_id, "never-started"))
                continue
            if not self.runner.load_state(job_id, record.get("runner") or {}):
                results.append(Reattach(job_id, "lost"))
                continue
            with self._lock:
                self._active[job_id] = record.get("attempt", 0)
            info = self.runner.poll(job_id)
            results.append(Reattach(job_id, "ended" if info else "running", info))
        return results

    def _save(self, job_id: int, state: dict) -> None:
        tmp = self._dir / f"{job_id}.json.tmp"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self._dir / f"{job_id}.json")

    @staticmethod
    def _load(path: Path) -> dict:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return {}

    def close(self) -> None:
        self.backend.close()

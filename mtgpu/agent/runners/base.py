"""The runner contract every runtime implements (native, podman): JupyterHub's spawner
shape (start / poll / stop / get_state / load_state), so the agent can start a job,
persist the returned state, crash, and re-attach to the job after a restart."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ...model.job import WorkspaceSpec

# Our `srun` and `scontrol` (POSIX sh scripts), first on every job's PATH: srun runs its
# command once on this node, as one task of the job; scontrol only names the job's nodes
# (docs/SLURM.md). Shipped with the package; tenants must be able to read and execute
# them (the package's folders are world-readable).
SLURM_BIN_DIR = str(Path(__file__).with_name("slurm_bin"))


@dataclass(frozen=True)
class Launch:
    """Everything a runner needs to start one job on this node, computed by the server."""

    job_id: int
    uid: int
    gid: int
    extra_gids: tuple[int, ...]
    home: str
    workdir: str
    script: str  # the job file text, run with /bin/bash (or its #! interpreter)
    env: dict[str, str]  # the complete environment; the runner only adds HOME/USER/LOGNAME/PATH/SHELL if absent
    log_path: str  # stdout+stderr, created owned by uid:gid, mode 0600
    cpus: float | None = None
    mem_bytes: int | None = None
    gpu_vendor: str | None = None
    gpu_indices: tuple[int, ...] = ()
    all_gpu_indices: tuple[int, ...] = field(default=())  # the node's GPUs: the others are denied
    gpu_devices: dict = field(default_factory=dict)  # GPU index -> its device node paths, every GPU of the node
    # Cluster mode: the agent renews this file; the job is killed when it is older than lease_s.
    lease_path: str | None = None
    lease_s: float | None = None
    container: str | None = None  # run in this image (runners/podman.py); None: natively
    workspace: "WorkspaceSpec | None" = None  # keep the container: a workspace (runners/workspace.py)
    ws_token: str | None = None  # the workspace's secret token, when it has one already
    # sbatch's --output / --error: the job's output is also written to these files (as the
    # tenant, relative to workdir; stderr to error_path when set), besides log_path
    output_path: str | None = None
    error_path: str | None = None
    output_append: bool = False  # append (a requeued attempt) instead of starting them empty


@dataclass
class ExitInfo:
    """How a job ended. `exit_code` is None when a signal killed it (then `signal` says which).
    `fenced`: the job's supervisor killed it because this member lost the cluster;
    `stopped`: the agent stopped it; `lost`: the machine restarted, which killed its
    processes (none of these is an end of the job's own: it was interrupted);
    `unknown`: its supervisor and the job's keeper (shim.py) died in this boot and its
    processes ended with no record: the job may well have run to its end, and how it
    ended is not known."""

    exit_code: int | None
    signal: int | None
    reason: str
    fenced: bool = False
    stopped: bool = False
    lost: bool = False
    unknown: bool = False

    @property
    def natural(self) -> bool:
        """The job ended by itself (its own exit, or a signal none of ours): its real outcome."""
        return not (self.fenced or self.stopped or self.lost or self.unknown)


@dataclass(frozen=True, slots=True)
class LocalRun:
    """A run this machine knows: its job's attempt, and how it ended (None: it runs)."""

    job_id: int
    attempt: int
    ended: ExitInfo | None = None
    started_mono: float | None = None  # when it started here, on this boot's monotonic clock


# What load_state found of a run after a restart. UNSUPERVISED: its processes run, its
# supervisor (shim) is gone (the job's keeper still records its end, and nothing fences
# it but the server); ENDED: its end was recorded (by the shim, or by the keeper); LOST:
# its processes are gone with no record (poll says whether a reboot killed them or how
# they ended is unknown).
RUNNING, ENDED, NEVER_STARTED, LOST = "running", "ended", "never-started", "lost"
UNSUPERVISED = "running-unsupervised"


class RunnerError(RuntimeError):
    """A job could not be started; the message names what and why."""


@runtime_checkable
class Runner(Protocol):
    def start(self, launch: Launch) -> dict:
        """Start the job; return the state (JSON-able) the caller persists for load_state."""
        ...

    def poll(self, job_id: int) -> ExitInfo | None:
        """None while the job runs, else how it ended."""
        ...

    def stop(self, job_id: int, grace_s: float = 5.0) -> None:
        """SIGTERM the whole process tree, SIGKILL after grace_s; nothing is left when it returns."""
        ...

    def terminate(self, job_id: int) -> None:
        """SIGTERM the job and return at once (preemption's grace period; stop() ends it)."""
        ...

    def get_state(self, job_id: int) -> dict: ...

    def load_state(self, job_id: int, state: dict) -> str:
        """Re-attach after a restart: RUNNING, ENDED (its exit record is there), NEVER_STARTED
        (no instruction of the job ran: it may be started again), UNSUPERVISED (its
        processes run, its supervisor is gone) or LOST (it ran, and its processes are gone
        with no exit record)."""
        ...

    def enforced(self, job_id: int) -> dict:
        """Which limits are enforced and how, e.g. {"memory": "cgroup-v1", "cpu": "not enforced"}."""
        ...

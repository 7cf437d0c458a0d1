"""Jobs: what a tenant asks for (JobSpec) and what became of it (Job)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum


DEPENDENCY_KINDS = ("afterok", "afternotok", "afterany")  # JobSpec.after (sched/deps.py)


class GpuMode(str, Enum):
    EXCLUSIVE = "exclusive"
    SHARED = "shared"
    OVERSUBSCRIBE = "oversubscribe"


class JobState(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"
    STOPPED = "stopped"  # a workspace that holds nothing now and can be started again

    @property
    def final(self) -> bool:
        return self not in (JobState.QUEUED, JobState.RUNNING, JobState.STOPPED)


@dataclass(frozen=True, slots=True)
class GpuAlternative:
    """One `|`-separated alternative of `gpus=`: how many GPUs of which kind.

    `count` is a whole number of GPUs, or a fraction in (0, 1) of one GPU.
    `vendor` and `model` are None for "any"; `model` is normalized (model.gpu.normalize_model)."""

    count: float
    vendor: str | None = None
    model: str | None = None

    @property
    def fractional(self) -> bool:
        return self.count < 1

    def label(self) -> str:
        kind = self.model or self.vendor
        n = f"{self.count:g}"
        return f"{kind}:{n}" if kind else n


@dataclass(frozen=True, slots=True)
class ArraySpec:
    indices: tuple[int, ...]
    max_running: int | None = None


@dataclass(frozen=True, slots=True)
class WorkspaceSpec:
    """What makes a job a workspace (docs/WORKSPACES.md): a kept container, its main
    command, the ports it serves and what runs when it is created or started. Hashable,
    as the scheduler keys caches by JobSpec."""

    name: str
    source: str = ""  # "template NAME", "image IMAGE" or "devcontainer PATH", as created
    command: tuple[str, ...] = ()  # the main process (argv); () keeps the container up idle
    ports: tuple[int, ...] = ()  # container ports published on the node's loopback
    env: tuple[tuple[str, str], ...] = ()
    token_env: str | None = None  # a variable given a fresh secret token (e.g. JUPYTER_TOKEN)
    url_path: str = "/"  # what `mt-container ports` prints after the host and port ("?token=" added)
    post_create: tuple[str, ...] = ()  # shell commands run once, after the container is created
    post_start: tuple[str, ...] = ()  # shell commands run at every start
    mounts: tuple[tuple[str, str, bool], ...] = ()  # (source in the home, target, read-only)
    labels: tuple[tuple[str, str], ...] = ()  # e.g. devcontainer.metadata for VS Code
    container_workdir: str | None = None  # the devcontainer's workspaceFolder
    run_args: tuple[str, ...] = ()  # devcontainer runArgs (the allow-list's: workspaces/runargs.py)
    user: str | None = None  # the image's user the tenant is mapped onto (devcontainer containerUser/remoteUser)

    def to_dict(self) -> dict:
        return {"name": self.name, "source": self.source, "command": list(self.command), "ports": list(self.ports),
                "env": [list(e) for e in self.env], "token_env": self.token_env, "url_path": self.url_path,
                "post_create": list(self.post_create), "post_start": list(self.post_start),
                "mounts": [list(m) for m in self.mounts], "labels": [list(x) for x in self.labels],
                "container_workdir": self.container_workdir, "run_args": list(self.run_args), "user": self.user}

    @classmethod
    def from_dict(cls, d: dict) -> "WorkspaceSpec":
        return cls(name=str(d["name"]), source=str(d.get("source", "")),
                   command=tuple(str(a) for a in d.get("command", ())),
                   ports=tuple(int(p) for p in d.get("ports", ())),
                   env=tuple((str(k), str(v)) for k, v in d.get("env", ())),
                   token_env=d.get("token_env"), url_path=str(d.get("url_path", "/")),
                   post_create=tuple(str(c) for c in d.get("post_create", ())),
                   post_start=tuple(str(c) for c in d.get("post_start", ())),
                   mounts=tuple((str(a), str(b), bool(c)) for a, b, c in d.get("mounts", ())),
                   labels=tuple((str(k), str(v)) for k, v in d.get("labels", ())),
                   container_workdir=d.get("container_workdir"),
                   run_args=tuple(str(a) for a in d.get("run_args", ())), user=d.get("user"))


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A parsed job request. Sizes in bytes, times in seconds; None means "not asked"."""

    script: str = ""
    name: str = ""
    gpus: tuple[GpuAlternative, ...] = ()
    vram_bytes: int | None = None
    cpus: float | None = None
    mem_bytes: int | None = None
    gpu_mode: GpuMode = GpuMode.EXCLUSIVE
    server: str | None = None
    exclude: tuple[str, ...] = ()  # nodes it must not run on (sbatch --exclude)
    container: str | None = None
    nodes: int = 1
    array: ArraySpec | None = None
    priority: float = 0.0  # points; aging adds one an hour (docs/SCHEDULING.md)
    time_limit_s: float | None = None
    workdir: str | None = None
    requeue: bool = True
    workspace: WorkspaceSpec | None = None  # a workspace (mt-container), not a batch job
    # also write the output (and stderr, when `error` is set) to these files, as sbatch's
    # --output/--error: Slurm filename patterns (jobfile/patterns.py), relative to workdir
    output: str | None = None
    error: str | None = None
    submit_dir: str | None = None  # where it was submitted from (SLURM_SUBMIT_DIR), when known
    # queue dependencies, all of which must hold: ((kind, (job ids...)), ...), kind afterok,
    # afternotok or afterany (sched/deps.py); an id of an array means every task of it
    after: tuple[tuple[str, tuple[int, ...]], ...] = ()
    slurm: bool = False  # a Slurm batch script (#SBATCH lines or sbatch options): Slurm's variables and srun

    @property
    def wants_gpu(self) -> bool:
        return bool(self.gpus)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["gpu_mode"] = self.gpu_mode.value
        d["workspace"] = self.workspace.to_dict() if self.workspace else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "JobSpec":
        d = dict(d)
        d["gpus"] = tuple(GpuAlternative(**g) for g in d.get("gpus", ()))
        d["gpu_mode"] = GpuMode(d.get("gpu_mode", "exclusive"))
        arr = d.get("array")
        d["array"] = ArraySpec(tuple(arr["indices"]), arr.get("max_running")) if arr else None
        ws = d.get("workspace")
        d["workspace"] = WorkspaceSpec.from_dict(ws) if ws else None
        d["exclude"] = tuple(d.get("exclude", ()))
        d["after"] = tuple((str(kind), tuple(int(i) for i in ids)) for kind, ids in d.get("after", ()))
        return cls(**d)


@dataclass(frozen=True, slots=True)
class GpuSlot:
    """A GPU given to a job: its index on the node, the share of it (1.0 = whole),
    and the VRAM reserved on it for the job (0 when nothing is guaranteed)."""

    index: int
    fraction: float = 1.0
    vram_bytes: int = 0
    mode: GpuMode = GpuMode.EXCLUSIVE


@dataclass(frozen=True, slots=True)
class NodeAllocation:
    """What one node gives one job (one rank of a gang)."""

    node: str
    gpus: tuple[GpuSlot, ...] = ()
    cpus: float = 0.0
    mem_bytes: int = 0
    vendor: str | None = None

    def to_dict(self) -> dict:
        return {
            "node": self.node,
            "gpus": [
                {"index": g.index, "fraction": g.fraction, "vram_bytes": g.vram_bytes, "mode": g.mode.value}
                for g in self.gpus
            ],
            "cpus": self.cpus,
            "mem_bytes": self.mem_bytes,
            "vendor": self.vendor,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "NodeAllocation":
        return cls(
            node=d["node"],
            gpus=tuple(
                GpuSlot(g["index"], g.get("fraction", 1.0), g.get("vram_bytes", 0), GpuMode(g.get("mode", "exclusive")))
                for g in d.get("gpus", ())
            ),
            cpus=d.get("cpus", 0.0),
            mem_bytes=d.get("mem_bytes", 0),
            vendor=d.get("vendor"),
        )


@dataclass(slots=True)
class Job:
    """The durable record of one job, as the state machine keeps it."""

    id: int
    tenant: str
    uid: int
    gid: int
    spec: JobSpec
    state: JobState = JobState.QUEUED
    submitted_at: float = 0.0
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    reason: str = ""
    allocations: tuple[NodeAllocation, ...] = ()
    array_parent: int | None = None
    array_index: int | None = None
    attempt: int = 0
    enforced: dict = field(default_factory=dict)
    log_path: str = ""
    master_port: int | None = None  # gangs: the rendezvous port rank 0's node picked
    rank_exits: dict = field(default_factory=dict)  # gangs: rank (as str) -> exit code of ranks that ended well
    # earlier attempts, oldest first: {"attempt", "nodes", "allocations", "started_at", "ended_at",
    # "outcome"}, plus "late" once the member of a requeued attempt reported how it ended there
    history: list = field(default_factory=list)
    # workspaces: what its member published and keeps: {"node": where its container (and
    # writable layer) is, "ports": {"8888": host port}, "token": ..., "container": name}
    ws: dict = field(default_factory=dict)
    # the member's token for the submission that made it: a submission proposed again
    # after a leader change (its outcome unknown) finds its jobs instead of adding copies
    submit_key: str = ""
    # once final: what it used (model/usage.py JobUsage.to_dict(), docs/ACCOUNTING.md)
    usage: dict | None = None
    # an opportunistic job a guaranteed one preempts (docs/SCHEDULING.md "Preemption"): while
    # it stops, {"by": job id, "at": when, "grace_s": SIGTERM to SIGKILL}; and the times it was
    # preempted before (the scheduler does not choose it again too often)
    preempt: dict | None = None
    preempted: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "uid": self.uid,
            "gid": self.gid,
            "spec": self.spec.to_dict(),
            "state": self.state.value,
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "allocations": [a.to_dict() for a in self.allocations],
            "array_parent": self.array_parent,
            "array_index": self.array_index,
            "attempt": self.attempt,
            "enforced": dict(self.enforced),
            "log_path": self.log_path,
            "master_port": self.master_port,
            "rank_exits": dict(self.rank_exits),
            "history": [dict(h) for h in self.history],
            "ws": dict(self.ws),
            "submit_key": self.submit_key,
            "usage": self.usage,
            # only when set: the records of jobs never preempted stay as they were
            **({"preempt": dict(self.preempt)} if self.preempt else {}),
            **({"preempted": list(self.preempted)} if self.preempted else {}),
        }

    def rank_log_path(self, rank: int) -> str:
        """The log of one rank (relative to STATE_DIR, on that rank's member): rank 0's
        is the job's log; a gang's other ranks each write their own."""
        return self.log_path if rank == 0 else self.log_path.replace(".log", f".rank{rank}.log")

    @classmethod
    def from_dict(cls, d: dict) -> "Job":
        return cls(
            id=d["id"],
            tenant=d["tenant"],
            uid=d["uid"],
            gid=d["gid"],
            spec=JobSpec.from_dict(d["spec"]),
            state=JobState(d["state"]),
            submitted_at=d.get("submitted_at", 0.0),
            started_at=d.get("started_at"),
            ended_at=d.get("ended_at"),
            exit_code=d.get("exit_code"),
            reason=d.get("reason", ""),
            allocations=tuple(NodeAllocation.from_dict(a) for a in d.get("allocations", ())),
            array_parent=d.get("array_parent"),
            array_index=d.get("array_index"),
            attempt=d.get("attempt", 0),
            enforced=dict(d.get("enforced", {})),
            log_path=d.get("log_path", ""),
            master_port=d.get("master_port"),
            rank_exits=dict(d.get("rank_exits", {})),
            history=[dict(h) for h in d.get("history", ())],
            ws=dict(d.get("ws", {})),
            submit_key=d.get("submit_key", ""),
            usage=d.get("usage"),
            preempt=dict(d["preempt"]) if d.get("preempt") else None,
            preempted=list(d.get("preempted", ())),
        )

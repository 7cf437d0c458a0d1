"""What the scheduler core reads (ClusterSnapshot, PendingJob) and returns (Plan).

The server builds a snapshot from the state machine (commitments) and the
agents' telemetry (measurements); `mtgpu.sched.schedule(snapshot, queue, now)`
turns it into a Plan; the server checks the plan against fresh state and
commits it as state-machine commands.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .job import GpuMode, JobSpec, NodeAllocation


@dataclass(slots=True)
class GpuView:
    """One GPU of a node as the scheduler sees it.

    Measured fields come from telemetry; committed fields from the allocations
    of jobs the state machine has placed there."""

    index: int
    vendor: str
    model: str  # normalized (model.gpu.normalize_model)
    vram_total_bytes: int
    vram_used_measured_bytes: int = 0
    utilization_pct: float = 0.0
    committed_fraction: float = 0.0  # sum of shares given out (exclusive = 1.0)
    committed_vram_bytes: int = 0  # VRAM guaranteed to shared jobs here
    exclusive: bool = False  # held whole by an exclusive job
    shared_jobs: int = 0
    oversubscribed_jobs: int = 0


@dataclass(frozen=True, slots=True)
class NodeContainers:
    """A node with containers on: the images it offers, and whether it also runs a
    tenant's own images."""

    images: frozenset[str] = frozenset()
    user_images: bool = False


@dataclass(slots=True)
class NodeView:
    name: str
    gpus: list[GpuView] = field(default_factory=list)
    cpus_total: float = 0.0
    mem_total_bytes: int = 0
    cpus_committed: float = 0.0
    mem_committed_bytes: int = 0
    mem_available_measured_bytes: int | None = None  # None: no measurement yet
    schedulable: bool = True  # False when drained or down
    unschedulable_reason: str = ""
    containers: NodeContainers | None = None  # None: no container jobs here


@dataclass(frozen=True, slots=True)
class RunningAlloc:
    """A job running now, for backfill: what it holds and when it will end at the latest.

    `ends_at` is its start plus its `time=` limit; None when it has no limit (then
    nothing may be promised about when its resources free)."""

    job_id: int
    allocations: tuple[NodeAllocation, ...] = ()
    ends_at: float | None = None
    # Preemption (docs/SCHEDULING.md): an opportunistic job the scheduler may stop for a
    # guaranteed one now (the server decides: oversubscribed slots only, one node, not a
    # workspace, not preempted too often lately); the queued job one stops for; its start
    started_at: float = 0.0
    preemptible: bool = False
    preempting_for: int | None = None


@dataclass(slots=True)
class ClusterSnapshot:
    nodes: list[NodeView] = field(default_factory=list)
    # Running jobs with their latest end times (for backfill); empty = no promises.
    running: list[RunningAlloc] = field(default_factory=list)


@dataclass(slots=True)
class TenantUsage:
    """Recent usage of one tenant (decayed GPU-seconds) and its share (the weight an admin
    gave it, 1 by default), for fair share: the usage counts divided by the share."""

    tenant: str
    gpu_seconds: float = 0.0
    share: float = 1.0


@dataclass(slots=True)
class PendingJob:
    """A queued job, as the queue hands it to the scheduler."""

    job_id: int
    tenant: str
    spec: JobSpec
    submitted_at: float
    array_parent: int | None = None
    running_in_array: int = 0  # siblings of the same array running now (for %K)


@dataclass(frozen=True, slots=True)
class Placement:
    job_id: int
    allocations: tuple[NodeAllocation, ...]  # one per rank; rank = position


@dataclass(frozen=True, slots=True)
class Preemption:
    """Stop the running opportunistic job `victim` so that the queued `for_job` fits on `node`."""

    victim: int
    for_job: int
    node: str


@dataclass(slots=True)
class Plan:
    placements: list[Placement] = field(default_factory=list)
    # job id -> why it waits ("node a: not enough free VRAM on any rtx4090 (12G < 20G); ...")
    pending: dict[int, str] = field(default_factory=dict)
    # job id -> why it can never run on this cluster
    rejected: dict[int, str] = field(default_factory=dict)
    preemptions: list[Preemption] = field(default_factory=list)


__all__ = [
    "ClusterSnapshot",
    "GpuMode",
    "GpuView",
    "NodeContainers",
    "NodeView",
    "PendingJob",
    "Placement",
    "Plan",
    "Preemption",
    "RunningAlloc",
    "TenantUsage",
]

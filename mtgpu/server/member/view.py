"""Build the scheduler's view of the cluster: durable commitments from the state
machine, plus the latest soft telemetry each node reported (never journaled)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import math

from ...model.cluster import ClusterSnapshot, GpuView, NodeContainers, NodeView, PendingJob, RunningAlloc, TenantUsage
from ...model.gpu import GpuInfo, HostInfo, normalize_model
from ...model.job import Job, JobState
from ...sched import deps
from ...state.machine import StateMachine
from ...state.preempt import preemptible_why_not


@dataclass(slots=True)
class NodeTelemetry:
    """The last report of one node (soft state, in memory only)."""

    gpus: list[GpuInfo] = field(default_factory=list)
    host: HostInfo | None = None
    reported_at: float = 0.0  # wall clock, for people
    heard_mono: float = 0.0  # when the scheduler got it, on its monotonic clock (silence is measured with it)


@dataclass(frozen=True, slots=True)
class PreemptPolicy:
    """`[PREEMPTION]` as the scheduler applies it (docs/SCHEDULING.md "Preemption")."""

    enabled: bool = False
    grace_s: float = 30.0
    max_per_window: int = 3
    window_s: float = 3600.0

    def may_stop(self, job: Job, now: float) -> bool:
        """Whether the scheduler may choose this running job as a victim now."""
        if not self.enabled or job.preempt is not None or preemptible_why_not(job) is not None:
            return False
        return sum(1 for t in job.preempted if now - t < self.window_s) < self.max_per_window


def build_snapshot(machine: StateMachine, telemetry: dict[str, NodeTelemetry],
                   preempt: PreemptPolicy | None = None, now: float = 0.0) -> ClusterSnapshot:
    nodes = []
    for rec in machine.nodes.values():
        commit = machine.commitment(rec.name)
        measured = telemetry.get(rec.name)
        measured_gpus = {g.index: g for g in measured.gpus} if measured else {}
        gpus = []
        for inv in rec.gpus:
            c = commit.gpus.get(inv.index)
            m = measured_gpus.get(inv.index)
            gpus.append(GpuView(
                index=inv.index,
                vendor=inv.vendor,
                model=normalize_model(inv.model),
                vram_total_bytes=inv.vram_total_bytes,
                vram_used_measured_bytes=m.vram_used_bytes if m else 0,
                utilization_pct=m.utilization_pct if m else 0.0,
                committed_fraction=c.fraction if c else 0.0,
                committed_vram_bytes=c.vram_bytes if c else 0,
                exclusive=bool(c and c.exclusive),
                shared_jobs=c.shared if c else 0,
                oversubscribed_jobs=c.oversubscribed if c else 0,
            ))
        reason = rec.unavailable_reason
        nodes.append(NodeView(
            name=rec.name,
            gpus=gpus,
            cpus_total=rec.cpus,
            mem_total_bytes=rec.mem_total_bytes,
            cpus_committed=commit.cpus,
            mem_committed_bytes=commit.mem_bytes,
            mem_available_measured_bytes=measured.host.mem_available_bytes if measured and measured.host else None,
            schedulable=not reason,
            unschedulable_reason=reason,
            containers=None if rec.containers is None else NodeContainers(
                frozenset(rec.containers.get("images", ())), bool(rec.containers.get("user_images"))),
        ))
    preempt = preempt or PreemptPolicy()
    running = [
        RunningAlloc(job.id, job.allocations,
                     job.started_at + job.spec.time_limit_s if job.spec.time_limit_s and job.started_at else None,
                     started_at=job.started_at or 0.0, preemptible=preempt.may_stop(job, now),
                     preempting_for=job.preempt["by"] if job.preempt else None)
        for job in machine.running_jobs()
    ]
    return ClusterSnapshot(nodes=nodes, running=running)


USAGE_HALF_LIFE_S = 6 * 3600.0


def build_usage(tenants: Iterable, jobs: Iterable[Job], now: float,
                half_life_s: float = USAGE_HALF_LIFE_S) -> dict[str, TenantUsage]:
    """Recent GPU use per tenant, in GPU-seconds decayed with a half-life, and each
    tenant's share (`mtgpu-admin tenant assign NAME --share N`), for fair share.

    Jobs that ended more than eight half-lives ago no longer count."""
    usage = {t.name: TenantUsage(t.name, share=t.share) for t in tenants}
    horizon = now - 8 * half_life_s
    for job in jobs:
        if job.started_at is None:
            continue
        end = job.ended_at if job.ended_at is not None else now
        if end < horizon:
            continue
        gpus = sum(g.fraction for a in job.allocations for g in a.gpus) if job.allocations else \
            max((alt.count for alt in job.spec.gpus), default=0.0) * job.spec.nodes
        if gpus <= 0:
            continue
        seconds = max(0.0, end - job.started_at) * math.pow(0.5, max(0.0, now - end) / half_life_s)
        u = usage.setdefault(job.tenant, TenantUsage(job.tenant))
        u.gpu_seconds += gpus * seconds
    return usage


@dataclass(slots=True)
class PassInputs:
    """What a placement pass reads of the state, taken in one short hold of the state's
    lock: the queued and running jobs, and shallow copies of the job and tenant tables.

    The pass then builds its queue, dependencies and usage from these outside the lock:
    the lock is also what the Raft thread takes to apply any command, and reading 4,000
    queued jobs under it held that thread 76-480 ms on a busy member, long enough for its
    followers to call an election (issue 23). The jobs are the live objects, so a field
    may change while the pass reads it: a plan is only a proposal, and every placement is
    checked again by the state machine against the state it is applied to."""

    queued: list[Job]
    running: list[Job]
    jobs: dict[int, Job]
    tenants: list


def pass_inputs(machine: StateMachine) -> PassInputs:
    """Call under the state's lock; O(jobs) in C-level copies, no per-job Python work. With
    nothing queued the pass plans nothing, and the tables (every job ever kept) are not
    copied: most passes of an idle cluster are such, five a second."""
    queued = machine.queued_jobs()
    if not queued:
        return PassInputs(queued, [], {}, [])
    return PassInputs(queued, machine.running_jobs(), dict(machine.jobs), list(machine.tenants.values()))


def build_queue(queued: Iterable[Job], running: Iterable[Job]) -> list[PendingJob]:
    running_per_array: dict[int, int] = {}
    for job in running:
        if job.array_parent is not None:
            running_per_array[job.array_parent] = running_per_array.get(job.array_parent, 0) + 1
    return [
        PendingJob(
            job_id=job.id,
            tenant=job.tenant,
            spec=job.spec,
            submitted_at=job.submitted_at,
            array_parent=job.array_parent,
            running_in_array=running_per_array.get(job.array_parent, 0) if job.array_parent is not None else 0,
        )
        for job in queued
        if job.state is JobState.QUEUED
    ]


def hold_dependents(jobs: Mapping[int, Job], queue: list[PendingJob]) -> tuple[list[PendingJob], dict[int, str],
                                                                              dict[int, str]]:
    """Split the queue by queue dependencies (sched/deps.py): (the jobs that may be placed,
    {job: why it waits}, {job: why it never can}: those are to be cancelled)."""
    if not any(p.spec.after for p in queue):
        return queue, {}, {}
    tasks: dict[int, list[JobState]] | None = None

    def states_of(jid: int) -> list[JobState] | None:
        nonlocal tasks
        job = jobs.get(jid)
        if job is None:
            return None
        if job.array_parent != jid:
            return [job.state]
        if tasks is None:  # an array's id: every task of it (indexed once per pass)
            tasks = {}
            for j in jobs.values():
                if j.array_parent is not None:
                    tasks.setdefault(j.array_parent, []).append(j.state)
        return tasks[jid]

    ready, waiting, never = [], {}, {}
    for p in queue:
        v = deps.verdict(p.spec.after, states_of) if p.spec.after else None
        if v is None or v.state == deps.READY:
            ready.append(p)
        elif v.state == deps.WAITING:
            waiting[p.job_id] = v.reason
        else:
            never[p.job_id] = v.reason
    return ready, waiting, never


PREEMPTED_WAITS_S = 300.0


def hold_preempted(jobs: Mapping[int, Job], queue: list[PendingJob],
                   now: float) -> tuple[list[PendingJob], dict[int, str]]:
    """A job requeued because it was preempted waits until the job it was stopped for has
    started (or left the queue), at most PREEMPTED_WAITS_S: otherwise, older, it would take
    its place back first."""
    ready, waiting = [], {}
    for p in queue:
        job = jobs.get(p.job_id)
        last = job.history[-1] if job is not None and job.history else None
        by = last.get("preempted_by") if last is not None and last.get("attempt") == job.attempt - 1 else None
        other = jobs.get(by) if by is not None else None
        if other is not None and other.state is JobState.QUEUED and now - last["ended_at"] < PREEMPTED_WAITS_S:
            waiting[p.job_id] = f"requeued: preempted by job {by}, which starts first"
        else:
            ready.append(p)
    return ready, waiting

"""The one deterministic state machine: tenants, nodes, jobs and allocations.

Standalone mode applies commands through a journal (state.journal); cluster mode
replicates the very same commands through Raft. `apply` never reads a clock,
never touches a file and never raises for a bad command: it answers
{"ok": False, "error": ...}, identically on every replica, and changes nothing.

A placement (`job.start.v1`) is checked against the commitments it is applied to,
so a stale or conflicting plan is refused instead of overbooking a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..model.job import GpuMode, Job, JobSpec, JobState, NodeAllocation
from ..model.usage import JobUsage, UsageSummary, job_usage
from . import commands as C
from .preempt import PreemptCommands, PreemptRejected
from .tenants import Invite, TenantCommands, TenantRecord, TenantRejected

_EPS = 1e-9
# Commands that change a node or who schedules: each raises capacity_version (as does every
# running job that gives back what it held): the scheduler's quick path
# (SchedulerRole.quick_place) is valid only while it stays the same.
_CHANGES_NODES = frozenset((C.NODE_REGISTER, C.NODE_DRAIN, C.NODE_RESUME, C.NODE_DOWN, C.NODE_UP, C.NODE_REMOVE,
                            C.NODE_REMOVE_V2, C.SCHED_ELECT, C.STATE_SEED))


class CommandRejected(Exception):
    """Raised inside a handler; turned into {"ok": False, "error": str(e)}."""


def _check_reason(reason) -> None:
    if not isinstance(reason, str):
        raise CommandRejected(f"a reason must be text, not {type(reason).__name__}")


@dataclass(slots=True)
class GpuInventory:
    index: int
    vendor: str
    model: str  # as the backend reports it
    vram_total_bytes: int


@dataclass(slots=True)
class NodeRecord:
    name: str
    gpus: list[GpuInventory]
    cpus: float
    mem_total_bytes: int
    address: str = ""
    drained: bool = False
    drain_reason: str = ""
    registered_at: float = 0.0
    down: bool = False
    down_reason: str = ""
    # None: containers off here; else {"images": [offered], "staged": {name: digest},
    # "failed": {name: why}, "user_images": bool}
    containers: dict | None = None
    # {"id": its DirectLink id (hex ed25519), "ssh_host_key": its tenant sshd's public host
    # key line}: how clients reach it through a relay and pin it; None: not through DirectLink
    directlink: dict | None = None

    @property
    def unavailable_reason(self) -> str:
        """Why nothing can be placed here now ("" when it can take work)."""
        if self.down:
            return self.down_reason or "down"
        if self.drained:
            return self.drain_reason or "drained"
        return ""

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "gpus": [{"index": g.index, "vendor": g.vendor, "model": g.model,
                      "vram_total_bytes": g.vram_total_bytes} for g in self.gpus],
            "cpus": self.cpus,
            "mem_total_bytes": self.mem_total_bytes,
            "address": self.address,
            "drained": self.drained,
            "drain_reason": self.drain_reason,
            "registered_at": self.registered_at,
            "down": self.down,
            "down_reason": self.down_reason,
            "containers": self.containers,
            "directlink": self.directlink,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "NodeRecord":
        return cls(
            name=d["name"],
            gpus=[GpuInventory(**g) for g in d.get("gpus", [])],
            cpus=d.get("cpus", 0.0),
            mem_total_bytes=d.get("mem_total_bytes", 0),
            address=d.get("address", ""),
            drained=d.get("drained", False),
            drain_reason=d.get("drain_reason", ""),
            registered_at=d.get("registered_at", 0.0),
            down=d.get("down", False),
            down_reason=d.get("down_reason", ""),
            containers=d.get("containers"),
            directlink=d.get("directlink"),
        )


@dataclass(slots=True)
class GpuCommitment:
    fraction: float = 0.0
    vram_bytes: int = 0
    exclusive: int = 0
    shared: int = 0
    oversubscribed: int = 0


@dataclass(slots=True)
class NodeCommitment:
    cpus: float = 0.0
    mem_bytes: int = 0
    gpus: dict[int, GpuCommitment] = field(default_factory=dict)


class StateMachine(TenantCommands, PreemptCommands):
    """All durable state. Derived indexes (commitments, queue) are rebuilt from jobs."""

    def __init__(self) -> None:
        self.tenants: dict[str, TenantRecord] = {}
        self.invites: dict[str, Invite] = {}
        self.retired_ids: set[int] = set()
        self.nodes: dict[str, NodeRecord] = {}
        # members an admin removed, and when: their own periodic registrations are refused
        # (a removed member that still runs must not walk back in); a restart rejoins
        self.removed: dict[str, float] = {}
        self.jobs: dict[int, Job] = {}
        self.next_job_id = 1
        self.sched_epoch = 0  # raised by each new scheduler; placements carry it
        self.scheduler = ""
        self.applied = 0  # count of commands applied (the journal sequence)
        self.format_used = 1  # the newest state format of a command applied (snapshots say it)
        # raised whenever capacity is given back (a running job that held any ends, is
        # requeued or stopped) or a node changes (not state: never saved; only compared within
        # this process, by the scheduler)
        self.capacity_version = 0
        self.usage = UsageSummary()  # forgotten jobs' usage, per tenant, day, node and model
        self._queued: dict[int, None] = {}  # insertion-ordered set
        self._running: dict[int, None] = {}
        self._by_key: dict[str, list[int]] = {}  # submission key -> the jobs it made
        self._commitments: dict[str, NodeCommitment] = {}
        self._handlers = {
            C.TENANT_ENSURE: self._tenant_ensure,
            C.TENANT_INVITE: self._tenant_invite,
            C.TENANT_JOIN: self._tenant_join,
            C.TENANT_ASSIGN: self._tenant_assign,
            C.TENANT_ASSIGN_V2: self._tenant_assign_v2,
            C.TENANT_ADMIT: self._tenant_admit,
            C.TENANT_REMOVE: self._tenant_remove,
            C.TENANT_SEEN: self._tenant_seen,
            C.TENANT_SHARE: self._tenant_share,
            C.NODE_REGISTER: self._node_register,
            C.NODE_DRAIN: self._node_drain,
            C.NODE_RESUME: self._node_resume,
            C.NODE_DOWN: self._node_down,
            C.NODE_UP: self._node_up,
            C.NODE_REMOVE: self._node_remove,
            C.NODE_REMOVE_V2: lambda name, at=0.0: self._node_remove(name, at, keep_out=True),
            C.SCHED_ELECT: self._sched_elect,
            C.JOB_SUBMIT: self._job_submit,
            C.JOB_SUBMIT_BATCH: self._job_submit_batch,
            C.JOB_START: self._job_start,
            C.JOB_ANNOTATE: self._job_annotate,
            C.JOB_FINISH: self._job_finish,
            C.JOB_CANCEL: self._job_cancel,
            C.JOB_REQUEUE: self._job_requeue,
            C.JOB_PREEMPT: self._job_preempt,
            C.JOB_LATE_REPORT: self._job_late_report,
            C.JOB_FORGET: self._job_forget,
            C.CLUSTER_BARRIER: self._barrier,
            C.WORKSPACE_STOP: self._workspace_stop,
            C.WORKSPACE_START: self._workspace_start,
            C.STATE_SEED: self._state_seed,
        }

    # ---------------------------------------------------------------- apply
    def apply(self, command: dict) -> dict:
        """Apply one command; answer {"ok": True, ...} or {"ok": False, "error": ...}.
        Raises C.NewerFormat, changing nothing, for a command of a newer state format."""
        if isinstance(command, dict):
            newer = C.newer_than_known(command)
            if newer is not None:
                raise newer
        self.applied += 1
        name = command.get("cmd") if isinstance(command, dict) else None
        handler = self._handlers.get(name)
        if handler is None:
            return {"ok": False, "error": f"unknown command {name!r}"}
        try:
            result = handler(**command.get("args", {}))
        except (CommandRejected, TenantRejected, PreemptRejected, C.NewerFormat) as e:  # (a seed's newer state)
            return {"ok": False, "error": str(e)}
        except (TypeError, KeyError, ValueError) as e:
            return {"ok": False, "error": f"malformed {name}: {e}"}
        if name in _CHANGES_NODES:
            self.capacity_version += 1
        self.format_used = max(self.format_used, C.FORMAT_OF[name])
        return {"ok": True, **(result or {})}

    # ---------------------------------------------------------------- queries
    def has_active_jobs(self) -> bool:
        """Whether any job is queued or running (a workspace is a job)."""
        return bool(self._queued or self._running)

    def queued_jobs(self) -> list[Job]:
        return [self.jobs[i] for i in self._queued]

    def running_jobs(self) -> list[Job]:
        return [self.jobs[i] for i in self._running]

    def commitment(self, node: str) -> NodeCommitment:
        return self._commitments.get(node) or NodeCommitment()

    def array_tasks(self, parent: int) -> list[Job]:
        return [j for j in self.jobs.values() if j.array_parent == parent]

    def usage_copy(self) -> tuple[list[dict], list[dict]]:
        """The kept records' usage (never changed once set) and a copy of the summary's rows,
        for a report made outside the lock."""
        return [j.usage for j in self.jobs.values() if j.usage], self.usage.rows()

    def _account(self, job: Job, run_end: float | None) -> None:
        """The job is final now: keep its usage in its record (model/usage.py)."""
        def model_of(node: str, index: int) -> str:
            rec = self.nodes.get(node)
            return next((g.model for g in rec.gpus if g.index == index), "") if rec else ""
        job.usage = job_usage(job, model_of, run_end, job.ended_at if job.ended_at is not None else 0.0).to_dict()

    # ---------------------------------------------------------------- tenants and nodes
    def _node_register(self, name: str, gpus: list, cpus: float, mem_total_bytes: int,
                       at: float, address: str = "", containers: dict | None = None,
                       directlink: dict | None = None, rejoin: bool = False) -> dict:
        if name in self.removed and not rejoin:
            raise CommandRejected(f"member {name} was removed by an admin; it joins again when it is restarted")
        self.removed.pop(name, None)
        old = self.nodes.get(name)
        if containers is not None:
            containers = {"images": [str(i) for i in containers.get("images", [])],
                          "staged": {str(k): str(v) for k, v in dict(containers.get("staged") or {}).items()},
                          "failed": {str(k): str(v)[:500] for k, v in dict(containers.get("failed") or {}).items()},
                          "user_images": bool(containers.get("user_images", False))}
        if directlink is not None:
            directlink = {"id": str(directlink["id"]), "ssh_host_key": str(directlink.get("ssh_host_key", ""))[:400]}
        rec = NodeRecord(name, [GpuInventory(**g) for g in gpus], float(cpus), int(mem_total_bytes),
                         address=address, registered_at=at, containers=containers, directlink=directlink)
        if old is not None:
            rec.drained, rec.drain_reason, rec.registered_at = old.drained, old.drain_reason, old.registered_at
            rec.down, rec.down_reason = old.down, old.down_reason
        self.nodes[name] = rec
        return {"created": old is None}

    def _node_drain(self, name: str, reason: str = "", at: float = 0.0) -> dict:
        node = self._node(name)
        node.drained, node.drain_reason = True, reason or "drained by an admin"
        return {}

    def _node_resume(self, name: str, at: float = 0.0) -> dict:
        node = self._node(name)
        node.drained, node.drain_reason = False, ""
        return {}

    def _node_down(self, name: str, reason: str = "", at: float = 0.0) -> dict:
        node = self._node(name)
        node.down, node.down_reason = True, reason or "stopped reporting"
        return {}

    def _node_up(self, name: str, at: float = 0.0) -> dict:
        node = self._node(name)
        node.down, node.down_reason = False, ""
        return {}

    def _node_remove(self, name: str, at: float = 0.0, keep_out: bool = False) -> dict:
        self._node(name)
        busy = [j.id for j in self.running_jobs() if any(a.node == name for a in j.allocations)]
        if busy:
            raise CommandRejected(f"node {name!r} still runs jobs {busy}; drain it and let them finish first")
        del self.nodes[name]
        self._commitments.pop(name, None)
        if keep_out:
            self.removed[name] = at
        return {}

    def _sched_elect(self, node: str, epoch: int, at: float = 0.0) -> dict:
        """A new scheduler takes over; plans of any earlier one are refused from now on."""
        if epoch <= self.sched_epoch and node != self.scheduler:
            raise CommandRejected(f"scheduler epoch {epoch} is not newer than {self.sched_epoch}")
        self.sched_epoch = max(self.sched_epoch, epoch)
        self.scheduler = node
        return {"epoch": self.sched_epoch}

    def _node(self, name: str) -> NodeRecord:
        node = self.nodes.get(name)
        if node is None:
            raise CommandRejected(f"no node named {name!r}")
        return node

    # ---------------------------------------------------------------- jobs
    def _job_submit(self, tenant: str, uid: int, gid: int, spec: dict, at: float, key: str = "") -> dict:
        if key and key in self._by_key:  # proposed again after a leader change: it is in already
            ids = self._by_key[key]
            if self.jobs[ids[0]].tenant != tenant:
                raise CommandRejected(f"submission key {key!r} belongs to another tenant")
            return {"job_id": ids[0], "job_ids": list(ids)}
        job_spec = JobSpec.from_dict(spec)
        if tenant not in self.tenants:
            raise CommandRejected(f"unknown tenant {tenant!r}")
        for kind, ids in job_spec.after:
            for jid in ids:
                parent = self.jobs.get(jid)
                if parent is None or parent.tenant != tenant:
                    raise CommandRejected(f"after={kind}:{jid}: you have no job {jid} (a job can wait only for "
                                          "jobs of yours; `mt-job list` shows them)")
                if parent.spec.workspace is not None:
                    raise CommandRejected(f"after={kind}:{jid}: job {jid} is a workspace, which does not end; "
                                          "wait for a batch job")
        indices = job_spec.array.indices if job_spec.array else (None,)
        first = self.next_job_id
        ids = []
        for index in indices:
            jid = self.next_job_id
            self.next_job_id += 1
            job = Job(
                id=jid, tenant=tenant, uid=uid, gid=gid, spec=job_spec, submitted_at=at,
                array_parent=first if job_spec.array else None, array_index=index,
                log_path=f"logs/{uid}/{jid}.log", submit_key=key,
            )
            self.jobs[jid] = job
            self._queued[jid] = None
            ids.append(jid)
        if key:
            self._by_key[key] = ids
        self.tenants[tenant].last_seen_at = max(self.tenants[tenant].last_seen_at, at)
        return {"job_id": first, "job_ids": ids}

    def _job_submit_batch(self, submissions: list, at: float) -> dict:
        """Several submissions in one command (group commit): each is accepted or
        refused on its own, and the answers come back in order."""
        results = []
        for sub in submissions:
            try:
                results.append({"ok": True, **self._job_submit(at=at, **sub)})
            except CommandRejected as e:
                results.append({"ok": False, "error": str(e)})
            except (TypeError, KeyError, ValueError) as e:
                results.append({"ok": False, "error": f"malformed submission: {e}"})
        return {"results": results}

    def _job_start(self, job_id: int, allocations: list, at: float, attempt: int | None = None,
                   epoch: int | None = None) -> dict:
        if epoch is not None and epoch != self.sched_epoch:
            raise CommandRejected(f"plan of scheduler epoch {epoch} refused: epoch {self.sched_epoch} schedules now")
        job = self._job(job_id)
        if job.state is not JobState.QUEUED:
            raise CommandRejected(f"job {job_id} is {job.state.value}, not queued")
        if attempt is not None and attempt != job.attempt:
            raise CommandRejected(f"job {job_id} is at attempt {job.attempt}, plan was for {attempt}")
        allocs = tuple(NodeAllocation.from_dict(a) for a in allocations)
        if len(allocs) != job.spec.nodes:
            raise CommandRejected(f"job {job_id} needs {job.spec.nodes} node(s), plan gives {len(allocs)}")
        if len({a.node for a in allocs}) != len(allocs):
            raise CommandRejected(f"job {job_id}: a gang needs distinct nodes")
        for a in allocs:
            self._check_fits(job_id, a)
        job.state = JobState.RUNNING
        job.allocations = allocs
        job.started_at = at
        job.reason = ""
        del self._queued[job_id]
        self._running[job_id] = None
        for a in allocs:
            self._commit(a, +1)
        return {}

    def _check_fits(self, job_id: int, a: NodeAllocation) -> None:
        node = self._node(a.node)
        if node.unavailable_reason:
            raise CommandRejected(f"job {job_id}: node {a.node} is {node.unavailable_reason}")
        c = self.commitment(a.node)
        if c.cpus + a.cpus > node.cpus + _EPS:
            raise CommandRejected(f"job {job_id}: node {a.node} has {node.cpus - c.cpus:g} cpus left, not {a.cpus:g}")
        if c.mem_bytes + a.mem_bytes > node.mem_total_bytes:
            raise CommandRejected(f"job {job_id}: node {a.node} has not enough memory left")
        inventory = {g.index: g for g in node.gpus}
        seen: set[int] = set()
        for slot in a.gpus:
            if slot.index in seen:  # each slot is checked alone against the commitments below
                raise CommandRejected(f"job {job_id}: the plan gives GPU {slot.index} of {a.node} twice")
            seen.add(slot.index)
            inv = inventory.get(slot.index)
            if inv is None:
                raise CommandRejected(f"job {job_id}: node {a.node} has no GPU {slot.index}")
            g = c.gpus.get(slot.index) or GpuCommitment()
            if slot.mode is GpuMode.EXCLUSIVE:
                # no job of any mode there (a shared slot may reserve no share or VRAM)
                if g.exclusive or g.shared or g.oversubscribed or g.fraction > _EPS or g.vram_bytes:
                    raise CommandRejected(f"job {job_id}: GPU {slot.index} of {a.node} is in use")
            elif slot.mode is GpuMode.SHARED:
                if g.exclusive:
                    raise CommandRejected(f"job {job_id}: GPU {slot.index} of {a.node} is held exclusively")
                if g.fraction + slot.fraction > 1 + _EPS or g.vram_bytes + slot.vram_bytes > inv.vram_total_bytes:
                    raise CommandRejected(f"job {job_id}: GPU {slot.index} of {a.node} would be overcommitted")
            elif g.exclusive:
                raise CommandRejected(f"job {job_id}: GPU {slot.index} of {a.node} is held exclusively")

    def _commit(self, a: NodeAllocation, sign: int) -> None:
        c = self._commitments.setdefault(a.node, NodeCommitment())
        c.cpus += sign * a.cpus
        c.mem_bytes += sign * a.mem_bytes
        for slot in a.gpus:
            g = c.gpus.setdefault(slot.index, GpuCommitment())
            if slot.mode is GpuMode.EXCLUSIVE:
                g.exclusive += sign
                g.fraction += sign * 1.0
            elif slot.mode is GpuMode.SHARED:
                g.shared += sign
                g.fraction += sign * slot.fraction
                g.vram_bytes += sign * slot.vram_bytes
            else:
                g.oversubscribed += sign
            if abs(g.fraction) < _EPS:
                g.fraction = 0.0

    def _release(self, job: Job) -> None:
        if job.id in self._running:
            if any(a.cpus or a.mem_bytes or a.gpus for a in job.allocations):
                self.capacity_version += 1
            del self._running[job.id]
            for a in job.allocations:
                self._commit(a, -1)
        self._queued.pop(job.id, None)

    def _job_annotate(self, job_id: int, enforced: dict | None = None, reason: str | None = None,
                      master_port: int | None = None, attempt: int | None = None, ws: dict | None = None) -> dict:
        job = self._job(job_id)
        if ws is not None:
            if job.spec.workspace is None:
                raise CommandRejected(f"job {job_id} is not a workspace")
            job.ws = {**job.ws, **{str(k): v for k, v in dict(ws).items()}}
        if attempt is not None and attempt != job.attempt:
            raise CommandRejected(f"job {job_id} is at attempt {job.attempt}, note was for {attempt}")
        if master_port is not None:
            if job.master_port is not None and job.master_port != master_port:
                raise CommandRejected(f"job {job_id} already rendezvous on port {job.master_port}")
            job.master_port = master_port
        if enforced is not None:
            job.enforced = dict(enforced)
        if reason is not None:
            job.reason = reason
        return {}

    def _job_finish(self, job_id: int, at: float, exit_code: int | None = None, state: str | None = None,
                    reason: str = "", attempt: int | None = None, rank: int | None = None) -> dict:
        """The job (or, for a gang, one rank) ended. A gang completes when every rank
        ended with status 0, and fails as soon as one rank fails."""
        _check_reason(reason)
        job = self._job(job_id)
        if job.state is not JobState.RUNNING:
            raise CommandRejected(f"job {job_id} is {job.state.value}, not running")
        if attempt is not None and attempt != job.attempt:
            raise CommandRejected(f"job {job_id} is at attempt {job.attempt}, report was for {attempt}")
        if rank is not None and len(job.allocations) > 1:
            if not 0 <= rank < len(job.allocations):
                raise CommandRejected(f"job {job_id} has no rank {rank}")
            if state is None and exit_code == 0:
                job.rank_exits[str(rank)] = 0
                if len(job.rank_exits) < len(job.allocations):
                    return {"final": False}
            elif not reason.startswith("rank "):
                node = job.allocations[rank].node
                reason = f"rank {rank} on {node}: {reason or f'exited with status {exit_code}'}"
        final = JobState(state) if state else (JobState.COMPLETED if exit_code == 0 else JobState.FAILED)
        if not final.final:
            raise CommandRejected(f"{final.value} is not a final state")
        if job.preempt is not None:  # however it ended, it ended because it was preempted
            how = f"it exited with status {exit_code}" if exit_code is not None else (reason or final.value)
            return self._preempted_end(job, at, how)
        self._release(job)
        if job.spec.workspace is not None and final is not JobState.LOST:
            # A workspace's main process ended (or it could not start): it holds nothing
            # now and keeps its container; `mt-container start` runs it again.
            what = reason or (f"its command exited with status {exit_code}" if exit_code is not None else final.value)
            job.state, job.exit_code, job.ended_at = JobState.STOPPED, exit_code, at
            job.reason = f"stopped: {what}"
            return {"final": False}
        job.state, job.exit_code, job.ended_at, job.reason = final, exit_code, at, reason
        self._account(job, at)
        return {"final": True}

    def _job_cancel(self, job_id: int, at: float, by: str = "", reason: str = "") -> dict:
        job = self._job(job_id)
        if job.state.final:
            raise CommandRejected(f"job {job_id} is already {job.state.value}")
        was = job.state
        # a running attempt held its reservation until now, a stopped workspace's until it stopped
        run_end = at if was is JobState.RUNNING else (job.ended_at if was is JobState.STOPPED else None)
        self._release(job)
        job.state, job.ended_at, job.preempt = JobState.CANCELLED, at, None
        job.reason = reason or (f"cancelled by {by}" if by else "cancelled")
        self._account(job, run_end)
        return {"was": was.value}

    def _job_requeue(self, job_id: int, at: float, reason: str = "", attempt: int | None = None) -> dict:
        """Back to the queue as a new attempt (its member failed, or fenced it). The attempt
        is kept in the job's history, so a late report from its member can be placed."""
        _check_reason(reason)
        job = self._job(job_id)
        if job.state is not JobState.RUNNING:
            raise CommandRejected(f"job {job_id} is {job.state.value}, not running")
        if attempt is not None and attempt != job.attempt:
            raise CommandRejected(f"job {job_id} is at attempt {job.attempt}, requeue was for {attempt}")
        if job.preempt is not None:
            return self._preempted_end(job, at, reason or "it was stopped")
        job.history.append({"attempt": job.attempt, "nodes": [a.node for a in job.allocations],
                            "allocations": [a.to_dict() for a in job.allocations], "started_at": job.started_at,
                            "ended_at": at, "outcome": f"requeued: {reason}" if reason else "requeued"})
        self._release(job)
        job.state, job.allocations, job.started_at = JobState.QUEUED, (), None
        job.master_port, job.rank_exits = None, {}
        job.attempt += 1
        job.reason = reason
        node = job.ws.get("node")
        if job.spec.workspace is not None and node and job.spec.server != node:
            job.spec = replace(job.spec, server=node)  # its container and layer are there
        self._queued[job_id] = None
        return {"attempt": job.attempt}

    def _job_late_report(self, job_id: int, attempt: int, node: str, at: float, exit_code: int | None = None,
                         state: str | None = None, reason: str = "") -> dict:
        """The member of a requeued attempt is back and says that attempt ended there by
        itself. While the requeued copy has not started, that is the job's outcome (it ran
        once); afterwards the job's history notes that this attempt also ran.

        The copy has not started while it is queued, and also while it is placed on the
        reporting member itself: that member's agent starts no run of a job whose earlier
        run it still holds unreported (reconcile)."""
        _check_reason(reason)
        job = self._job(job_id)
        entry = next((h for h in job.history if h["attempt"] == attempt and node in h["nodes"]), None)
        if entry is None:
            raise CommandRejected(f"job {job_id} has no attempt {attempt} requeued off {node}")
        if "late" in entry:
            raise CommandRejected(f"job {job_id}: attempt {attempt} was already reported late")
        final = JobState(state) if state else (JobState.COMPLETED if exit_code == 0 else JobState.FAILED)
        if not final.final:
            raise CommandRejected(f"{final.value} is not a final state")
        placed_back = job.state is JobState.RUNNING and [a.node for a in job.allocations] == [node]
        taken = (len(entry["nodes"]) == 1 and job.attempt == attempt + 1
                 and (job.state is JobState.QUEUED or placed_back))
        entry["late"] = {"state": final.value, "exit_code": exit_code, "reason": reason, "at": at, "taken": taken}
        if taken:
            self._release(job)
            job.state, job.exit_code, job.ended_at = final, exit_code, at
            job.attempt, job.started_at = attempt, entry["started_at"]
            job.allocations = tuple(NodeAllocation.from_dict(a) for a in entry["allocations"])
            entry["outcome"] += "; its member came back with this attempt's end before the copy started: taken"
            job.reason = reason or f"ran on {node}, which reported its end after it had been marked down"
            self._account(job, at)
        return {"taken": taken}

    def _workspace_stop(self, job_id: int, at: float, reason: str = "", attempt: int | None = None) -> dict:
        """Stop a workspace: its reservation is released, its container (with its writable
        layer) is kept on its member, stopped there by that member's agent."""
        _check_reason(reason)
        job = self._workspace(job_id)
        if job.state not in (JobState.QUEUED, JobState.RUNNING):
            raise CommandRejected(f"workspace {job.spec.workspace.name!r} is {job.state.value}, not running or queued")
        if attempt is not None and attempt != job.attempt:
            raise CommandRejected(f"workspace job {job_id} is at attempt {job.attempt}, the stop was for {attempt}")
        self._release(job)
        job.state, job.ended_at, job.exit_code = JobState.STOPPED, at, None
        job.reason = reason if reason.startswith("stopped") else (f"stopped: {reason}" if reason else "stopped")
        return {}

    def _workspace_start(self, job_id: int, at: float) -> dict:
        """Queue a stopped workspace again, as a new attempt. Once its container exists on
        a member, it is pinned there: its writable layer does not move (docs/WORKSPACES.md)."""
        job = self._workspace(job_id)
        if job.state is not JobState.STOPPED:
            raise CommandRejected(f"workspace {job.spec.workspace.name!r} is {job.state.value}, not stopped")
        node = job.ws.get("node")
        if node:
            if node not in self.nodes:
                raise CommandRejected(
                    f"workspace {job.spec.workspace.name!r}: its container is on {node}, which left the cluster; "
                    "remove the workspace (mt-container rm) and create it again")
            if job.spec.server != node:
                job.spec = replace(job.spec, server=node)
        job.history.append({"attempt": job.attempt, "nodes": [a.node for a in job.allocations],
                            "allocations": [a.to_dict() for a in job.allocations], "started_at": job.started_at,
                            "ended_at": job.ended_at, "outcome": job.reason or "stopped"})
        job.state, job.allocations, job.started_at, job.ended_at = JobState.QUEUED, (), None, None
        job.exit_code, job.reason = None, ""
        job.attempt += 1
        self._queued[job_id] = None
        return {"attempt": job.attempt}

    def _workspace(self, job_id: int) -> Job:
        job = self._job(job_id)
        if job.spec.workspace is None:
            raise CommandRejected(f"job {job_id} is a batch job, not a workspace")
        return job

    def _barrier(self, at: float = 0.0) -> dict:
        """Changes nothing. The scheduler commits one before it changes the Raft
        membership: committing it commits every entry before it, so no two membership
        changes are ever pending at once."""
        return {}

    def _state_seed(self, state: dict, at: float = 0.0, source: str = "") -> dict:
        """A new cluster takes a backup's state (docs/INSTALL.md "Backup and restore"): its
        jobs, tenants (uid/gid), keys, invitations and usage; the nodes registered now stay,
        the seed's others join them marked down (they never report here). Never over a state
        that holds jobs or tenants; never a seed with running jobs (restore requeued them)."""
        if self.jobs or self.tenants:
            raise CommandRejected(f"the state holds {len(self.jobs)} jobs and {len(self.tenants)} tenants already: "
                                  "only a new, empty cluster takes a backup as its seed")
        seed = StateMachine.from_dict(state)
        if seed._running:
            raise CommandRejected(f"the seed holds running jobs {sorted(seed._running)}; `mtgpu-setup restore` "
                                  "requeues them first")
        self.tenants, self.invites, self.usage = seed.tenants, seed.invites, seed.usage
        self.retired_ids |= seed.retired_ids
        for name, rec in seed.nodes.items():
            if name not in self.nodes and name not in self.removed:
                rec.down, rec.down_reason = True, f"restored from {source or 'a backup'}; it has not reported here"
                self.nodes[name] = rec
        self.jobs, self._queued, self._by_key = seed.jobs, seed._queued, seed._by_key
        self.next_job_id = max(self.next_job_id, seed.next_job_id, max(seed.jobs, default=0) + 1)
        return {"jobs": len(seed.jobs), "tenants": len(seed.tenants)}

    def _job_forget(self, job_id: int, at: float = 0.0) -> dict:
        job = self._job(job_id)
        if not job.state.final:
            raise CommandRejected(f"job {job_id} is {job.state.value}; only finished jobs can be forgotten")
        if job.usage is None:
            self._account(job, job.ended_at if job.started_at is not None else None)
        self.usage.fold(JobUsage.from_dict(job.usage), at)  # its usage outlives its record
        del self.jobs[job_id]
        ids = self._by_key.get(job.submit_key)
        if ids is not None:
            ids.remove(job_id)
            if not ids:
                del self._by_key[job.submit_key]
        return {}

    def _job(self, job_id: int) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise CommandRejected(f"no job {job_id}")
        return job

    # ---------------------------------------------------------------- snapshots
    def to_dict(self) -> dict:
        return {
            # the newest state format of anything in it: a snapshot of a cluster that applied
            # nothing newer is read by an older member (one not upgraded yet) as before
            "version": self.format_used,
            "applied": self.applied,
            "next_job_id": self.next_job_id,
            "sched_epoch": self.sched_epoch,
            "scheduler": self.scheduler,
            "tenants": [t.to_dict() for t in self.tenants.values()],
            "invites": {h: i.to_dict() for h, i in self.invites.items()},
            "retired_ids": sorted(self.retired_ids),
            "nodes": [n.to_dict() for n in self.nodes.values()],
            "removed": dict(self.removed),
            "jobs": [j.to_dict() for j in self.jobs.values()],
            "usage": self.usage.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "StateMachine":
        version = d.get("version", 1)
        if not isinstance(version, int) or version > C.STATE_FORMAT:
            raise C.NewerFormat("the state snapshot", version if isinstance(version, int) else None)
        sm = cls()
        sm.format_used = version
        sm.applied = d["applied"]
        sm.next_job_id = d["next_job_id"]
        sm.sched_epoch = d.get("sched_epoch", 0)
        sm.scheduler = d.get("scheduler", "")
        for t in d["tenants"]:
            sm.tenants[t["name"]] = TenantRecord.from_dict(t)
        sm.invites = {h: Invite(**i) for h, i in d.get("invites", {}).items()}
        sm.retired_ids = set(d.get("retired_ids", []))
        for n in d["nodes"]:
            sm.nodes[n["name"]] = NodeRecord.from_dict(n)
        sm.removed = {str(k): float(v) for k, v in d.get("removed", {}).items()}
        for jd in d["jobs"]:
            job = Job.from_dict(jd)
            sm.jobs[job.id] = job
        sm.usage = UsageSummary.from_dict(d.get("usage"))  # absent in snapshots from before accounting
        for jid in sorted(sm.jobs):
            job = sm.jobs[jid]
            if job.submit_key:
                sm._by_key.setdefault(job.submit_key, []).append(jid)
            if job.state.final and job.usage is None:  # finished before accounting: from its record
                sm._account(job, job.ended_at if job.started_at is not None else None)
            if job.state is JobState.QUEUED:
                sm._queued[jid] = None
            elif job.state is JobState.RUNNING:
                sm._running[jid] = None
                for a in job.allocations:
                    sm._commit(a, +1)
        return sm

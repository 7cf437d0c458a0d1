"""This member's services: what the API routes call. Reads come from this member's
copy of the state; changes are commands committed through the store (journal or
Raft), so `mt-job` works the same on every member of a cluster."""

from __future__ import annotations

import base64
import functools
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path

from fastapi.concurrency import run_in_threadpool

from ...agent.podman.images import ImageError
from ...agent.podman.setup import SAVED_PREFIX
from ...agent.podman.tenant import PODMAN, PodmanSetupError
from ...agent.runners.base import RunnerError
from ...jobfile import JobFileError, read_job_file
from ...model.job import Job, JobSpec, JobState
from ...model.usage import UsageError, parse_day
from ...model.usage_report import usage_report
from ...sched import check_satisfiable
from ...state import commands as C
from ...state.backup import mtgpu_version
from ...state.store import ReplicationError, commit
from ..cluster.errors import ClusterSetupError
from ...storage.quota import check_submission, detect_quota_backend, quota_warning
from .batching import SubmitBatcher, commit_until_decided
from ...accounts.lookup import tenant_home_of
from .identity import Caller
from ..member.own_images import (OwnImageCheck, OwnImageError, in_store, missing, own_image_check, pinned,
                                 unreadable_image)
from ..member.retention import apply_retention, retention_report
from ..member.runtime import Member
from ..member.view import build_snapshot

log = logging.getLogger(__name__)
_version_once = functools.lru_cache(maxsize=1)(mtgpu_version)  # what this process runs, said in health


MAX_SCRIPT_BYTES = 1 << 20


@dataclass(frozen=True)
class LogSource:
    """A job's log of one rank: on which member, at which path there (when it is this
    member; None: there is none), and the job's state when it was asked for."""

    job_id: int
    rank: int
    node: str
    path: Path | None
    final: bool
    state: str


class ServiceError(Exception):
    """An answer for the caller: HTTP status plus a message that says what and how to fix."""

    def __init__(self, status: int, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.refused = refused


class MemberService:
    def __init__(self, member: Member) -> None:
        self.member = member
        self.config = member.config
        self.node_name = member.node_name
        self.state_dir = member.state_dir
        self.store = member.store
        self.batcher = SubmitBatcher(member.store, member.clock)
        self.directlink = None  # server/member/directlink.MemberDirectLink when [DIRECTLINK] has relays
        self.disk = None
        if member.config.USER_DISK_LIMIT:
            choice = detect_quota_backend(member.config.TENANT_HOME_ROOT)
            self.disk = choice.backend
            log.info("USER_DISK_LIMIT %d bytes, enforced by %s", member.config.USER_DISK_LIMIT, choice.reason)

    def apply(self, cmd_name: str, /, **args) -> dict:
        try:
            return commit(self.store, cmd_name, **args)
        except ReplicationError as e:  # no leader, no quorum
            raise ServiceError(503, f"the cluster could not record this change: {e}") from None

    def clock(self) -> float:
        return self.member.clock()

    def wake(self) -> None:
        self.member.wake()

    # ------------------------------------------------------------ services for the API
    async def submit(self, caller: Caller, script: str, overrides: dict[str, str], workdir: str | None) -> dict:
        """Runs on the event loop: parsing and checks are quick, and the commit is
        awaited (group-committed with concurrent submissions), not waited for in a thread."""
        self._authorized(caller)
        if len(script) > MAX_SCRIPT_BYTES:
            raise ServiceError(422, f"refused: the job file has {len(script)} characters, more than {MAX_SCRIPT_BYTES}; "
                                    "keep data in files and let the script read them", refused=True)
        if workdir is not None and (not workdir.startswith("/") or "\0" in workdir):
            raise ServiceError(422, f"refused: workdir {workdir!r} must be an absolute path", refused=True)
        try:
            # The node's JOB_REQUEUE for a job that says nothing of requeue (Slurm's JobRequeue)
            parsed = read_job_file(script, overrides, {"requeue": "yes" if self.config.JOB_REQUEUE else "no"})
        except JobFileError as e:
            raise ServiceError(422, f"job file refused: {e}", refused=True) from None
        spec = replace(parsed.spec, submit_dir=workdir) if workdir else parsed.spec
        if workdir and not spec.workdir:
            spec = replace(spec, workdir=workdir)
        elif spec.workdir and not spec.workdir.startswith("/"):
            # A relative workdir= is the submitter's: below where it submitted from, else its home.
            base = workdir or tenant_home_of(self.config.TENANT_HOME_ROOT, caller.name, caller.uid)
            spec = replace(spec, workdir=os.path.normpath(os.path.join(base, spec.workdir)))
        out = await self.submit_spec(caller, spec)
        # one line each, for the submitter's stderr: #SBATCH options with no effect here,
        # #MTGPU lines that win over #SBATCH ones, directives below the first command
        out["warnings"] = list(parsed.warnings) + out.get("warnings", [])
        return out

    async def submit_spec(self, caller: Caller, spec: JobSpec, what: str = "job") -> dict:
        """Commit a parsed request (a job, or a workspace: `what`) as the caller's, after the
        checks every submission passes: satisfiable somewhere, the caller's disk quota."""
        image = spec.container or ""
        if image.startswith(SAVED_PREFIX) and image[len(SAVED_PREFIX):].split("/", 1)[0] != caller.name:
            raise ServiceError(403, f"refused: container={image} is another tenant's saved workspace; use your own "
                                    f"({SAVED_PREFIX}{caller.name}/...) or an image the cluster offers", refused=True)
        machine = self.store.machine
        with self.store.lock:
            snapshot = build_snapshot(machine, {})
        bad = unreadable_image(spec, snapshot)  # before podman is handed it, here or on another member
        if bad:
            raise ServiceError(422, f"refused: {bad}", refused=True)
        own = own_image_check(spec, snapshot, self.node_name)
        note = None
        if own is not None:  # a tenant's own image: in its store here, or refused now (member/own_images.py)
            spec, note = await run_in_threadpool(self._own_image, caller, spec, own)
        reason = check_satisfiable(spec, snapshot)
        if reason:
            raise ServiceError(422, f"refused: no node of this cluster can ever run this {what}: {reason}", refused=True)
        warning = await run_in_threadpool(self._check_disk, caller)
        now = self.clock()
        t = machine.tenants.get(caller.name)
        if t is None or t.uid != caller.uid:
            try:
                r = await commit_until_decided(self.store, C.command(C.TENANT_ENSURE, name=caller.name,
                                                                     uid=caller.uid, gid=caller.gid, at=now))
            except ReplicationError as e:
                raise ServiceError(503, f"the cluster could not record this change: {e}") from None
            if not r["ok"]:
                raise ServiceError(409, f"tenant {caller.name!r}: {r['error']}")
        try:
            r = await self.batcher.submit(tenant=caller.name, uid=caller.uid, gid=caller.gid, spec=spec.to_dict())
        except Exception as e:  # replication: no leader, no quorum
            raise ServiceError(503, f"the cluster could not record this change: {e}") from None
        if not r["ok"]:
            raise ServiceError(422, f"refused: {r['error']}", refused=True)
        self.wake()
        out = {"job_id": r["job_id"], "job_ids": r["job_ids"]}
        if warning:
            out["warning"] = warning
        if note:
            out["warnings"] = [note]
        return out

    def _own_image(self, caller: Caller, spec: JobSpec, own: OwnImageCheck) -> tuple[JobSpec, str | None]:
        setup = self.member.agent.containers
        if setup is None or caller.uid < 1000:  # no store to look in: the runner refuses a system account's
            return spec, None
        home = tenant_home_of(self.config.TENANT_HOME_ROOT, caller.name, caller.uid)
        try:
            found = in_store(setup.podman.ready(caller.uid, caller.gid, home), own.image)
        except (PodmanSetupError, OwnImageError, OSError) as e:
            raise ServiceError(500, f"container={own.image}: your store on {self.node_name} could not be read: "
                                    f"{e}") from None
        if not found:
            raise ServiceError(422, f"refused: {missing(own, caller.name)}", refused=True)
        return pinned(spec, own)

    def _check_disk(self, caller: Caller) -> str | None:
        """Refuse a tenant at or over USER_DISK_LIMIT (with the figures); warn near it.
        Running jobs are left alone."""
        if self.disk is None:
            return None
        limit = self.config.USER_DISK_LIMIT
        home = Path(self.config.TENANT_HOME_ROOT) / caller.name
        reading = self.disk.usage(caller.name, caller.uid, self.clock())
        refusal = check_submission(caller.name, reading.used_bytes, limit, home)
        if refusal:
            raise ServiceError(422, f"refused: {refusal}", refused=True)
        return quota_warning(caller.name, reading.used_bytes, limit, home)

    @property
    def cluster_id(self) -> str:
        return self.config.CLUSTER_ID or self.config.NODE_NAME

    def _authorized(self, caller: Caller) -> None:
        """An invited tenant uses only the clusters it is authorized for, also from a shell on a node."""
        t = self.store.machine.tenants.get(caller.name)
        if t is not None and t.managed and t.uid == caller.uid and self.cluster_id not in t.clusters:
            raise ServiceError(403, f"refused: tenant {caller.name!r} is not authorized for cluster {self.cluster_id!r}")

    def _visible_job(self, caller: Caller, job_id: int) -> Job:
        job = self.store.machine.jobs.get(job_id)
        if job is None or not (caller.is_admin or job.uid == caller.uid):
            # Another tenant's job is indistinguishable from no job at all.
            raise ServiceError(404, f"no job {job_id} of yours; `mt-job list` shows your jobs")
        return job

    def pending_reason(self, job: Job) -> str:
        reasons = self.member.scheduler.pending_reasons if self.member.is_scheduler() else \
            self.member.link.pending_reasons()
        pending = reasons.get(job.id) or "waiting for the next scheduling pass"
        return f"{job.reason}; waiting: {pending}" if job.reason else pending

    def job_json(self, job: Job) -> dict:
        d = job.to_dict()
        d["name"] = job.spec.name or f"job-{job.id}"
        d["nodes"] = [a.node for a in job.allocations]
        d["gpus"] = [{"node": a.node, "index": g.index, "fraction": g.fraction, "vram_bytes": g.vram_bytes,
                      "mode": g.mode.value} for a in job.allocations for g in a.gpus]
        if job.state is JobState.QUEUED:
            d["reason"] = self.pending_reason(job)
        d["log_path"] = str(self.state_dir / job.log_path)
        return d

    def list_jobs(self, caller: Caller, all_tenants: bool = False, include_final: bool = True) -> list[dict]:
        self._authorized(caller)
        with self.store.lock:
            jobs = list(self.store.machine.jobs.values())
        if not (all_tenants and caller.is_admin):
            jobs = [j for j in jobs if j.uid == caller.uid]
        if not include_final:
            jobs = [j for j in jobs if not j.state.final]
        return [self.job_json(j) for j in sorted(jobs, key=lambda j: j.id)]

    def show(self, caller: Caller, job_id: int) -> dict:
        return self.job_json(self._visible_job(caller, job_id))

    def cancel(self, caller: Caller, job_id: int) -> dict:
        job = self._visible_job(caller, job_id)
        targets = [job]
        if job.array_parent == job.id:  # cancelling an array's id cancels every task
            targets = [j for j in self.store.machine.array_tasks(job.id)]
        cancelled = []
        for j in targets:
            if j.state.final:
                continue
            r = self.apply(C.JOB_CANCEL, job_id=j.id, at=self.clock(), by=caller.name)
            if r["ok"]:
                cancelled.append(j.id)
        if not cancelled and job.state.final:
            raise ServiceError(409, f"job {job_id} is already {job.state.value}; nothing to cancel")
        self.wake()
        return {"cancelled": cancelled}

    def log_source(self, caller: Caller, job_id: int, rank: int = 0) -> LogSource:
        """Where the caller's job's log (of one rank) is, and whether the job had ended:
        read before the log itself, so that a final answer holds the whole log."""
        job = self._visible_job(caller, job_id)
        ranks = max(1, len(job.allocations))
        if not 0 <= rank < ranks:
            raise ServiceError(422, f"job {job_id} has no rank {rank}: it runs on {ranks} node(s), so its ranks are "
                                    f"0-{ranks - 1}", refused=True)
        node = job.allocations[rank].node if job.allocations else self.node_name
        if not self.member.link.is_cluster:
            node = self.node_name
        return LogSource(job_id, rank, node, self.state_dir / job.rank_log_path(rank), job.state.final,
                         job.state.value)

    def podman_env(self, caller: Caller, load: list[str] | None = None, enter: str | None = None,
                   features: list[str] | None = None) -> dict:
        """mt-podman: the caller's rootless podman settings on this node, prepared now
        when needed (agent/podman/tenant.py). `load`: images staged here to put in the
        caller's store first (a devcontainer build's base images). `enter`: the container
        the caller is about to `podman exec` into: when it is one of its running jobs or
        workspaces here, the calling process is moved into that job's cgroup first, so the
        session is fenced to the job's GPUs (docs/ISOLATION.md); "entered" says which job.
        `features`: Features staged here ([CONTAINERS] features) the caller's build needs: each
        staged one comes back as its archive (read and checked at start, base64), its path
        and SHA-256; one not staged here is left out."""
        setup = self.member.agent.containers
        if setup is None:
            raise ServiceError(409, f"containers are off on {self.node_name} ([CONTAINERS] enabled = false); an admin "
                                    "sets [CONTAINERS] enabled = true")
        if caller.uid < 1000:
            raise ServiceError(403, f"{caller.name} is a system account: mt-podman is for tenants")
        home = tenant_home_of(self.config.TENANT_HOME_ROOT, caller.name, caller.uid)
        try:
            t = setup.podman.ready(caller.uid, caller.gid, home)
        except (PodmanSetupError, OSError) as e:
            raise ServiceError(500, f"podman could not be prepared for {caller.name}: {e}") from None
        loaded = []
        for image in load or ():
            if image in setup.images.state.ready:
                try:
                    setup.images.ensure_loaded(t, image)
                except (ImageError, OSError) as e:
                    raise ServiceError(500, f"image {image} could not be loaded for {caller.name}: {e}") from None
                loaded.append(image)
        staged = {ref: {"archive": a.path, "sha256": a.sha256, "data": base64.b64encode(a.data).decode("ascii")}
                  for ref in features or () if (a := setup.settings.features.get(ref)) is not None}
        return {"env": t.env(), "podman": PODMAN, "loaded": loaded, "entered": self._place_podman(caller, enter),
                "features": staged}

    def _place_podman(self, caller: Caller, enter: str | None) -> int | None:
        """Where the caller's podman runs (its own process, the socket's peer, is moved before
        it execs podman): in the cgroup of its job whose container is `enter` (the job's id
        is returned); else, unless it already runs inside one of its jobs, in the sessions
        group, which holds no GPU (what a tenant's podman starts outside its jobs stays in
        its caller's group on cgroup v1: docs/ISOLATION.md)."""
        runner = self.member.agent.runner
        cgroups = getattr(runner, "cgroups", None)
        if cgroups is None:
            return None
        self._check_peer(caller)
        if enter:
            try:
                job_id = runner.enter_container(enter, caller.uid, caller.pid)
            except RunnerError as e:
                raise ServiceError(500, str(e)) from None
            if job_id is not None:
                return job_id
        if cgroups.job_of(caller.pid) is None:
            why = cgroups.place_sessions(caller.pid)
            if why:
                log.warning("%s's podman (pid %d) runs where it was started: %s", caller.name, caller.pid, why)
        return None

    @staticmethod
    def _check_peer(caller: Caller) -> None:
        try:  # the peer must still be the caller's process: a pid is moved, not a connection
            with open(f"/proc/{caller.pid}/status") as f:
                uids = next(ln for ln in f if ln.startswith("Uid:")).split()[1:3]
        except (OSError, StopIteration):
            uids = []
        if [str(caller.uid)] * 2 != uids:
            raise ServiceError(409, f"the calling process {caller.pid} is gone or no longer {caller.name}'s; "
                                    f"run the command again")

    def nodes(self, caller: Caller) -> list[dict]:
        """Every member with its role, state, GPUs and live use (from the scheduler's
        telemetry; a member that does not schedule asks the one that does)."""
        standing = self.member.link.standing()
        if not self.member.is_scheduler() and standing.in_touch:
            remote = self.member.link.leader_nodes()
            if remote is not None:
                return remote
        view = self.nodes_view()
        if not standing.in_touch:
            for n in view:  # the last committed roles and states are not the current ones
                if n["name"] != self.node_name:
                    n["state"], n["reason"] = "unknown", standing.problem
                    n["role"] += "?"
                else:  # its own: cut off since when, and what still works here
                    n["role"], n["state"] = standing.role(n["role"]), standing.health
                    n["reason"], n["standing"] = standing.reason, standing.to_json()
        return view

    def nodes_view(self) -> list[dict]:
        machine = self.store.machine
        telemetry = self.member.scheduler.telemetry if self.member.is_scheduler() else \
            {self.node_name: self.member.local_telemetry}
        voters = set(self.member.link.voter_names())
        gaps = self.member.scheduler.longest_gap_s if self.member.is_scheduler() else {}
        formats = self._state_formats()
        out = []
        with self.store.lock:
            snapshot = build_snapshot(machine, telemetry)
            running = list(machine.running_jobs())
            models = {n.name: {g.index: g.model for g in n.gpus} for n in machine.nodes.values()}
            recs = dict(machine.nodes)
        for node in snapshot.nodes:
            tel = telemetry.get(node.name)
            rec = recs[node.name]
            role = "scheduler" if node.name == machine.scheduler else ("voter" if node.name in voters else "member")
            out.append({
                "name": node.name,
                "address": rec.address,
                "role": role,
                "state": "down" if rec.down else ("drained" if rec.drained else "up"),
                "reason": node.unschedulable_reason,
                "cpus": node.cpus_total,
                "cpus_committed": node.cpus_committed,
                "mem_total_bytes": node.mem_total_bytes,
                "mem_committed_bytes": node.mem_committed_bytes,
                "mem_available_bytes": node.mem_available_measured_bytes,
                "cpu_util_pct": tel.host.cpu_util_pct if tel and tel.host else None,
                "reported_at": tel.reported_at if tel else None,
                "longest_report_gap_s": gaps.get(node.name),
                "running_jobs": [j.id for j in running if any(a.node == node.name for a in j.allocations)],
                "containers": rec.containers,
                **formats.get(node.name, {}),
                "gpus": [{
                    "index": g.index, "vendor": g.vendor, "model": models[node.name].get(g.index, g.model),
                    "vram_total_bytes": g.vram_total_bytes, "vram_used_bytes": g.vram_used_measured_bytes,
                    "utilization_pct": g.utilization_pct, "committed_fraction": g.committed_fraction,
                    "committed_vram_bytes": g.committed_vram_bytes, "exclusive": g.exclusive,
                } for g in node.gpus],
            })
        return out

    def _state_formats(self) -> dict[str, dict]:
        """{member: {"mtgpu_version", "state_format"}}: this member's own, and on the
        scheduler what each member's last report said (server/cluster/formats.py)."""
        from ...state import commands as C
        from ...state.backup import mtgpu_version
        formats = getattr(self.member.link, "formats", None)
        out = dict(formats.versions()) if formats is not None and self.member.is_scheduler() else {}
        out[self.node_name] = {"mtgpu_version": mtgpu_version(), "state_format": C.STATE_FORMAT}
        return out

    def set_drain(self, caller: Caller, name: str, drain: bool, reason: str = "") -> dict:
        if not caller.is_admin:
            raise ServiceError(403, "draining a node needs root or the admin group")
        if drain:
            r = self.apply(C.NODE_DRAIN, name=name, reason=reason, at=self.clock())
        else:
            r = self.apply(C.NODE_RESUME, name=name, at=self.clock())
        if not r["ok"]:
            raise ServiceError(404, r["error"])
        self.wake()
        return {"node": name, "drained": drain}

    def backup(self, caller: Caller) -> dict:
        """The whole state, taken under its lock (state/backup.py): `mtgpu-admin backup`."""
        if not caller.is_admin:
            raise ServiceError(403, "a backup needs root or the admin group (it holds every tenant's records)")
        from ...state.backup import backup_document, mtgpu_version
        with self.store.lock:
            return backup_document(self.store.machine, self.config.NODE_NAME, self.config.CLUSTER_ID,
                                   self.config.CLUSTER_MODE, self.clock(), mtgpu_version())

    def retention(self, caller: Caller, dry_run: bool, as_of: float | None) -> dict:
        """Run (or only list) what JOB_RETENTION_DAYS and TENANT_RETENTION_DAYS remove at `as_of` (default: now)."""
        if not caller.is_admin:
            raise ServiceError(403, "retention needs root or the admin group")
        now = as_of if as_of is not None else self.clock()
        with self.store.lock:
            report = retention_report(self.store.machine, now, self.config.job_retention_s,
                                      self.config.tenant_retention_s, dry_run)
        try:
            problems = [] if dry_run else apply_retention(self.store, report)
        except ReplicationError as e:
            raise ServiceError(503, f"the cluster could not record this change: {e}") from None
        self.wake()
        return {**report.to_json(), "text": report.render(), "problems": problems}

    def usage(self, caller: Caller, since: str | None, until: str | None, by: str, mine: bool) -> dict:
        """Finished jobs' usage (docs/ACCOUNTING.md): every tenant's for an admin, else
        (`mine`) only the caller's own."""
        if mine:
            self._authorized(caller)
        elif not caller.is_admin:
            raise ServiceError(403, "every tenant's usage needs root or the admin group; tenants see their own "
                                    "with `mt-job usage`")
        try:
            since = parse_day(since, "since") if since else None
            until = parse_day(until, "until") if until else None
            with self.store.lock:
                records, rows = self.store.machine.usage_copy()
            return usage_report(records, rows, since, until, by, tenant=(caller.name, caller.uid) if mine else None)
        except UsageError as e:
            raise ServiceError(422, f"refused: {e}", refused=True) from None

    def remove_node(self, caller: Caller, name: str) -> dict:
        if not caller.is_admin:
            raise ServiceError(403, "removing a member needs root or the admin group")
        try:
            return self.member.link.handle_remove(name)
        except (ClusterSetupError, ReplicationError) as e:  # they carry their own explanation
            raise ServiceError(409, f"could not remove {name}: {e}") from None

    def info(self) -> dict:
        return {
            "node": self.node_name,
            "cluster_mode": self.config.CLUSTER_MODE,
            "cluster_id": self.config.CLUSTER_ID,
            "ssh_listen": self.config.SSH_LISTEN,
            "pid": os.getpid(),
            "version": _version_once(),  # the installed distribution's: `mtgpu-setup upgrade` waits for it
            "scheduler": self.store.machine.scheduler,
            "is_scheduler": self.member.is_scheduler(),
            "placements": self.member.scheduler.placements,
            "next_job_id": self.store.machine.next_job_id,  # moves only when a submission is recorded
            "last_placement_at": self.member.scheduler.last_placement_at,
            "raft": self.member.link.raft_info(),
            "standing": self.member.link.standing().to_json(),
            "directlink": self.directlink.summary() if self.directlink is not None else None,
        }


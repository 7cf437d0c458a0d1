"""The node's services: what the API routes call, and the scheduling loop.

The loop is the only writer of placements: it reaps ended jobs, enforces time
limits, asks the pure scheduler for a plan, commits each placement as a
state-machine command and only then has the agent start the process. It wakes on
every submission, cancellation and job end, and at least every TICK_S.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from ..agent.local import LocalAgent
from ..agent.runners.base import Launch, RunnerError
from ..config import Config
from ..jobfile import JobFileError, parse_job_file
from ..model.job import Job, JobState
from ..model.units import format_duration
from ..sched import check_satisfiable, schedule
from ..state import commands as C
from ..state.journal import JournaledState
from .identity import Caller, home_of, supplementary_groups
from .jobenv import job_env
from .view import NodeTelemetry, build_queue, build_snapshot

log = logging.getLogger(__name__)

TICK_S = 0.2
TELEMETRY_EVERY_S = 1.0


class ServiceError(Exception):
    """An answer for the caller: HTTP status plus a message that says what and how to fix."""

    def __init__(self, status: int, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.refused = refused


class NodeService:
    def __init__(self, config: Config, agent: LocalAgent, clock=time.time) -> None:
        self.config = config
        self.node_name = config.NODE_NAME
        self.state_dir = Path(config.STATE_DIR)
        self.agent = agent
        self.clock = clock
        self.state = JournaledState(self.state_dir / "state")
        self.telemetry: dict[str, NodeTelemetry] = {}
        self.pending_reasons: dict[int, str] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_telemetry = 0.0

    # ------------------------------------------------------------ life cycle
    def start(self) -> None:
        self._refresh_telemetry(force=True)
        self._register_node()
        self._recover()
        self._thread = threading.Thread(target=self._loop, name="mtgpu-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=5)
        self.state.close()
        self.agent.close()

    def apply(self, cmd_name: str, /, **args) -> dict:
        return self.state.apply(C.command(cmd_name, **args))

    def _register_node(self) -> None:
        tel = self.telemetry[self.node_name]
        gpus = [{"index": g.index, "vendor": g.vendor, "model": g.model, "vram_total_bytes": g.vram_total_bytes}
                for g in tel.gpus]
        host = tel.host
        rec = self.state.machine.nodes.get(self.node_name)
        wanted = {"gpus": gpus, "cpus": float(host.cpu_count), "mem_total_bytes": host.mem_total_bytes,
                  "address": self.config.LISTEN}
        if rec is None or any(rec.to_dict()[k] != v for k, v in wanted.items()):
            self.apply(C.NODE_REGISTER, name=self.node_name, at=self.clock(), **wanted)

    def _recover(self) -> None:
        """Re-attach to jobs that were running when this server last stopped.

        Still running: watched again. Ended meanwhile: its recorded exit status is
        committed. Committed but never spawned: requeued (it never ran). Spawned but
        gone without an exit record (e.g. the machine rebooted): `lost`."""
        mine = [j.id for j in self.state.machine.running_jobs()
                if any(a.node == self.node_name for a in j.allocations)]
        for r in self.agent.reattach(mine):
            job = self.state.machine.jobs[r.job_id]
            if r.outcome == "never-started":
                self.apply(C.JOB_REQUEUE, job_id=r.job_id, at=self.clock(),
                           reason="the server stopped before the job's process was started; requeued")
            elif r.outcome == "lost":
                self.apply(C.JOB_FINISH, job_id=r.job_id, at=self.clock(), state="lost", attempt=job.attempt,
                           reason="its processes were gone, with no exit record, when the server restarted")
                self.agent.forget(r.job_id)
            elif r.outcome == "ended":
                self._finish(r.job_id, r.exit)
            else:
                log.info("job %d re-attached after restart", r.job_id)

    # ------------------------------------------------------------ the loop
    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(TICK_S)
            self._wake.clear()
            try:
                self.run_once()
            except Exception:  # the loop must outlive any one bad pass
                log.exception("scheduling pass failed")

    def run_once(self) -> None:
        now = self.clock()
        self._refresh_telemetry()
        for job_id, info in self.agent.reap():
            self._finish(job_id, info)
        self._enforce_time_limits(now)
        self._schedule(now)

    def _refresh_telemetry(self, force: bool = False) -> None:
        now = self.clock()
        if not force and now - self._last_telemetry < TELEMETRY_EVERY_S:
            return
        gpus, host = self.agent.sample()
        self.telemetry[self.node_name] = NodeTelemetry(gpus=gpus, host=host, reported_at=now)
        self._last_telemetry = now

    def _finish(self, job_id: int, info) -> None:
        job = self.state.machine.jobs.get(job_id)
        if job is not None and job.state is JobState.RUNNING:
            if info.exit_code is None and info.signal is not None:
                self.apply(C.JOB_FINISH, job_id=job_id, at=self.clock(), state="failed", attempt=job.attempt,
                           reason=info.reason or f"killed by signal {info.signal}")
            else:
                reason = "" if info.exit_code == 0 else (info.reason or f"exited with status {info.exit_code}")
                self.apply(C.JOB_FINISH, job_id=job_id, at=self.clock(), exit_code=info.exit_code,
                           attempt=job.attempt, reason=reason)
        self.agent.forget(job_id)

    def _enforce_time_limits(self, now: float) -> None:
        for job in self.state.machine.running_jobs():
            limit = job.spec.time_limit_s
            if limit and job.started_at is not None and now - job.started_at > limit:
                self.agent.stop(job.id)
                self.apply(C.JOB_FINISH, job_id=job.id, at=self.clock(), state="failed", attempt=job.attempt,
                           reason=f"time limit {format_duration(limit)} reached; the job was stopped")

    def _schedule(self, now: float) -> None:
        machine = self.state.machine
        queue = build_queue(machine)
        if not queue:
            self.pending_reasons.clear()
            return
        with self.state.lock:
            snapshot = build_snapshot(machine, self.telemetry)
        plan = schedule(snapshot, queue, now)
        reasons = dict(plan.pending)
        reasons.update(plan.rejected)
        for placement in plan.placements:
            job = machine.jobs[placement.job_id]
            result = self.apply(C.JOB_START, job_id=job.id, at=self.clock(), attempt=job.attempt,
                                allocations=[a.to_dict() for a in placement.allocations])
            if not result["ok"]:
                reasons[job.id] = f"placement refused: {result['error']}"
                continue
            for rank, alloc in enumerate(job.allocations):
                if alloc.node == self.node_name:
                    self._launch(job, rank)
        self.pending_reasons = reasons

    def _launch(self, job: Job, rank: int) -> None:
        alloc = job.allocations[rank]
        tel = self.telemetry.get(self.node_name)
        node_gpus = tel.gpus if tel else []
        user = self._user_name(job)
        home = home_of(job.uid, str(Path(self.config.TENANT_HOME_ROOT) / job.tenant))
        env = job_env(job, rank, self.node_name, user, home, {g.vendor for g in node_gpus})
        workdir = job.spec.workdir or home
        launch = Launch(
            job_id=job.id, uid=job.uid, gid=job.gid, extra_gids=supplementary_groups(user, job.gid),
            home=home, workdir=workdir, script=job.spec.script, env=env,
            log_path=str(self.state_dir / job.log_path),
            cpus=alloc.cpus or None, mem_bytes=alloc.mem_bytes or None,
            gpu_vendor=alloc.vendor, gpu_indices=tuple(g.index for g in alloc.gpus),
            all_gpu_indices=tuple(g.index for g in node_gpus),
        )
        try:
            enforced = self.agent.start(launch)
        except (RunnerError, OSError) as e:
            self.apply(C.JOB_FINISH, job_id=job.id, at=self.clock(), state="failed", attempt=job.attempt,
                       reason=f"could not start on {self.node_name}: {e}")
            return
        self.apply(C.JOB_ANNOTATE, job_id=job.id, enforced=enforced)

    @staticmethod
    def _user_name(job: Job) -> str:
        import pwd

        try:
            return pwd.getpwuid(job.uid).pw_name
        except KeyError:
            return job.tenant

    # ------------------------------------------------------------ services for the API
    def submit(self, caller: Caller, script: str, overrides: dict[str, str], workdir: str | None) -> dict:
        try:
            spec = parse_job_file(script, overrides)
        except JobFileError as e:
            raise ServiceError(422, f"job file refused: {e}", refused=True) from None
        if workdir and not spec.workdir:
            spec = _replace(spec, workdir=workdir)
        machine = self.state.machine
        with self.state.lock:
            snapshot = build_snapshot(machine, self.telemetry)
        reason = check_satisfiable(spec, snapshot)
        if reason:
            raise ServiceError(422, f"refused: no node of this cluster can ever run this job: {reason}", refused=True)
        now = self.clock()
        t = machine.tenants.get(caller.name)
        if t is None or t.uid != caller.uid:
            r = self.apply(C.TENANT_ENSURE, name=caller.name, uid=caller.uid, gid=caller.gid, at=now)
            if not r["ok"]:
                raise ServiceError(409, f"tenant {caller.name!r}: {r['error']}")
        r = self.apply(C.JOB_SUBMIT, tenant=caller.name, uid=caller.uid, gid=caller.gid, spec=spec.to_dict(), at=now)
        if not r["ok"]:
            raise ServiceError(422, f"refused: {r['error']}", refused=True)
        self.wake()
        return {"job_id": r["job_id"], "job_ids": r["job_ids"]}

    def _visible_job(self, caller: Caller, job_id: int) -> Job:
        job = self.state.machine.jobs.get(job_id)
        if job is None or not (caller.is_admin or job.uid == caller.uid):
            # Another tenant's job is indistinguishable from no job at all.
            raise ServiceError(404, f"no job {job_id} of yours; `mt-job list` shows your jobs")
        return job

    def job_json(self, job: Job) -> dict:
        d = job.to_dict()
        d["name"] = job.spec.name or f"job-{job.id}"
        d["nodes"] = [a.node for a in job.allocations]
        d["gpus"] = [{"node": a.node, "index": g.index, "fraction": g.fraction, "vram_bytes": g.vram_bytes,
                      "mode": g.mode.value} for a in job.allocations for g in a.gpus]
        if job.state is JobState.QUEUED:
            d["reason"] = self.pending_reasons.get(job.id, job.reason or "waiting for the next scheduling pass")
        d["log_path"] = str(self.state_dir / job.log_path)
        return d

    def list_jobs(self, caller: Caller, all_tenants: bool = False, include_final: bool = True) -> list[dict]:
        with self.state.lock:
            jobs = list(self.state.machine.jobs.values())
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
            targets = [j for j in self.state.machine.array_tasks(job.id)]
        cancelled = []
        for j in targets:
            if j.state.final:
                continue
            was_running_here = j.state is JobState.RUNNING and j.id in self.agent.active()
            if was_running_here:
                self.agent.stop(j.id)
            r = self.apply(C.JOB_CANCEL, job_id=j.id, at=self.clock(), by=caller.name)
            if r["ok"]:
                cancelled.append(j.id)
        if not cancelled and job.state.final:
            raise ServiceError(409, f"job {job_id} is already {job.state.value}; nothing to cancel")
        self.wake()
        return {"cancelled": cancelled}

    def read_log(self, caller: Caller, job_id: int, offset: int, limit: int = 1 << 20) -> dict:
        job = self._visible_job(caller, job_id)
        path = self.state_dir / job.log_path
        data = b""
        try:
            with open(path, "rb") as f:
                f.seek(max(0, offset))
                data = f.read(limit)
        except FileNotFoundError:
            pass
        return {"data": data.decode("utf-8", "replace"), "offset": offset + len(data),
                "final": job.state.final, "state": job.state.value}

    def nodes(self, caller: Caller) -> list[dict]:
        out = []
        with self.state.lock:
            snapshot = build_snapshot(self.state.machine, self.telemetry)
        for node in snapshot.nodes:
            tel = self.telemetry.get(node.name)
            running = [j.id for j in self.state.machine.running_jobs() if any(a.node == node.name for a in j.allocations)]
            out.append({
                "name": node.name,
                "role": "scheduler" if node.name == self.node_name else "member",
                "state": "drained" if not node.schedulable else "up",
                "reason": node.unschedulable_reason,
                "cpus": node.cpus_total,
                "cpus_committed": node.cpus_committed,
                "mem_total_bytes": node.mem_total_bytes,
                "mem_committed_bytes": node.mem_committed_bytes,
                "mem_available_bytes": node.mem_available_measured_bytes,
                "cpu_util_pct": tel.host.cpu_util_pct if tel and tel.host else None,
                "running_jobs": running,
                "gpus": [{
                    "index": g.index, "vendor": g.vendor, "model": next(
                        (i.model for i in self.state.machine.nodes[node.name].gpus if i.index == g.index), g.model),
                    "vram_total_bytes": g.vram_total_bytes, "vram_used_bytes": g.vram_used_measured_bytes,
                    "utilization_pct": g.utilization_pct, "committed_fraction": g.committed_fraction,
                    "committed_vram_bytes": g.committed_vram_bytes, "exclusive": g.exclusive,
                } for g in node.gpus],
            })
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

    def info(self) -> dict:
        return {
            "node": self.node_name,
            "cluster_mode": self.config.CLUSTER_MODE,
            "cluster_id": self.config.CLUSTER_ID,
            "pid": os.getpid(),
            "version": "0.1.0",
        }


def _replace(spec, **kw):
    from dataclasses import replace

    return replace(spec, **kw)

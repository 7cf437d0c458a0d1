"""The agent's side of a member: carry out what `reconcile` decides (start, stop,
report), so this machine runs exactly what the committed state places on it.

Each pass reads the state (the local replica) and the runs of this machine, asks the
pure `reconcile.reconcile` for actions and applies them. A report that cannot be
committed now (no leader) is kept and sent again on the next pass. The agent never
places a job: it only carries out placements.
"""

from __future__ import annotations

import logging
import os
import pwd
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ...accounts.lookup import supplementary_groups, tenant_home_of
from ...agent.local import LocalAgent
from ...agent.runners.base import ENDED, LOST, RUNNING, UNSUPERVISED, Launch, RunnerError
from ...model.job import Job, JobState
from ...state import commands as C
from ...state.store import Store, try_commit
from .idle_watch import IdleWatch
from .vram_watch import VramWatch
from .image_gate import FAIL, WAIT, Fetch, ImageGate
from .jobenv import job_env, output_paths
from .reconcile import Forget, LateReport, PlacedRank, Preempt, Report, Start, Stop, reconcile

log = logging.getLogger(__name__)

LOG_SWEEP_EVERY_S = 60.0
WORKSPACE_SWEEP_EVERY_S = 1.0  # removed workspaces are looked for (a scan of every job) this often
MPS_CONTROL = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps") + "/control"


@dataclass(slots=True)
class _Unsent:
    """A report to commit; the run it reports on is forgotten once it is committed."""

    command: str
    args: dict


class AgentLoop:
    def __init__(self, store: Store, agent: LocalAgent, node_name: str, home_root: str, state_dir: Path,
                 clock, advertise_host: str = "127.0.0.1", lease=None, fetch_image: Fetch | None = None,
                 idle_timeout_s: float | None = None, vram_policy: str = "stop", vram_grace_s: float = 30.0) -> None:
        self.store = store
        self.agent = agent
        self.node_name = node_name
        self.home_root = home_root
        self.state_dir = Path(state_dir)
        self.clock = clock
        self.advertise_host = advertise_host
        self.lease = lease
        self._unsent: dict[int, _Unsent] = {}
        self._refused: set[tuple[int, int]] = set()  # (job, attempt) whose end report was refused
        self._preempting: dict[tuple[int, int], float] = {}  # (job, attempt) preempted -> when SIGTERM went
        self._lease_waits: set[tuple[int, int]] = set()  # (job, attempt) not started yet: the lease had lapsed
        self._next_log_sweep = 0.0
        self._jobs_known = 0
        self._node_vendors: set[str] = set()
        self.images = ImageGate(agent.containers, fetch_image, node_name)
        self.idle = IdleWatch(store, agent, node_name, idle_timeout_s)
        self.vram = VramWatch(node_name, vram_policy, vram_grace_s)
        self._next_vram_at = 0.0
        self._next_ws_sweep = 0.0  # time.monotonic() of the next look for removed workspaces
        self.mps = os.path.exists(MPS_CONTROL)  # NVIDIA MPS runs here: shared jobs get its memory limit too

    # ------------------------------------------------------------ start-up
    def recover(self) -> None:
        """Re-attach to the runs recorded on this machine when the server stopped."""
        for r in self.agent.recover():
            if r.outcome == RUNNING:
                log.info("job %d (attempt %d) re-attached after restart: it still runs", r.job_id, r.attempt)
            elif r.outcome == UNSUPERVISED:
                log.warning("job %d (attempt %d) re-attached after restart: it still runs, but its supervisor (shim) "
                            "is gone: its keeper records its end; this server fences it if the lease lapses",
                            r.job_id, r.attempt)
            elif r.outcome == ENDED:
                log.info("job %d (attempt %d) ended while the server was down; its end is reported", r.job_id,
                         r.attempt)
            elif r.outcome == LOST:
                ended = self.agent.runner.poll(r.job_id)
                log.warning("job %d (attempt %d): its processes were gone with no exit record (%s)", r.job_id,
                            r.attempt, ended.reason if ended is not None else "")
            else:
                log.info("job %d (attempt %d) had not started when the server stopped: it may start now", r.job_id,
                         r.attempt)

    # ------------------------------------------------------------ one pass
    def run_once(self, node_vendors: set[str], in_sync: bool = True) -> None:
        """One reconcile-and-apply pass. `in_sync`: this member reads the cluster's
        current state (see reconcile); when False it only reports the ends of runs."""
        self._node_vendors = node_vendors
        now, mono = self.clock(), time.monotonic()  # wall: for the record; monotonic: every interval
        self._send_reports()
        runs = self.agent.runs()
        if self._fence_unsupervised():
            runs = self.agent.runs()
        with self.store.lock:
            machine = self.store.machine
            me = machine.nodes.get(self.node_name)
            if me is not None and me.down:
                in_sync = False  # its jobs are being requeued: wait until the scheduler hears it again
            placed = [p for job in machine.running_jobs() if (p := self._placed(job)) is not None]
            if self._lease_waits:  # forget the waits of jobs no longer placed here
                self._lease_waits &= {(p.job_id, p.attempt) for p in placed}
            late_wanted = set()
            for job_id, run in runs.items():
                job = machine.jobs.get(job_id)
                if job is not None and job.spec.workspace is None and any(h["attempt"] == run.attempt and self.node_name in h["nodes"]
                                           and "late" not in h for h in job.history):
                    late_wanted.add((job_id, run.attempt))
        for action in reconcile(placed, runs, set(self._unsent), late_wanted, in_sync, now, self.node_name,
                                frozenset(self._refused), mono_now=mono):
            self._apply_action(action, runs)
        self._send_reports()
        self.remove_workspaces(set(runs))
        if in_sync:
            self._enforce_vram(mono, runs)
        if self.idle.timeout_s and in_sync:
            with self.store.lock:
                mine = [j for j in self.store.machine.running_jobs() if j.spec.workspace is not None
                        and self._my_rank(j) is not None and j.ws.get("container")]
            self.idle.run_once(mono, mine, at=now)
        jobs_known = len(self.store.machine.jobs)
        if mono >= self._next_log_sweep or jobs_known < self._jobs_known:  # jobs were forgotten
            self._next_log_sweep = mono + LOG_SWEEP_EVERY_S
            self.sweep_logs()
        self._jobs_known = jobs_known

    def _fence_unsupervised(self) -> list[int]:
        """A job whose supervisor died runs on with nobody to fence it (shim.py): once this
        member's lease has lapsed, this server kills it, as its shim would have, so that it
        never runs beside a copy the cluster requeued elsewhere."""
        age = self._lease_lapsed()
        if age is None:
            return []
        lease = self.lease
        fenced = self.agent.fence_unsupervised(
            f"fenced: this node's agent lost contact with the cluster for more than {lease.timeout_s:g}s; the job, "
            "whose supervisor (shim) had died, was stopped by the server so it cannot run twice")
        for job_id in fenced:
            log.warning("job %d: its supervisor is gone and this member's lease lapsed %.1fs ago: stopped", job_id,
                        age - lease.timeout_s)
        return fenced

    def _lease_lapsed(self) -> float | None:
        """How old this member's lease is, where it has lapsed (older than its timeout); None
        while it holds, and on a standalone node (no lease)."""
        lease = self.lease
        if lease is None or lease.at is None:
            return None
        age = time.monotonic() - lease.at
        return age if age > lease.timeout_s else None

    def _placed(self, job: Job) -> PlacedRank | None:
        rank = self._my_rank(job)
        if rank is None:
            return None
        return PlacedRank(job.id, job.attempt, rank, len(job.allocations), job.started_at, job.spec.time_limit_s,
                          job.spec.requeue, job.master_port, str(rank) in job.rank_exits,
                          float(job.preempt["grace_s"]) if job.preempt else None)

    def _apply_action(self, action, runs) -> None:
        if isinstance(action, Start):
            job = self.store.machine.jobs.get(action.placed.job_id)
            if job is not None and job.state is JobState.RUNNING and job.attempt == action.placed.attempt:
                self._start(job, action.placed.rank)
        elif isinstance(action, Stop):
            log.info("job %d: %s; stopping it", action.job_id, action.why)
            self.agent.stop(action.job_id)
        elif isinstance(action, Report):
            cmd = C.JOB_REQUEUE if action.command == "requeue" else C.JOB_FINISH
            args = {"attempt": action.attempt, **action.args}
            if cmd == C.JOB_FINISH:
                args["rank"] = action.rank
            self._unsent[action.job_id] = _Unsent(cmd, {"job_id": action.job_id, **args})
        elif isinstance(action, LateReport):
            e = action.ended
            args = {"exit_code": e.exit_code} if e.exit_code is not None else \
                {"state": "failed", "reason": e.reason or f"killed by signal {e.signal}"}
            if e.exit_code not in (None, 0):
                args["reason"] = e.reason or f"exited with status {e.exit_code}"
            log.info("job %d: attempt %d, requeued off this member, ended here; reporting it late", action.job_id,
                     action.attempt)
            self._unsent[action.job_id] = _Unsent(C.JOB_LATE_REPORT, {"job_id": action.job_id, "attempt": action.attempt,
                                                                       "node": self.node_name, **args})
        elif isinstance(action, Forget):
            self._forget(action.job_id)
        elif isinstance(action, Preempt):
            self._preempt(action)

    def _preempt(self, action: Preempt) -> None:
        """SIGTERM a preempted run once (it may checkpoint and exit), SIGKILL it once its
        grace period (counted on this member's monotonic clock) is over."""
        key = (action.job_id, action.attempt)
        mono = time.monotonic()
        first = self._preempting.get(key)
        if first is None:
            self._preempting = {k: v for k, v in self._preempting.items() if k[0] != action.job_id}
            self._preempting[key] = mono
            log.info("job %d: preempted; SIGTERM now, SIGKILL after %gs", action.job_id, action.grace_s)
            self.agent.terminate(action.job_id)
        elif mono - first >= action.grace_s:
            log.info("job %d: preempted and still running after %gs: killed", action.job_id, action.grace_s)
            self.agent.stop(action.job_id, grace_s=0)
            self._preempting.pop(key, None)

    def sweep_logs(self) -> int:
        """Delete the log files of jobs the state forgot (JOB_RETENTION_DAYS); returns how many."""
        machine = self.store.machine
        removed = 0
        for path in (self.state_dir / "logs").glob("*/*.log"):
            stem = path.name.split(".", 1)[0]
            if stem.isdigit() and int(stem) < machine.next_job_id and int(stem) not in machine.jobs:
                try:
                    path.unlink()
                    removed += 1
                except OSError as e:
                    log.warning("could not delete the log %s: %s", path, e)
        if removed:
            log.info("deleted the logs of %d forgotten jobs", removed)
        return removed

    # ------------------------------------------------------------ helpers
    def _my_rank(self, job: Job) -> int | None:
        for rank, a in enumerate(job.allocations):
            if a.node == self.node_name:
                return rank
        return None

    def _image_ready(self, job: Job, rank: int) -> bool:
        """A container job waits here until its image is (fetched, verified, staged) and
        in the tenant's own store."""
        home = tenant_home_of(self.home_root, job.tenant, job.uid)
        with self.store.lock:
            v = self.images.check(job.spec.container, self.store.machine, (job.uid, job.gid, home))
        if v.state == WAIT:
            if job.reason != v.message:
                try_commit(self.store, C.JOB_ANNOTATE, job_id=job.id, reason=v.message, attempt=job.attempt)
            return False
        if v.state == FAIL:
            self._unsent[job.id] = _Unsent(C.JOB_FINISH, {
                "job_id": job.id, "attempt": job.attempt, "rank": rank, "state": "failed",
                "reason": f"could not start on {self.node_name}: {v.message}"})
            self._send_reports()
            return False
        return True

    def _start(self, job: Job, rank: int) -> None:
        age = self._lease_lapsed()
        if age is not None:
            # Its shim would fence it at its first look (shim._wait_for) and the job be requeued
            # for nothing: a member whose first report the scheduler has not taken yet (a job
            # placed on it the moment a cluster forms), or one cut off. It starts once a taken
            # report renews the lease; a member that stays cut off is marked down and the job
            # placed elsewhere.
            if (job.id, job.attempt) not in self._lease_waits:
                self._lease_waits.add((job.id, job.attempt))
                log.info("job %d (attempt %d): not started yet: this member's lease lapsed %.1fs ago (no report of "
                         "it taken by the scheduler since); it starts once one is", job.id, job.attempt,
                         age - self.lease.timeout_s)
            return
        self._lease_waits.discard((job.id, job.attempt))
        if job.spec.container is not None and not self._image_ready(job, rank):
            return
        master = None
        if len(job.allocations) > 1:
            if job.master_port is None:
                port = _free_port()
                r = try_commit(self.store, C.JOB_ANNOTATE, job_id=job.id, master_port=port, attempt=job.attempt)
                if not r or not r["ok"]:
                    return
            rank0 = self.store.machine.nodes.get(job.allocations[0].node)
            host = _host_of(rank0.address) if rank0 and rank0.address else self.advertise_host
            master = (host, self.store.machine.jobs[job.id].master_port)
        alloc = job.allocations[rank]
        user = _user_name(job)
        home = tenant_home_of(self.home_root, job.tenant, job.uid)
        env = job_env(job, rank, self.node_name, user, home, self._node_vendors, master, mps=self.mps)
        output_path, error_path = output_paths(job, rank, self.node_name, user)
        launch = Launch(
            job_id=job.id, uid=job.uid, gid=job.gid, extra_gids=supplementary_groups(user, job.gid),
            home=home, workdir=job.spec.workdir or home, script=job.spec.script, env=env,
            log_path=str(self.state_dir / job.rank_log_path(rank)),
            cpus=alloc.cpus or None, mem_bytes=alloc.mem_bytes or None,
            gpu_vendor=alloc.vendor, gpu_indices=tuple(g.index for g in alloc.gpus),
            all_gpu_indices=tuple(sorted(self.agent.gpu_indices())),
            gpu_devices=dict(self.agent.gpu_devices),
            lease_path=str(self.lease.path) if self.lease else None,
            lease_s=self.lease.timeout_s if self.lease else None,
            container=job.spec.container,
            workspace=job.spec.workspace,
            ws_token=job.ws.get("token"),
            output_path=output_path, error_path=error_path, output_append=job.attempt > 0,
        )
        try:
            enforced = self.agent.start(launch, attempt=job.attempt)
        except (RunnerError, OSError) as e:
            self._unsent[job.id] = _Unsent(C.JOB_FINISH, {
                "job_id": job.id, "attempt": job.attempt, "rank": rank, "state": "failed",
                "reason": f"could not start on {self.node_name}: {e}"})
            self._send_reports()
            return
        if rank == 0:
            note = {"reason": ""} if job.reason.startswith("staging image") else {}
            ws = self._workspace_info(job.id)
            if ws is not None:
                note["ws"] = {"node": self.node_name, "removed": False, **ws}
            try_commit(self.store, C.JOB_ANNOTATE, job_id=job.id, enforced=enforced, attempt=job.attempt, **note)

    def _enforce_vram(self, now: float, runs) -> None:
        """Shared-mode jobs above their VRAM reservation (vram_watch.py): stopped and failed
        with the figures, or warned about in their reason. `now`: the monotonic clock (the
        grace is an interval)."""
        if self.vram.policy == "off" or now < self._next_vram_at:
            return
        self._next_vram_at = now + 1.0  # the GPUs are sampled once a second
        with self.store.lock:
            mine = [j for j in self.store.machine.running_jobs() if j.id in runs and self._my_rank(j) is not None
                    and any(g.vram_bytes for a in j.allocations for g in a.gpus)]
        if not mine:
            return
        pids_of = getattr(self.agent.runner, "job_pids", lambda _j: set())
        for o, why in self.vram.check(now, mine, pids_of, self.agent.last_gpus()):
            if self.vram.policy == "warn":
                log.warning("job %d: %s", o.job_id, why)
                try_commit(self.store, C.JOB_ANNOTATE, job_id=o.job_id, reason=why, attempt=o.attempt)
            elif o.job_id not in self._unsent:
                log.warning("job %d: %s", o.job_id, why)
                self.agent.stop(o.job_id)
                self._unsent[o.job_id] = _Unsent(C.JOB_FINISH, {"job_id": o.job_id, "attempt": o.attempt,
                                                                "rank": o.rank, "state": "failed", "reason": why})
        self._send_reports()

    def _workspace_info(self, job_id: int) -> dict | None:
        runner = self.agent.runner
        return runner.workspace_info(job_id) if hasattr(runner, "workspace_info") else None

    def remove_workspaces(self, running: set[int]) -> None:
        """Remove the containers of this member's workspaces that were removed
        (`mt-container rm`: the job is cancelled) and say so in the state, once.
        This scans every job in the state, so it runs at most once every
        WORKSPACE_SWEEP_EVERY_S (the monotonic clock: a wall-clock jump neither stalls
        nor hurries it), not on every pass: a removal waits about that long at most."""
        runner = self.agent.runner
        if not hasattr(runner, "remove_workspace"):
            return
        now = time.monotonic()
        if now < self._next_ws_sweep:
            return
        self._next_ws_sweep = now + WORKSPACE_SWEEP_EVERY_S
        with self.store.lock:
            gone = [j for j in self.store.machine.jobs.values() if j.spec.workspace is not None and j.state.final
                    and j.ws.get("node") == self.node_name and j.ws.get("removed") is False
                    and j.id not in running]
        for job in gone:
            home = tenant_home_of(self.home_root, job.tenant, job.uid)
            if runner.remove_workspace(job.id, job.uid, job.gid, home):
                log.info("workspace %s (job %d): its container was removed", job.spec.workspace.name, job.id)
                try_commit(self.store, C.JOB_ANNOTATE, job_id=job.id, ws={"removed": True})

    def _send_reports(self) -> None:
        for job_id, rep in list(self._unsent.items()):
            r = try_commit(self.store, rep.command, at=self.clock(), **rep.args)
            if r is None:
                continue  # not committed now; try again next pass
            del self._unsent[job_id]
            if rep.command == C.JOB_LATE_REPORT:
                if r["ok"]:
                    log.info("job %d: the late report of attempt %s was %s", job_id, rep.args["attempt"],
                             "taken as the job's outcome" if r.get("taken") else "noted in its history")
                self._forget(job_id)
            elif r["ok"]:
                self._forget(job_id)
            else:
                # The cluster moved on (the attempt was requeued, the job cancelled...): keep
                # the run, so the next decision can report it late or let it go.
                log.info("job %d: its end report was refused (%s); the run is kept for the next pass", job_id,
                         r["error"])
                self._refused.add((job_id, rep.args["attempt"]))

    def _forget(self, job_id: int) -> None:
        self._refused = {r for r in self._refused if r[0] != job_id}
        self._preempting = {k: v for k, v in self._preempting.items() if k[0] != job_id}
        self.agent.forget(job_id)


def _user_name(job: Job) -> str:
    try:
        return pwd.getpwuid(job.uid).pw_name
    except KeyError:
        return job.tenant


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _host_of(address: str) -> str:
    host = address.rsplit(":", 1)[0].strip("[]")
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host

"""The agent's side of a member: make this machine run exactly what the committed
state says it should, and report what ended.

Each pass reconciles the state (the local replica) with the processes here:
- a rank placed on this node and not started for this attempt is started (a gang's
  rank 0 first publishes its rendezvous port; the other ranks wait for it);
- a process whose job is no longer running here (cancelled, failed elsewhere in its
  gang, requeued after this node was marked down) is stopped;
- a process that ended is reported; a report that cannot be committed now (no
  leader) is kept and sent again on the next pass;
- a rank past its `time=` limit is stopped and reported failed.
The agent never places a job: it only carries out placements.
"""

from __future__ import annotations

import logging
import pwd
import socket
from dataclasses import dataclass
from pathlib import Path

from ...agent.local import LocalAgent
from ...agent.runners.base import ExitInfo, Launch, RunnerError
from ...model.job import Job, JobState
from ...model.units import format_duration
from ...state import commands as C
from ...accounts.lookup import home_of, supplementary_groups
from .jobenv import job_env

log = logging.getLogger(__name__)

LOG_SWEEP_EVERY_S = 60.0


@dataclass(slots=True)
class _Report:
    job_id: int
    attempt: int
    rank: int
    args: dict


class AgentLoop:
    def __init__(self, store, agent: LocalAgent, node_name: str, home_root: str, state_dir: Path,
                 clock, advertise_host: str = "127.0.0.1", lease=None) -> None:
        self.store = store
        self.agent = agent
        self.node_name = node_name
        self.home_root = home_root
        self.state_dir = Path(state_dir)
        self.clock = clock
        self.advertise_host = advertise_host
        self.lease = lease
        self._unsent: dict[int, _Report] = {}
        self._next_log_sweep = 0.0
        self._jobs_known = 0
        self._node_vendors: set[str] = set()

    # ------------------------------------------------------------ start-up
    def recover(self) -> None:
        """Re-attach to the ranks that were running here when this server stopped."""
        mine = {j.id: j for j in self.store.machine.running_jobs() if self._my_rank(j) is not None}
        self._reattach(mine)

    def _reattach(self, mine: dict[int, Job]) -> None:
        for r in self.agent.reattach(sorted(mine)):
            job = mine[r.job_id]
            rank = self._my_rank(job)
            if r.outcome == "never-started":
                continue  # the next pass starts it: it never ran
            if r.outcome == "lost":
                self.agent.forget(r.job_id)
                self._queue_report(job, rank, state="lost",
                                   reason=f"its processes on {self.node_name} were gone, with no exit record, "
                                          "when the server restarted")
            elif r.outcome == "ended":
                self._report_exit(job, rank, r.exit)
            else:
                log.info("job %d rank %d re-attached after restart", r.job_id, rank)

    # ------------------------------------------------------------ one pass
    def run_once(self, node_vendors: set[str]) -> None:
        self._node_vendors = node_vendors
        now = self.clock()
        for job_id, info in self.agent.reap():
            job = self.store.machine.jobs.get(job_id)
            rank = self._my_rank(job) if job else None
            if job is None or rank is None or job.state is not JobState.RUNNING:
                self.agent.forget(job_id)
                continue
            self._report_exit(job, rank, info)
        self._send_reports()
        active = self.agent.active()
        started_attempts = self.agent.attempts()
        wanted: dict[int, tuple[Job, int]] = {}
        with self.store.lock:
            running = list(self.store.machine.running_jobs())
        for job in running:
            rank = self._my_rank(job)
            if rank is not None and job.id not in self._unsent:
                wanted[job.id] = (job, rank)
        # Stop what should not run here any more.
        for job_id in active:
            w = wanted.get(job_id)
            if w is None or started_attempts.get(job_id) != w[0].attempt:
                if job_id in self._unsent:
                    continue
                log.info("job %d: no longer placed here (attempt %s); stopping it", job_id, started_attempts.get(job_id))
                self.agent.stop(job_id)
        # Time limits.
        for job_id, (job, rank) in wanted.items():
            limit = job.spec.time_limit_s
            if limit and job.started_at is not None and now - job.started_at > limit and job_id in active:
                self.agent.stop(job_id)
                self._queue_report(job, rank, state="failed",
                                   reason=f"time limit {format_duration(limit)} reached; the job was stopped")
        self._send_reports()
        # Start what should run here. A run of the same attempt recorded on disk was
        # started by an earlier life of this server whose state had not arrived when it
        # recovered (e.g. a restart while its replica was being refilled): re-attach it.
        for job_id, (job, rank) in wanted.items():
            if job_id in active or started_attempts.get(job_id) == job.attempt or str(rank) in job.rank_exits:
                continue
            if self.agent.recorded_attempt(job_id) == job.attempt:
                self._reattach({job_id: job})
                continue
            self._start(job, rank)
        jobs_known = len(self.store.machine.jobs)
        if now >= self._next_log_sweep or jobs_known < self._jobs_known:  # jobs were forgotten
            self._next_log_sweep = now + LOG_SWEEP_EVERY_S
            self.sweep_logs()
        self._jobs_known = jobs_known

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

    def _start(self, job: Job, rank: int) -> None:
        master = None
        if len(job.allocations) > 1:
            if job.master_port is None:
                if rank != 0:
                    return  # wait for rank 0 to publish the rendezvous port
                port = _free_port()
                r = self._apply(C.JOB_ANNOTATE, job_id=job.id, master_port=port, attempt=job.attempt)
                if not r or not r["ok"]:
                    return
            rank0 = self.store.machine.nodes.get(job.allocations[0].node)
            host = _host_of(rank0.address) if rank0 and rank0.address else self.advertise_host
            master = (host, self.store.machine.jobs[job.id].master_port)
        alloc = job.allocations[rank]
        user = _user_name(job)
        home = home_of(job.uid, str(Path(self.home_root) / job.tenant))
        env = job_env(job, rank, self.node_name, user, home, self._node_vendors, master)
        launch = Launch(
            job_id=job.id, uid=job.uid, gid=job.gid, extra_gids=supplementary_groups(user, job.gid),
            home=home, workdir=job.spec.workdir or home, script=job.spec.script, env=env,
            log_path=str(self.state_dir / _rank_log(job, rank)),
            cpus=alloc.cpus or None, mem_bytes=alloc.mem_bytes or None,
            gpu_vendor=alloc.vendor, gpu_indices=tuple(g.index for g in alloc.gpus),
            all_gpu_indices=tuple(sorted(self.agent.gpu_indices())),
            lease_path=self.lease.path if self.lease else None,
            lease_s=self.lease.timeout_s if self.lease else None,
        )
        try:
            enforced = self.agent.start(launch, attempt=job.attempt)
        except (RunnerError, OSError) as e:
            self._queue_report(job, rank, state="failed", reason=f"could not start on {self.node_name}: {e}")
            self._send_reports()
            return
        if rank == 0:
            self._apply(C.JOB_ANNOTATE, job_id=job.id, enforced=enforced, attempt=job.attempt)

    def _report_exit(self, job: Job, rank: int, info: ExitInfo) -> None:
        if info.exit_code is None:
            self._queue_report(job, rank, state="failed", reason=info.reason or f"killed by signal {info.signal}")
        else:
            reason = "" if info.exit_code == 0 else (info.reason or f"exited with status {info.exit_code}")
            self._queue_report(job, rank, exit_code=info.exit_code, reason=reason)

    def _queue_report(self, job: Job, rank: int, **args) -> None:
        self._unsent[job.id] = _Report(job.id, job.attempt, rank, args)

    def _send_reports(self) -> None:
        for job_id, rep in list(self._unsent.items()):
            r = self._apply(C.JOB_FINISH, job_id=job_id, at=self.clock(), attempt=rep.attempt, rank=rep.rank, **rep.args)
            if r is None:
                continue  # not committed now; try again next pass
            del self._unsent[job_id]
            self.agent.forget(job_id)

    def _apply(self, cmd_name: str, /, **args) -> dict | None:
        try:
            return self.store.apply(C.command(cmd_name, **args))
        except Exception as e:  # replication errors: retried on the next pass
            log.warning("could not commit %s for job %s: %s", cmd_name, args.get("job_id"), e)
            return None


def _rank_log(job: Job, rank: int) -> str:
    return job.log_path if rank == 0 else job.log_path.replace(".log", f".rank{rank}.log")


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

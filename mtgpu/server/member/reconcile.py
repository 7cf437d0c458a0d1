"""The agent's decision, pure: what this member must do so that it runs exactly what
the committed state places on it, and so that every run's end is reported.

`reconcile(placed, runs, ...)` takes the ranks the state places here, the runs this
machine knows (running, or ended and not yet reported) and the time, and returns a
list of actions; `agent_loop.AgentLoop` carries them out. No I/O, no clock.

Rules, per job:
- a run of the attempt placed here that ended: report it (JOB_FINISH); when the job's
  supervisor fenced it (this member was out of touch), the agent stopped it or the
  machine restarted under it, the job was interrupted: a single job that may be
  requeued (`requeue=`, JOB_REQUEUE) is requeued, a gang rank fails the gang, a job
  with `requeue=no` is lost; when its supervisor died in this boot and its processes
  ended with no exit record, it may have run to its end: it fails with its exit status
  unknown and is never requeued (it would run twice);
- a run of the attempt placed here past its `time=`: stop it and report it failed;
- a run of the attempt placed here that was preempted: SIGTERM it, SIGKILL it after the
  grace period (the agent keeps the time); its end is reported as any end, and the state
  machine requeues or cancels it;
- a run that is not (or no longer) placed here at its attempt: stop it while it runs;
  once ended by itself, report it late when its attempt was requeued off this member
  (the state machine takes that result if the requeued copy has not started, else
  notes that the job also ran here), else forget it;
- a rank placed here with no run: start it (a gang's other ranks wait for rank 0 to
  publish the rendezvous port).
Nothing is decided unless `in_sync`: the state this member reads is the cluster's
current one (standalone: always; a cluster member: its replica has applied what the
scheduler had committed when it last answered this member, and the state does not mark
this member down), so a member back from a crash or a partition never acts on a stale
plan: it neither starts what moved nor reports the end of an attempt the cluster has
requeued as if it were still placed (it reports it late instead). An end report the
state machine refused leaves its run for the next decision (`refused`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...agent.runners.base import ExitInfo, LocalRun
from ...model.units import format_duration


@dataclass(frozen=True, slots=True)
class PlacedRank:
    """A rank the committed state places on this member."""

    job_id: int
    attempt: int
    rank: int
    ranks: int  # 1 for a single job, N for a gang
    started_at: float | None
    time_limit_s: float | None
    requeue: bool  # the job may be requeued when its member fails (`requeue=` directive)
    master_port: int | None = None
    rank_done: bool = False  # this gang rank already reported a good end
    preempt_grace_s: float | None = None  # preempted (job.preempt.v1): SIGTERM, SIGKILL after this long


@dataclass(frozen=True, slots=True)
class Start:
    placed: PlacedRank


@dataclass(frozen=True, slots=True)
class Stop:
    job_id: int
    why: str


@dataclass(frozen=True, slots=True)
class Report:
    """Commit how the placed attempt's rank ended: `command` is "finish" or "requeue"."""

    job_id: int
    attempt: int
    rank: int
    command: str
    args: dict


@dataclass(frozen=True, slots=True)
class LateReport:
    """An attempt that was requeued off this member ended here by itself."""

    job_id: int
    attempt: int
    ended: ExitInfo


@dataclass(frozen=True, slots=True)
class Forget:
    job_id: int


@dataclass(frozen=True, slots=True)
class Preempt:
    """The running attempt was preempted: SIGTERM it once, SIGKILL it after `grace_s`."""

    job_id: int
    attempt: int
    grace_s: float


Action = Start | Stop | Report | LateReport | Forget | Preempt


def end_report(p: PlacedRank, ended: ExitInfo, node: str) -> Report:
    """How to report the end of the placed attempt's rank."""
    if p.preempt_grace_s is not None and ended.stopped:  # the state machine requeues or cancels it
        return Report(p.job_id, p.attempt, p.rank, "finish", {
            "state": "failed", "reason": f"it did not end within the {p.preempt_grace_s:g}s grace period: killed"})
    if ended.natural:
        if ended.exit_code is None:
            args = {"state": "failed", "reason": ended.reason or f"killed by signal {ended.signal}"}
        else:
            args = {"exit_code": ended.exit_code,
                    "reason": "" if ended.exit_code == 0 else (ended.reason or f"exited with status {ended.exit_code}")}
        return Report(p.job_id, p.attempt, p.rank, "finish", args)
    if ended.unknown:  # it may have run to its end: never run it again unasked
        return Report(p.job_id, p.attempt, p.rank, "finish", {
            "state": "failed", "reason": f"on {node}: {ended.reason}; not requeued, so that it does not run twice"})
    what = ended.reason if ended.fenced else f"on {node}: {ended.reason}"
    if p.ranks > 1:
        return Report(p.job_id, p.attempt, p.rank, "finish", {"state": "failed", "reason": what})
    if p.requeue:
        return Report(p.job_id, p.attempt, p.rank, "requeue", {"reason": f"{what}; requeued"})
    return Report(p.job_id, p.attempt, p.rank, "finish",
                  {"state": "lost", "reason": f"{what}; the job asked not to be requeued"})


def _ran_for(p: PlacedRank, run: LocalRun, now: float, mono_now: float | None) -> float:
    if run.started_mono is not None and mono_now is not None:
        return mono_now - run.started_mono
    return now - p.started_at if p.started_at is not None else 0.0


def reconcile(placed: list[PlacedRank], runs: dict[int, LocalRun], unsent: set[int], late_wanted: set[tuple[int, int]],
              in_sync: bool, now: float, node: str, refused: frozenset[tuple[int, int]] = frozenset(),
              mono_now: float | None = None) -> list[Action]:
    """The actions that bring this member in line with the state (see the module's docstring).

    A time limit counts from when the run started here, on the monotonic clock (`mono_now`),
    so that a jump of the wall clock neither cuts a job short nor lets it overrun; a run
    with no such moment (started before a reboot's record) counts from the recorded start.

    `unsent`: jobs whose end report waits to be committed (left alone meanwhile);
    `late_wanted`: (job, attempt) pairs requeued off this member with no late report yet;
    `refused`: (job, attempt) pairs whose end report the state machine refused."""
    if not in_sync:
        return []
    actions: list[Action] = []
    by_job = {p.job_id: p for p in placed}
    for job_id, run in sorted(runs.items()):
        if job_id in unsent:
            continue
        p = by_job.get(job_id)
        if p is not None and p.attempt == run.attempt:
            if (job_id, run.attempt) in refused:
                continue
            if run.ended is not None:
                actions.append(end_report(p, run.ended, node))
            elif p.time_limit_s and _ran_for(p, run, now, mono_now) > p.time_limit_s:
                actions.append(Stop(job_id, f"time limit {format_duration(p.time_limit_s)} reached"))
                actions.append(Report(job_id, p.attempt, p.rank, "finish", {
                    "state": "failed", "reason": f"time limit {format_duration(p.time_limit_s)} reached; "
                                                 "the job was stopped"}))
            elif p.preempt_grace_s is not None:
                actions.append(Preempt(job_id, p.attempt, p.preempt_grace_s))
            continue
        if run.ended is None:
            actions.append(Stop(job_id, f"attempt {run.attempt} is no longer placed here"))
        elif (job_id, run.attempt) in late_wanted and run.ended.natural:
            actions.append(LateReport(job_id, run.attempt, run.ended))
        else:
            actions.append(Forget(job_id))
    for p in placed:
        if p.job_id in runs or p.job_id in unsent or p.rank_done:
            continue
        if p.ranks > 1 and p.master_port is None and p.rank != 0:
            continue  # rank 0 publishes the rendezvous port first
        actions.append(Start(p))
    return actions

"""Preemption in the state machine (docs/SCHEDULING.md "Preemption").

`job.preempt.v1` marks a running opportunistic job (every GPU it holds is an
`oversubscribe` slot: no share, no VRAM guaranteed) as stopping for a queued
guaranteed job. It keeps its allocation until its run ended: its member sends
SIGTERM, SIGKILL after the grace period, and reports the end. However that attempt
ends (its own exit, the kill, its member lost), the end goes through
`_preempted_end`: the job is requeued as a new attempt, its history saying by which
job and when, or cancelled when it said `requeue=no`. Never a guaranteed job, a gang
or a workspace; fenced by the scheduler's epoch like a placement.
"""

from __future__ import annotations

from ..model.job import GpuMode, Job, JobState


class PreemptRejected(Exception):
    """Raised by a handler; the machine answers {"ok": False, "error": ...}."""


def opportunistic(job: Job) -> bool:
    """Every GPU the job holds is an oversubscribed slot (and it holds at least one)."""
    slots = [s for a in job.allocations for s in a.gpus]
    return bool(slots) and all(s.mode == GpuMode.OVERSUBSCRIBE for s in slots)


def preemptible_why_not(job: Job) -> str | None:
    """Why this running job may not be preempted, or None."""
    if job.state is not JobState.RUNNING:
        return f"job {job.id} is {job.state.value}, not running"
    if len(job.allocations) != 1:
        return f"job {job.id} is a gang: gangs are never preempted"
    if job.spec.workspace is not None:
        return f"job {job.id} is a workspace: workspaces are never preempted"
    if not opportunistic(job):
        return f"job {job.id} holds guaranteed capacity (not gpu-mode=oversubscribe): it is never preempted"
    return None


class PreemptCommands:
    """The handler of job.preempt.v1 and the end of a preempted attempt; mixed into
    state.machine.StateMachine."""

    jobs: dict[int, Job]
    sched_epoch: int

    def _job_preempt(self, job_id: int, by: int, at: float, grace_s: float, attempt: int, epoch: int) -> dict:
        if epoch != self.sched_epoch:
            raise PreemptRejected(f"preemption of scheduler epoch {epoch} refused: epoch {self.sched_epoch} "
                                  "schedules now")
        job = self._job(job_id)
        why = preemptible_why_not(job)
        if why is not None:
            raise PreemptRejected(why)
        if attempt != job.attempt:
            raise PreemptRejected(f"job {job_id} is at attempt {job.attempt}, preemption was for {attempt}")
        if job.preempt is not None:
            raise PreemptRejected(f"job {job_id} is already stopping for job {job.preempt['by']}")
        beneficiary = self._job(by)
        if beneficiary.state is not JobState.QUEUED:
            raise PreemptRejected(f"job {by} is {beneficiary.state.value}, not queued: nothing to preempt for")
        if isinstance(grace_s, bool) or not isinstance(grace_s, (int, float)) or not 0 <= grace_s <= 86400:
            raise PreemptRejected(f"a grace period must be 0 to 86400 seconds, not {grace_s!r}")
        job.preempt = {"by": int(by), "at": at, "grace_s": float(grace_s)}
        job.preempted.append(at)
        job.reason = (f"preempted by job {by}: stopping (SIGTERM, then SIGKILL after {float(grace_s):g}s); "
                      + ("it is requeued then" if job.spec.requeue else "requeue=no: it is cancelled then"))
        return {}

    def _preempted_end(self, job: Job, at: float, how: str) -> dict:
        """The preempted attempt ended (`how`: in words): requeued, or cancelled for requeue=no."""
        p = job.preempt
        assert p is not None
        what = f"preempted by job {p['by']} (asked to stop at {p['at']:.3f}, grace {p['grace_s']:g}s); {how}"
        job.preempt = None
        if not job.spec.requeue:
            self._release(job)
            job.state, job.ended_at = JobState.CANCELLED, at
            job.reason = f"{what}; not requeued: the job says requeue=no"
            self._account(job, at)
            return {"final": True, "preempted_by": p["by"]}
        job.history.append({"attempt": job.attempt, "nodes": [a.node for a in job.allocations],
                            "allocations": [a.to_dict() for a in job.allocations], "started_at": job.started_at,
                            "ended_at": at, "outcome": f"{what}; requeued", "preempted_by": p["by"],
                            "preempted_at": p["at"]})
        self._release(job)
        job.state, job.allocations, job.started_at = JobState.QUEUED, (), None
        job.master_port, job.rank_exits = None, {}
        job.attempt += 1
        job.reason = f"requeued: preempted by job {p['by']}"
        self._queued[job.id] = None
        return {"final": False, "requeued": True, "preempted_by": p["by"], "attempt": job.attempt}

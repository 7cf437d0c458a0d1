"""Preemption in the state machine (state/preempt.py): only a running opportunistic
single job, fenced by the epoch; however the attempt ends it is requeued with its
history saying by which job and when, or cancelled for requeue=no; a journal replays
it to the same state."""

from mtgpu.model.job import GpuAlternative, GpuMode, JobState
from mtgpu.state import commands as C
from mtgpu.state.machine import StateMachine

from test_state_machine import alloc, setup_machine, submit


def _running_over(sm: StateMachine, **kw) -> int:
    jid = submit(sm, gpus=(GpuAlternative(1),), gpu_mode=GpuMode.OVERSUBSCRIBE, **kw)
    a = alloc(mode=GpuMode.OVERSUBSCRIBE, fraction=0.0)
    assert sm.apply(C.command(C.JOB_START, job_id=jid, allocations=[a], at=3.0, attempt=0))["ok"]
    return jid


def _preempt(sm, victim, by, at=10.0, attempt=0, epoch=None, grace_s=30.0):
    return sm.apply(C.command(C.JOB_PREEMPT, job_id=victim, by=by, at=at, grace_s=grace_s, attempt=attempt,
                              epoch=sm.sched_epoch if epoch is None else epoch))


def test_a_preempted_job_that_exits_is_requeued_with_who_and_when_in_its_history():
    sm = setup_machine()
    victim, ben = _running_over(sm), submit(sm, gpus=(GpuAlternative(1),))
    assert _preempt(sm, victim, ben)["ok"]
    job = sm.jobs[victim]
    assert job.state is JobState.RUNNING and job.preempt == {"by": ben, "at": 10.0, "grace_s": 30.0}
    assert job.preempted == [10.0] and f"preempted by job {ben}" in job.reason
    assert sm.commitment("n1").gpus[0].oversubscribed == 1  # it holds its slot until it ended
    r = sm.apply(C.command(C.JOB_FINISH, job_id=victim, exit_code=143, at=12.0, attempt=0))
    assert r["ok"] and r["requeued"] and r["preempted_by"] == ben
    job = sm.jobs[victim]
    assert job.state is JobState.QUEUED and job.attempt == 1 and job.preempt is None and job.allocations == ()
    h = job.history[-1]
    assert h["preempted_by"] == ben and h["preempted_at"] == 10.0 and h["ended_at"] == 12.0
    assert f"preempted by job {ben}" in h["outcome"] and "exited with status 143" in h["outcome"]
    assert h["outcome"].endswith("requeued")
    assert 0 not in sm.commitment("n1").gpus or sm.commitment("n1").gpus[0].oversubscribed == 0


def test_a_preempted_job_killed_after_its_grace_or_lost_is_requeued_too_and_requeue_no_is_cancelled():
    sm = setup_machine()
    v1, ben = _running_over(sm), submit(sm)
    assert _preempt(sm, v1, ben)["ok"]
    r = sm.apply(C.command(C.JOB_FINISH, job_id=v1, state="failed", at=41.0, attempt=0,
                           reason="it did not end within the 30s grace period: killed"))
    assert r["ok"] and sm.jobs[v1].state is JobState.QUEUED
    assert "grace period: killed" in sm.jobs[v1].history[-1]["outcome"]
    v2 = _running_over(sm, requeue=False)
    assert _preempt(sm, v2, ben, attempt=0)["ok"]
    r = sm.apply(C.command(C.JOB_REQUEUE, job_id=v2, at=20.0, attempt=0, reason="lost on n1 (node down)"))
    assert r["ok"] and r["final"]
    job = sm.jobs[v2]
    assert job.state is JobState.CANCELLED and "requeue=no" in job.reason and f"job {ben}" in job.reason
    assert job.usage is not None  # accounted as any final job


def test_only_an_opportunistic_single_job_may_be_preempted_and_only_for_a_queued_job_of_this_epoch():
    sm = setup_machine()
    guaranteed = submit(sm, gpus=(GpuAlternative(1),))
    assert sm.apply(C.command(C.JOB_START, job_id=guaranteed, allocations=[alloc(index=1)], at=3.0))["ok"]
    ben = submit(sm)
    r = _preempt(sm, guaranteed, ben)
    assert not r["ok"] and "never preempted" in r["error"]
    victim = _running_over(sm)
    assert not _preempt(sm, victim, ben, epoch=sm.sched_epoch + 7)["ok"]
    assert not _preempt(sm, victim, ben, attempt=3)["ok"]
    assert not _preempt(sm, victim, guaranteed)["ok"]  # running, not queued
    assert not _preempt(sm, victim, ben, grace_s=-1)["ok"]
    assert _preempt(sm, victim, ben)["ok"]
    r = _preempt(sm, victim, ben)
    assert not r["ok"] and "already stopping" in r["error"]


def test_a_preemption_is_replayed_to_the_same_state():
    sm = setup_machine()
    victim, ben = _running_over(sm), submit(sm)
    _preempt(sm, victim, ben)
    sm.apply(C.command(C.JOB_FINISH, job_id=victim, exit_code=0, at=11.0, attempt=0))
    again = StateMachine.from_dict(sm.to_dict())
    assert again.to_dict() == sm.to_dict()
    assert again.jobs[victim].preempted == [10.0] and again.jobs[victim].history[-1]["preempted_by"] == ben

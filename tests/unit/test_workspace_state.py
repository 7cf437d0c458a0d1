"""Workspaces in the state machine: a kept container's life as a job (docs/WORKSPACES.md)."""

from mtgpu.model.job import GpuAlternative, JobSpec, JobState, WorkspaceSpec
from mtgpu.state import commands as C
from mtgpu.state.machine import StateMachine
from tests.unit.test_state_machine import alloc, setup_machine

WS = WorkspaceSpec(name="lab", source="template jupyter", command=("jupyter", "lab"), ports=(8888,),
                   env=(("A", "b"),), token_env="JUPYTER_TOKEN", post_create=("pip install x",))


def create(sm, **kw) -> int:
    spec = JobSpec(script="", name="lab", container="localhost/j:1", gpus=(GpuAlternative(1),), workspace=WS, **kw)
    r = sm.apply(C.command(C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001, spec=spec.to_dict(), at=2.0))
    assert r["ok"], r
    return r["job_id"]


def running(sm) -> int:
    jid = create(sm)
    assert sm.apply(C.command(C.JOB_START, job_id=jid, allocations=[alloc()], at=3.0))["ok"]
    assert sm.apply(C.command(C.JOB_ANNOTATE, job_id=jid, ws={"node": "n1", "ports": {"8888": 40001},
                                                              "token": "t0k", "container": "mtgpu-ws1"}))["ok"]
    return jid


def test_the_workspace_spec_survives_a_snapshot_round_trip_and_stays_hashable():
    sm = setup_machine()
    jid = running(sm)
    again = StateMachine.from_dict(sm.to_dict())
    assert again.jobs[jid].spec.workspace == WS and again.jobs[jid].ws["ports"] == {"8888": 40001}
    assert hash(again.jobs[jid].spec) == hash(sm.jobs[jid].spec)
    assert again.commitment("n1").gpus[0].exclusive == 1


def test_stop_releases_the_reservation_and_keeps_where_its_container_is():
    sm = setup_machine(gpus=1)
    jid = running(sm)
    r = sm.apply(C.command(C.WORKSPACE_STOP, job_id=jid, at=5.0, reason="by alice"))
    assert r["ok"], r
    job = sm.jobs[jid]
    assert job.state is JobState.STOPPED and not job.state.final and job.reason == "stopped: by alice"
    assert sm.commitment("n1").gpus[0].exclusive == 0 and jid not in [j.id for j in sm.running_jobs()]
    assert jid not in [j.id for j in sm.queued_jobs()]
    # a stopped workspace survives a snapshot without holding anything
    assert not StateMachine.from_dict(sm.to_dict()).commitment("n1").gpus
    # a batch job now fits where the workspace was
    other = sm.apply(C.command(C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001,
                               spec=JobSpec(script="true", gpus=(GpuAlternative(1),)).to_dict(), at=6.0))["job_id"]
    assert sm.apply(C.command(C.JOB_START, job_id=other, allocations=[alloc()], at=6.0))["ok"]


def test_start_queues_it_again_pinned_to_the_member_that_keeps_its_container():
    sm = setup_machine()
    jid = running(sm)
    assert sm.apply(C.command(C.WORKSPACE_STOP, job_id=jid, at=5.0))["ok"]
    r = sm.apply(C.command(C.WORKSPACE_START, job_id=jid, at=6.0))
    assert r["ok"] and r["attempt"] == 1
    job = sm.jobs[jid]
    assert job.state is JobState.QUEUED and job.spec.server == "n1" and job.attempt == 1
    assert job.history[-1]["nodes"] == ["n1"] and job.ws["token"] == "t0k"
    again = sm.apply(C.command(C.WORKSPACE_START, job_id=jid, at=6.0))
    assert not again["ok"] and "queued, not stopped" in again["error"]


def test_its_command_ending_stops_it_instead_of_finishing_it():
    sm = setup_machine()
    jid = running(sm)
    r = sm.apply(C.command(C.JOB_FINISH, job_id=jid, exit_code=3, at=7.0))
    assert r["ok"] and r["final"] is False
    job = sm.jobs[jid]
    assert job.state is JobState.STOPPED and job.reason == "stopped: its command exited with status 3"
    assert sm.commitment("n1").gpus[0].exclusive == 0


def test_rm_is_a_cancel_and_is_final():
    sm = setup_machine()
    jid = running(sm)
    assert sm.apply(C.command(C.WORKSPACE_STOP, job_id=jid, at=5.0))["ok"]
    assert sm.apply(C.command(C.JOB_CANCEL, job_id=jid, at=6.0, by="alice"))["ok"]
    assert sm.jobs[jid].state is JobState.CANCELLED and sm.jobs[jid].state.final
    r = sm.apply(C.command(C.WORKSPACE_START, job_id=jid, at=7.0))
    assert not r["ok"] and "cancelled, not stopped" in r["error"]


def test_a_requeued_workspace_waits_for_the_member_that_keeps_its_layer():
    sm = setup_machine()
    jid = running(sm)
    assert sm.apply(C.command(C.JOB_REQUEUE, job_id=jid, at=5.0, reason="member down"))["ok"]
    assert sm.jobs[jid].spec.server == "n1"


def test_workspace_commands_refuse_batch_jobs_and_gone_members_with_the_reason():
    sm = setup_machine()
    batch = sm.apply(C.command(C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001,
                               spec=JobSpec(script="true").to_dict(), at=2.0))["job_id"]
    r = sm.apply(C.command(C.WORKSPACE_STOP, job_id=batch, at=3.0))
    assert not r["ok"] and "batch job, not a workspace" in r["error"]
    r = sm.apply(C.command(C.JOB_ANNOTATE, job_id=batch, ws={"node": "n1"}))
    assert not r["ok"] and "not a workspace" in r["error"]
    jid = running(sm)
    assert sm.apply(C.command(C.WORKSPACE_STOP, job_id=jid, at=5.0))["ok"]
    assert sm.apply(C.command(C.NODE_REMOVE, name="n1", at=6.0))["ok"]
    r = sm.apply(C.command(C.WORKSPACE_START, job_id=jid, at=7.0))
    assert not r["ok"] and "n1, which left the cluster" in r["error"] and "mt-container rm" in r["error"]

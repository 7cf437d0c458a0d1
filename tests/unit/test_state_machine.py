"""The state machine and its journal: deterministic, durable, refusing bad plans."""

import json

from mtgpu.model.job import GpuMode, JobSpec, JobState, GpuAlternative
from mtgpu.state import commands as C
from mtgpu.state.journal import JournaledState
from mtgpu.state.machine import StateMachine

GiB = 1024**3


def make_spec(**kw) -> dict:
    return JobSpec(script="#!/bin/bash\ntrue\n", **kw).to_dict()


def setup_machine(gpus: int = 2, vram: int = 24 * GiB) -> StateMachine:
    sm = StateMachine()
    sm.apply(C.command(C.TENANT_ENSURE, name="alice", uid=2001, gid=2001, at=1.0))
    sm.apply(C.command(
        C.NODE_REGISTER, name="n1", cpus=8, mem_total_bytes=64 * GiB, at=1.0,
        gpus=[{"index": i, "vendor": "nvidia", "model": "NVIDIA GeForce RTX 4090", "vram_total_bytes": vram}
              for i in range(gpus)],
    ))
    return sm


def alloc(node="n1", index=0, mode=GpuMode.EXCLUSIVE, fraction=1.0, vram=0, cpus=1.0):
    return {"node": node, "cpus": cpus, "mem_bytes": 0, "vendor": "nvidia",
            "gpus": [{"index": index, "fraction": fraction, "vram_bytes": vram, "mode": mode.value}]}


def submit(sm, **kw) -> int:
    r = sm.apply(C.command(C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001, spec=make_spec(**kw), at=2.0))
    assert r["ok"], r
    return r["job_id"]


def test_submit_start_finish_moves_job_through_states_and_releases_gpu():
    sm = setup_machine()
    jid = submit(sm, gpus=(GpuAlternative(1),))
    assert sm.jobs[jid].state is JobState.QUEUED
    assert sm.apply(C.command(C.JOB_START, job_id=jid, allocations=[alloc()], at=3.0))["ok"]
    assert sm.commitment("n1").gpus[0].exclusive == 1
    assert sm.apply(C.command(C.JOB_FINISH, job_id=jid, exit_code=0, at=4.0))["ok"]
    assert sm.jobs[jid].state is JobState.COMPLETED
    assert sm.commitment("n1").gpus[0].fraction == 0


def test_start_refuses_a_plan_that_would_double_book_an_exclusive_gpu():
    sm = setup_machine()
    a, b = submit(sm), submit(sm)
    assert sm.apply(C.command(C.JOB_START, job_id=a, allocations=[alloc()], at=3.0))["ok"]
    r = sm.apply(C.command(C.JOB_START, job_id=b, allocations=[alloc()], at=3.0))
    assert not r["ok"] and "in use" in r["error"]
    assert sm.jobs[b].state is JobState.QUEUED


def test_start_refuses_an_exclusive_gpu_where_a_shared_job_runs_even_with_no_share():
    # A shared slot that reserves no share and no VRAM still has a job on the GPU, and an
    # exclusive job wants it alone (nodefit's "idle": no job of any mode there).
    sm = setup_machine(gpus=1)
    a, b = submit(sm), submit(sm)
    assert sm.apply(C.command(C.JOB_START, job_id=a, at=3.0,
                              allocations=[alloc(mode=GpuMode.SHARED, fraction=0.0, vram=0)]))["ok"]
    r = sm.apply(C.command(C.JOB_START, job_id=b, allocations=[alloc()], at=3.0))
    assert not r["ok"] and "in use" in r["error"]


def test_start_refuses_shared_vram_overcommit():
    sm = setup_machine(gpus=1)
    ids = [submit(sm, gpu_mode=GpuMode.SHARED) for _ in range(3)]
    sh = dict(mode=GpuMode.SHARED, fraction=0.4, vram=10 * GiB)
    assert sm.apply(C.command(C.JOB_START, job_id=ids[0], allocations=[alloc(**sh)], at=3))["ok"]
    assert sm.apply(C.command(C.JOB_START, job_id=ids[1], allocations=[alloc(**sh)], at=3))["ok"]
    r = sm.apply(C.command(C.JOB_START, job_id=ids[2], allocations=[alloc(**sh)], at=3))
    assert not r["ok"] and "overcommitted" in r["error"]


def test_start_refuses_a_plan_that_gives_one_gpu_twice_to_a_job():
    # Each slot alone fits the commitments; together they would book GPU 0 twice.
    sm = setup_machine()
    jid = submit(sm)
    twice = alloc()
    twice["gpus"] = twice["gpus"] * 2
    r = sm.apply(C.command(C.JOB_START, job_id=jid, allocations=[twice], at=3.0))
    assert not r["ok"] and "GPU 0 of n1 twice" in r["error"]
    assert sm.commitment("n1").gpus == {}


def test_late_finish_from_an_earlier_attempt_is_ignored_after_requeue():
    sm = setup_machine()
    jid = submit(sm)
    sm.apply(C.command(C.JOB_START, job_id=jid, allocations=[alloc()], at=3.0, attempt=0))
    assert sm.apply(C.command(C.JOB_REQUEUE, job_id=jid, at=4.0, reason="node down"))["ok"]
    sm.apply(C.command(C.JOB_START, job_id=jid, allocations=[alloc()], at=5.0, attempt=1))
    r = sm.apply(C.command(C.JOB_FINISH, job_id=jid, exit_code=0, at=6.0, attempt=0))
    assert not r["ok"]
    assert sm.jobs[jid].state is JobState.RUNNING


def test_malformed_and_unknown_commands_are_answered_not_raised():
    sm = setup_machine()
    assert not sm.apply({"cmd": "job.explode.v9", "args": {}})["ok"]
    assert not sm.apply({"cmd": C.JOB_SUBMIT, "args": {"nonsense": 1}})["ok"]
    assert not sm.apply("garbage")["ok"]
    assert not sm.apply(C.command(C.JOB_CANCEL, job_id=999, at=1.0))["ok"]


def test_array_submit_creates_one_job_per_index():
    from mtgpu.model.job import ArraySpec
    sm = setup_machine()
    r = sm.apply(C.command(C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001, at=2.0,
                           spec=make_spec(array=ArraySpec((0, 1, 5), 2))))
    assert len(r["job_ids"]) == 3
    assert [sm.jobs[i].array_index for i in r["job_ids"]] == [0, 1, 5]
    assert {sm.jobs[i].array_parent for i in r["job_ids"]} == {r["job_id"]}


def test_snapshot_round_trip_keeps_commitments():
    sm = setup_machine()
    a = submit(sm)
    sm.apply(C.command(C.JOB_START, job_id=a, allocations=[alloc(index=1)], at=3.0))
    again = StateMachine.from_dict(json.loads(json.dumps(sm.to_dict())))
    assert again.to_dict() == sm.to_dict()
    assert again.commitment("n1").gpus[1].exclusive == 1
    assert [j.id for j in again.running_jobs()] == [a]


def test_journal_replays_after_restart_and_drops_a_torn_last_line(tmp_path):
    st = JournaledState(tmp_path)
    st.apply(C.command(C.TENANT_ENSURE, name="alice", uid=2001, gid=2001, at=1.0))
    for _ in range(5):
        st.apply(C.command(C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001, spec=make_spec(), at=2.0))
    st.close()
    with open(tmp_path / "journal.jsonl", "ab") as f:
        f.write(b'{"seq": 7, "command": {"cmd": "job.sub')  # died mid-write
    again = JournaledState(tmp_path)
    assert len(again.machine.jobs) == 5
    again.apply(C.command(C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001, spec=make_spec(), at=3.0))
    again.close()
    third = JournaledState(tmp_path)
    assert sorted(third.machine.jobs) == [1, 2, 3, 4, 5, 6]


def test_journal_snapshot_then_more_entries_replays_only_the_tail(tmp_path):
    st = JournaledState(tmp_path, snapshot_every=4)
    st.apply(C.command(C.TENANT_ENSURE, name="alice", uid=2001, gid=2001, at=1.0))
    for _ in range(10):
        st.apply(C.command(C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001, spec=make_spec(), at=2.0))
    expected = st.machine.to_dict()
    st.close()
    assert JournaledState(tmp_path).machine.to_dict() == expected


def test_a_plan_from_an_earlier_scheduler_epoch_is_refused():
    sm = setup_machine()
    jid = submit(sm)
    assert sm.apply(C.command(C.SCHED_ELECT, node="a", epoch=3, at=1.0))["ok"]
    assert sm.apply(C.command(C.SCHED_ELECT, node="b", epoch=5, at=2.0))["ok"]
    late = sm.apply(C.command(C.JOB_START, job_id=jid, allocations=[alloc()], at=3.0, epoch=3))
    assert not late["ok"] and "epoch" in late["error"]
    assert sm.jobs[jid].state is JobState.QUEUED
    assert not sm.apply(C.command(C.SCHED_ELECT, node="a", epoch=4, at=4.0))["ok"]
    assert sm.apply(C.command(C.JOB_START, job_id=jid, allocations=[alloc()], at=3.0, epoch=5))["ok"]


def test_a_down_node_takes_no_placement_until_it_is_up_again():
    sm = setup_machine()
    jid = submit(sm)
    sm.apply(C.command(C.NODE_DOWN, name="n1", reason="no report for 12s", at=1.0))
    r = sm.apply(C.command(C.JOB_START, job_id=jid, allocations=[alloc()], at=2.0))
    assert not r["ok"] and "no report" in r["error"]
    sm.apply(C.command(C.NODE_UP, name="n1", at=3.0))
    assert sm.apply(C.command(C.JOB_START, job_id=jid, allocations=[alloc()], at=4.0))["ok"]


def _gang(sm):
    sm.apply(C.command(C.NODE_REGISTER, name="n2", cpus=8, mem_total_bytes=64 * GiB, at=1.0,
                       gpus=[{"index": 0, "vendor": "nvidia", "model": "RTX 4090", "vram_total_bytes": 24 * GiB}]))
    jid = submit(sm, nodes=2)
    assert sm.apply(C.command(C.JOB_START, job_id=jid, allocations=[alloc("n1"), alloc("n2")], at=2.0))["ok"]
    return jid


def test_a_gang_completes_only_when_every_rank_ended_well():
    sm = setup_machine()
    jid = _gang(sm)
    r = sm.apply(C.command(C.JOB_FINISH, job_id=jid, exit_code=0, rank=1, at=3.0))
    assert r["ok"] and r["final"] is False and sm.jobs[jid].state is JobState.RUNNING
    sm.apply(C.command(C.JOB_FINISH, job_id=jid, exit_code=0, rank=0, at=4.0))
    assert sm.jobs[jid].state is JobState.COMPLETED
    assert sm.commitment("n2").gpus[0].fraction == 0


def test_one_failing_rank_fails_the_gang_naming_the_rank_and_node():
    sm = setup_machine()
    jid = _gang(sm)
    sm.apply(C.command(C.JOB_FINISH, job_id=jid, exit_code=137, rank=1, at=3.0))
    job = sm.jobs[jid]
    assert job.state is JobState.FAILED and job.reason.startswith("rank 1 on n2")
    assert not sm.apply(C.command(C.JOB_FINISH, job_id=jid, exit_code=0, rank=0, at=4.0))["ok"]


def test_a_batch_of_submissions_answers_each_on_its_own():
    sm = setup_machine()
    subs = [{"tenant": "alice", "uid": 2001, "gid": 2001, "spec": make_spec()},
            {"tenant": "nobody", "uid": 9, "gid": 9, "spec": make_spec()},
            {"tenant": "alice", "uid": 2001, "gid": 2001, "spec": make_spec()}]
    r = sm.apply(C.command(C.JOB_SUBMIT_BATCH, submissions=subs, at=1.0))
    oks = [x["ok"] for x in r["results"]]
    assert oks == [True, False, True]
    assert r["results"][2]["job_id"] == r["results"][0]["job_id"] + 1


def _requeued_off_n1(sm) -> int:
    """A job started on n1 (attempt 0), then requeued because n1 was marked down."""
    jid = submit(sm)
    assert sm.apply(C.command(C.JOB_START, job_id=jid, allocations=[alloc()], at=3.0, attempt=0))["ok"]
    assert sm.apply(C.command(C.JOB_REQUEUE, job_id=jid, at=4.0, attempt=0, reason="lost on n1 (node down)"))["ok"]
    return jid


def test_a_requeue_keeps_the_attempt_in_the_job_history():
    sm = setup_machine()
    jid = _requeued_off_n1(sm)
    job = sm.jobs[jid]
    assert job.state is JobState.QUEUED and job.attempt == 1
    assert job.history == [{"attempt": 0, "nodes": ["n1"], "allocations": [alloc()], "started_at": 3.0,
                            "ended_at": 4.0, "outcome": "requeued: lost on n1 (node down)"}]


def test_a_requeue_for_another_attempt_is_refused():
    sm = setup_machine()
    jid = _requeued_off_n1(sm)
    assert sm.apply(C.command(C.JOB_START, job_id=jid, allocations=[alloc()], at=5.0, attempt=1))["ok"]
    r = sm.apply(C.command(C.JOB_REQUEUE, job_id=jid, at=6.0, attempt=0, reason="stale"))
    assert not r["ok"] and "attempt 1" in r["error"]
    assert sm.jobs[jid].state is JobState.RUNNING


def test_a_late_report_before_the_copy_started_is_the_jobs_outcome():
    sm = setup_machine()
    jid = _requeued_off_n1(sm)
    r = sm.apply(C.command(C.JOB_LATE_REPORT, job_id=jid, attempt=0, node="n1", exit_code=0, at=9.0))
    assert r == {"ok": True, "taken": True}
    job = sm.jobs[jid]
    assert job.state is JobState.COMPLETED and job.exit_code == 0 and job.attempt == 0
    assert [a.node for a in job.allocations] == ["n1"] and job.started_at == 3.0 and job.ended_at == 9.0
    assert sm.queued_jobs() == [] and job.history[0]["late"]["taken"] is True
    # The copy is no longer queued: a plan for it is refused.
    assert not sm.apply(C.command(C.JOB_START, job_id=jid, allocations=[alloc()], at=10.0, attempt=1))["ok"]


def test_a_late_report_after_the_copy_started_elsewhere_is_only_noted():
    sm = setup_machine()
    sm.apply(C.command(C.NODE_REGISTER, name="n2", cpus=8, mem_total_bytes=64 * GiB, at=1.0, gpus=[
        {"index": 0, "vendor": "nvidia", "model": "NVIDIA GeForce RTX 4090", "vram_total_bytes": 24 * GiB}]))
    jid = _requeued_off_n1(sm)
    assert sm.apply(C.command(C.JOB_START, job_id=jid, allocations=[alloc(node="n2")], at=5.0, attempt=1))["ok"]
    r = sm.apply(C.command(C.JOB_LATE_REPORT, job_id=jid, attempt=0, node="n1", exit_code=3, reason="exited with 3",
                           at=6.0))
    assert r == {"ok": True, "taken": False}
    job = sm.jobs[jid]
    assert job.state is JobState.RUNNING and job.attempt == 1
    assert job.history[0]["late"] == {"state": "failed", "exit_code": 3, "reason": "exited with 3", "at": 6.0,
                                      "taken": False}
    # Reported once only; and only by the member the attempt ran on.
    assert not sm.apply(C.command(C.JOB_LATE_REPORT, job_id=jid, attempt=0, node="n1", exit_code=0, at=7.0))["ok"]
    assert not sm.apply(C.command(C.JOB_LATE_REPORT, job_id=jid, attempt=1, node="n1", exit_code=0, at=7.0))["ok"]


def test_a_late_report_from_another_node_is_refused():
    sm = setup_machine()
    jid = _requeued_off_n1(sm)
    r = sm.apply(C.command(C.JOB_LATE_REPORT, job_id=jid, attempt=0, node="n2", exit_code=0, at=9.0))
    assert not r["ok"] and "n2" in r["error"]
    assert sm.jobs[jid].state is JobState.QUEUED


def test_the_history_survives_a_snapshot():
    sm = setup_machine()
    jid = _requeued_off_n1(sm)
    again = StateMachine.from_dict(json.loads(json.dumps(sm.to_dict())))
    assert again.jobs[jid].history == sm.jobs[jid].history


def test_a_late_report_takes_the_copy_placed_back_on_the_same_member_before_it_started():
    sm = setup_machine()
    jid = _requeued_off_n1(sm)
    assert sm.apply(C.command(C.JOB_START, job_id=jid, allocations=[alloc(index=1)], at=5.0, attempt=1))["ok"]
    r = sm.apply(C.command(C.JOB_LATE_REPORT, job_id=jid, attempt=0, node="n1", exit_code=0, at=6.0))
    assert r == {"ok": True, "taken": True}
    job = sm.jobs[jid]
    assert job.state is JobState.COMPLETED and job.attempt == 0 and job.allocations[0].gpus[0].index == 0
    assert sm.running_jobs() == [] and sm.commitment("n1").gpus[1].fraction == 0


def test_a_tenant_share_is_set_kept_in_snapshots_and_bad_values_are_refused_naming_them():
    sm = setup_machine()
    assert sm.tenants["alice"].share == 1.0
    r = sm.apply(C.command(C.TENANT_SHARE, name="alice", share=2.5, at=3.0))
    assert r == {"ok": True, "share": 2.5}
    named = {0: "share 0 ", -1: "share -1 ", 1e6: "share 1e+06 ", float("nan"): "share nan ",
             float("inf"): "share inf ", "2": "share '2' ", True: "share True ", None: "share None "}
    for bad, fragment in named.items():
        r = sm.apply(C.command(C.TENANT_SHARE, name="alice", share=bad, at=3.0))
        assert not r["ok"] and fragment in r["error"] and "from 0.01 to 1000" in r["error"], r
    assert sm.tenants["alice"].share == 2.5
    r = sm.apply(C.command(C.TENANT_SHARE, name="nobody", share=2, at=3.0))
    assert not r["ok"] and "no tenant named 'nobody'" in r["error"]
    again = StateMachine.from_dict(json.loads(json.dumps(sm.to_dict())))
    assert again.tenants["alice"].share == 2.5


def test_a_snapshot_written_before_shares_existed_loads_with_share_one():
    d = setup_machine().to_dict()
    for t in d["tenants"]:
        del t["share"]
    assert StateMachine.from_dict(d).tenants["alice"].share == 1.0


def test_the_scheduler_view_carries_each_tenants_share_and_decayed_usage():
    from mtgpu.server.member.view import build_usage

    sm = setup_machine()
    sm.apply(C.command(C.TENANT_ENSURE, name="bob", uid=2002, gid=2002, at=1.0))
    sm.apply(C.command(C.TENANT_SHARE, name="bob", share=4, at=2.0))
    jid = submit(sm, gpus=(GpuAlternative(1.0),))
    assert sm.apply(C.command(C.JOB_START, job_id=jid, allocations=[alloc()], at=10.0))["ok"]
    assert sm.apply(C.command(C.JOB_FINISH, job_id=jid, exit_code=0, at=110.0))["ok"]
    usage = build_usage(sm.tenants.values(), sm.jobs.values(), now=110.0)
    assert (usage["alice"].gpu_seconds, usage["alice"].share) == (100.0, 1.0)
    assert (usage["bob"].gpu_seconds, usage["bob"].share) == (0.0, 4.0)


def test_a_report_whose_reason_is_not_text_is_refused_not_raised():
    sm = setup_machine()
    jid = submit(sm, nodes=2)
    sm.apply(C.command(C.NODE_REGISTER, name="n2", cpus=8, mem_total_bytes=64 * GiB, at=1.0, gpus=[]))
    assert sm.apply(C.command(C.JOB_START, job_id=jid, at=3.0, attempt=0, allocations=[
        {"node": "n1", "cpus": 0, "mem_bytes": 0, "gpus": []}, {"node": "n2", "cpus": 0, "mem_bytes": 0, "gpus": []}]))["ok"]
    for name, extra in ((C.JOB_FINISH, {"rank": 1, "exit_code": 3}), (C.JOB_REQUEUE, {}),
                        (C.JOB_LATE_REPORT, {"attempt": 0, "node": "n1"})):
        r = sm.apply(C.command(name, job_id=jid, at=4.0, reason=42, **extra))
        assert not r["ok"] and "reason must be text" in r["error"]
    assert sm.jobs[jid].state is JobState.RUNNING


def test_a_removed_member_is_kept_out_until_it_rejoins_on_restart():
    sm = setup_machine()
    args = dict(cpus=8, mem_total_bytes=64 * GiB, gpus=[])
    assert sm.apply(C.command(C.NODE_REMOVE_V2, name="n1", at=5.0))["ok"]
    refused = sm.apply(C.command(C.NODE_REGISTER, name="n1", at=6.0, **args))  # its next periodic registration
    assert not refused["ok"] and "removed by an admin" in refused["error"] and "n1" not in sm.nodes
    restored = StateMachine.from_dict(sm.to_dict())
    assert restored.removed == {"n1": 5.0}
    assert restored.apply(C.command(C.NODE_REGISTER, name="n1", at=7.0, rejoin=True, **args))["ok"]
    assert "n1" in restored.nodes and not restored.removed
    # journals from before the list: a v1 removal keeps nobody out
    sm = setup_machine()
    assert sm.apply(C.command(C.NODE_REMOVE, name="n1", at=5.0))["ok"]
    assert sm.apply(C.command(C.NODE_REGISTER, name="n1", at=6.0, **args))["ok"]

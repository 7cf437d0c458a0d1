"""The scheduler's quick path (issue 28 target 3): between full passes, which rest after a
long queue, a job submitted since starts at once against what the last pass left, as
long as no command gave capacity back since; the jobs that pass found blocked keep their
holds; anything else waits for the next full pass."""

from __future__ import annotations

from mtgpu.model.job import GpuAlternative, JobSpec, JobState
from mtgpu.sched import Scheduler
from mtgpu.server.member.scheduler_role import SchedulerRole
from mtgpu.state import commands as C
from mtgpu.state.journal import JournaledState
from mtgpu.state.store import commit

from tests.unit.sched.builders import cluster, make_gpu, make_job, make_node

GiB = 1 << 30


def test_place_new_keeps_the_holds_of_the_jobs_the_last_run_found_blocked():
    snap = cluster(make_node("a", [make_gpu(0), make_gpu(1), make_gpu(2, "a100", "40G")], cpus=8))
    engine = Scheduler(snap)
    # job 1 takes an rtx4090; job 2 (two rtx4090s) blocks and holds the rtx4090 kind
    plan = engine.run([make_job(1, "rtx4090:1", priority=5), make_job(2, "rtx4090:2", priority=4)], now=0)
    assert [p.job_id for p in plan.placements] == [1] and 2 in plan.pending
    # nothing of the held kind starts past it: the one rtx4090 left waits for job 2
    assert engine.place_new([make_job(5, "rtx4090:1")], now=1) == []
    # a CPU job starts past it, and an a100 job (another kind)
    placed = engine.place_new([make_job(3, None, cpus=2), make_job(4, "a100:1")], now=1)
    assert sorted(p.job_id for p in placed) == [3, 4]


def test_place_new_stops_at_the_first_job_it_cannot_start():
    engine = Scheduler(cluster(make_node("a", [make_gpu(0)], cpus=4)))
    engine.run([make_job(1, None, cpus=1)], now=0)
    placed = engine.place_new([make_job(2, "1", priority=9), make_job(3, "1", priority=8), make_job(4, None, cpus=1)],
                              now=1)
    assert [p.job_id for p in placed] == [2]  # 3 does not fit: it and all after it wait for a full pass


def _store(tmp_path):
    store = JournaledState(tmp_path / "state")
    assert commit(store, C.TENANT_ENSURE, name="alice", uid=2001, gid=2001, at=1.0)["ok"]
    gpus = [{"index": i, "vendor": "nvidia", "model": "NVIDIA GeForce RTX 4090", "vram_total_bytes": 24 * GiB}
            for i in range(2)]
    assert commit(store, C.NODE_REGISTER, name="n1", gpus=gpus, cpus=8.0, mem_total_bytes=64 * GiB, at=1.0)["ok"]
    return store


def submit(store, **kw) -> int:
    spec = JobSpec(script="#!/bin/bash\ntrue\n", **kw).to_dict()
    return commit(store, C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001, at=2.0, spec=spec)["job_id"]


def test_the_role_starts_a_new_job_at_once_until_capacity_is_given_back(tmp_path):
    store = _store(tmp_path)
    role = SchedulerRole(store, "n1", clock=lambda: 10.0, down_after_s=10.0)
    first = submit(store, gpus=(GpuAlternative(1),))
    blocked = submit(store, gpus=(GpuAlternative(2),))  # waits for the first's GPU
    role.run_once(10.0, store.term())
    assert store.machine.jobs[first].state is JobState.RUNNING
    assert store.machine.jobs[blocked].state is JobState.QUEUED
    cpu_job = submit(store, cpus=1.0)
    assert role.quick_place(10.5)
    assert store.machine.jobs[cpu_job].state is JobState.RUNNING and role.quick_placements == 1
    gpu_job = submit(store, gpus=(GpuAlternative(1),))
    assert not role.quick_place(10.6)  # the free GPU is held for the blocked job ahead of it
    assert store.machine.jobs[gpu_job].state is JobState.QUEUED
    # the first job ends: capacity given back, so only a full pass may decide now
    assert commit(store, C.JOB_FINISH, job_id=first, exit_code=0, at=11.0)["ok"]
    late = submit(store, cpus=1.0)
    assert not role.quick_place(11.1)
    assert store.machine.jobs[late].state is JobState.QUEUED
    role.run_once(11.2, store.term())
    assert store.machine.jobs[blocked].state is JobState.RUNNING  # the blocked job first
    assert store.machine.jobs[late].state is JobState.RUNNING


def test_the_capacity_version_moves_when_capacity_is_given_back_or_a_node_changes():
    from mtgpu.state.machine import StateMachine
    sm = StateMachine()
    sm.apply(C.command(C.TENANT_ENSURE, name="alice", uid=2001, gid=2001, at=1.0))
    v = sm.capacity_version
    sm.apply(C.command(C.NODE_REGISTER, name="n1", gpus=[], cpus=2.0, mem_total_bytes=GiB, at=1.0))
    assert sm.capacity_version > v
    v = sm.capacity_version
    jobs = [sm.apply(C.command(C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001, at=2.0,
                               spec=JobSpec(script="#!/bin/bash\ntrue\n").to_dict()))["job_id"] for _ in range(2)]
    for jid, cpus in zip(jobs, (0, 1)):
        assert sm.apply(C.command(C.JOB_START, job_id=jid, at=3.0, allocations=[
            {"node": "n1", "cpus": cpus, "mem_bytes": 0, "gpus": [], "vendor": None}]))["ok"]
    assert sm.capacity_version == v  # submissions and starts give nothing back
    sm.apply(C.command(C.JOB_FINISH, job_id=jobs[0], exit_code=0, at=4.0))
    assert sm.capacity_version == v  # nor does the end of a job that held nothing
    sm.apply(C.command(C.JOB_FINISH, job_id=jobs[1], exit_code=0, at=4.0))
    assert sm.capacity_version > v
    v = sm.capacity_version
    sm.apply(C.command(C.NODE_DRAIN, name="n1", at=5.0))
    assert sm.capacity_version > v

"""Issue 9: a blocked job holds only what it asked for (its kinds of GPU, its cpus=, its mem=)
on the nodes it could start on; jobs that need none of that start past it."""

from __future__ import annotations

import random

import pytest

from mtgpu.model.cluster import RunningAlloc
from mtgpu.model.job import GpuSlot, NodeAllocation
from mtgpu.sched import schedule
from mtgpu.sched.holds import Reservation
from mtgpu.sched.nodefit import NodeState
from mtgpu.sched.request import rank_requests

from builders import cluster, make_gpu, make_job, make_node, make_spec


def placed(plan):
    return {p.job_id: p for p in plan.placements}


def busy(index=0, model="rtx4090"):
    return make_gpu(index, model, exclusive=True, committed_fraction=1.0)


# ---- a blocked job whose start is unknown (running jobs without time=) ---------------

def test_a_cpu_job_and_an_empty_job_start_while_a_gpu_job_waits_for_the_busy_gpu():
    snap = cluster(make_node("a", [busy(0)], cpus=32, mem="64G"))
    jobs = [make_job(2, "1"), make_job(3, cpus=1), make_job(4)]
    plan = schedule(snap, jobs, now=0)
    assert set(placed(plan)) == {3, 4}
    assert plan.pending[2] == "node a: no idle GPU"


def test_a_job_asking_for_nothing_is_never_held():
    snap = cluster(make_node("a", [busy(0)], cpus=4, cpus_committed=4, mem="8G", mem_committed="8G"))
    jobs = [make_job(1, "1", cpus=4, mem="8G"), make_job(2)]
    plan = schedule(snap, jobs, now=0)
    assert set(placed(plan)) == {2}


def test_a_gpu_job_behind_a_blocked_job_for_its_kind_of_gpu_still_waits():
    snap = cluster(make_node("a", [busy(0), make_gpu(1)]))
    jobs = [make_job(1, "2", priority=10), make_job(2, "1"), make_job(3, "rtx4090:0.5")]
    plan = schedule(snap, jobs, now=0)
    assert plan.placements == []
    for jid in (2, 3):
        assert plan.pending[jid].startswith("held for job 1, which waits ahead of it: starting now would take"
                                            " the GPUs it needs on node a")


def test_a_cpu_job_that_would_take_the_cpus_a_blocked_job_needs_is_held():
    snap = cluster(make_node("a", [busy(0)], cpus=32, cpus_committed=8))
    jobs = [make_job(1, "1", cpus=16, priority=10), make_job(2, cpus=10), make_job(3, cpus=8)]
    plan = schedule(snap, jobs, now=0)
    assert set(placed(plan)) == {3}  # 24 free: 8 leave job 1 its 16, 10 would not
    assert plan.pending[2].startswith("held for job 1, which waits ahead of it: starting now would take"
                                      " the CPUs it needs on node a")


def test_a_job_that_would_take_the_memory_a_blocked_job_needs_is_held():
    snap = cluster(make_node("a", [busy(0)], mem="64G", mem_committed="16G"))
    jobs = [make_job(1, "1", mem="32G", priority=10), make_job(2, mem="20G"), make_job(3, mem="16G")]
    plan = schedule(snap, jobs, now=0)
    assert set(placed(plan)) == {3}
    assert "the memory it needs on node a" in plan.pending[2]


def test_a_gpu_job_behind_a_blocked_cpu_heavy_job_starts_when_it_takes_no_cpu():
    snap = cluster(make_node("a", 2, cpus=32, cpus_committed=24))
    jobs = [make_job(1, cpus=16, priority=10), make_job(2, "1"), make_job(3, "1", cpus=4)]
    plan = schedule(snap, jobs, now=0)
    assert set(placed(plan)) == {2}
    assert "the CPUs it needs on node a" in plan.pending[3]


def test_a_job_for_another_gpu_model_starts_on_the_node_a_blocked_job_holds():
    node = make_node("a", [busy(0, "rtx4090"), make_gpu(1, "t4", "16G")])
    plan = schedule(cluster(node), [make_job(1, "rtx4090:1", priority=10), make_job(2, "t4:1")], now=0)
    assert [s.index for s in placed(plan)[2].allocations[0].gpus] == [1]


def test_an_any_gpu_job_takes_the_gpu_of_the_kind_nobody_waits_for():
    node = make_node("a", [busy(0, "rtx4090"), make_gpu(1, "t4", "16G"), make_gpu(2, "rtx4090")])
    jobs = [make_job(1, "rtx4090:2", priority=10), make_job(2, "1"), make_job(3, "1")]
    plan = schedule(cluster(node), jobs, now=0)
    # job 2 takes the idle t4; job 3 could only take the idle rtx4090, which job 1 needs
    assert [s.index for s in placed(plan)[2].allocations[0].gpus] == [1]
    assert set(placed(plan)) == {2}
    assert "the rtx4090 GPUs it needs on node a" in plan.pending[3]


def test_a_blocked_job_holds_only_on_nodes_it_could_use():
    snap = cluster(make_node("a", [busy(0)], cpus=8), make_node("b", [busy(0)], cpus=20))
    jobs = [make_job(1, "1", cpus=16, priority=10), make_job(2, cpus=8)]
    plan = schedule(snap, jobs, now=0)
    # job 1 could only ever start on b, which must keep its 16 CPUs
    assert [a.node for a in placed(plan)[2].allocations] == ["a"]


# ---- a blocked job with a reserved start (running jobs' time=) ---------------------------

def _reserved_head():
    """Node a: GPUs 0-1 busy until t=3600 with 8 CPUs; job 1 (4 GPUs, 16 CPUs) starts then."""
    node = make_node("a", [busy(0), busy(1), make_gpu(2), make_gpu(3)], cpus=32, cpus_committed=8)
    snap = cluster(node)
    snap.running.append(RunningAlloc(99, (NodeAllocation("a", (GpuSlot(0), GpuSlot(1)), cpus=8),), ends_at=3600))
    return snap, make_job(1, "4", cpus=16, priority=10)


@pytest.mark.parametrize("gpus, cpus, time, starts, what", [
    (None, 20, 7200, False, "the CPUs"),  # at 3600: 32 CPUs free, 20 would leave 12 < 16
    (None, 12, 7200, True, None),         # 12 leave 20
    (None, 20, 1800, True, None),         # ends before job 1 can start
    (None, None, 7200, True, None),       # asks for nothing
    ("1", None, 7200, False, "the GPUs"),
    ("1", None, 1800, True, None),
])
def test_a_job_may_start_past_a_reserved_head_when_it_leaves_the_head_room_at_its_start(gpus, cpus, time, starts, what):
    snap, head = _reserved_head()
    plan = schedule(snap, [head, make_job(2, gpus, cpus=cpus, time=time)], now=0)
    assert (2 in placed(plan)) is starts
    if not starts:
        assert plan.pending[2].startswith(f"held for job 1, which waits ahead of it: starting now would take {what}"
                                          " it needs on node a")
        assert "time= ends before that job's start" in plan.pending[2]


def test_what_outlasts_the_reserved_start_counts_against_the_head_then():
    snap, head = _reserved_head()
    plan = schedule(snap, [head, make_job(2, cpus=12, time=7200), make_job(3, cpus=8, time=7200)], now=0)
    assert set(placed(plan)) == {2}  # 32 - 12 - 8 < 16 at 3600
    assert plan.pending[3].startswith("held for job 1")


def test_a_gpu_job_may_take_a_gpu_the_reserved_head_will_not_need():
    node = make_node("a", [busy(0), busy(1), make_gpu(2), make_gpu(3), make_gpu(4)])
    snap = cluster(node)
    snap.running.append(RunningAlloc(99, (NodeAllocation("a", (GpuSlot(0), GpuSlot(1))),), ends_at=3600))
    plan = schedule(snap, [make_job(1, "4", priority=10), make_job(2, "1"), make_job(3, "1")], now=0)
    # at 3600 five GPUs are idle: one may go now, the head still gets four
    assert set(placed(plan)) == {2}
    assert plan.pending[3].startswith("held for job 1")


def test_a_gang_refused_on_one_held_node_takes_nothing_anywhere():
    snap = cluster(make_node("a", [busy(0), make_gpu(1)]), make_node("b", [busy(0), make_gpu(1)]))
    snap.running.append(RunningAlloc(98, (NodeAllocation("a", (GpuSlot(0),)),), ends_at=3600))
    jobs = [make_job(1, "2", priority=10), make_job(2, "1", nodes=2, time=7200), make_job(3, "1", server="b")]
    plan = schedule(snap, jobs, now=0)
    # job 1 starts on a at 3600 with both GPUs; the gang would need a's idle GPU, so it takes
    # none: b's idle GPU is still free, and held for the gang (job 3 would be "no idle GPU" else)
    assert plan.placements == []
    assert plan.pending[2].startswith("held for job 1")
    assert plan.pending[3].startswith("held for job 2")


# ---- the rule's two writings agree ---------------------------------------------------

def test_room_left_at_a_reserved_start_is_exactly_fit_after_taking_the_allocation():
    rng = random.Random(7)
    specs = [make_spec(g, cpus=c, mem=m, mode=mode, vram=v)
             for g in (None, "1", "2", "0.5", "t4:1", "rtx4090:1") for c in (None, 4, 12) for m in (None, "16G")
             for mode, v in (("exclusive", None), ("shared", "10G"))]
    checked = 0
    for _ in range(300):
        gpus = [make_gpu(i, rng.choice(("rtx4090", "t4")), committed_fraction=f, committed_vram=f"{int(f * 16)}G",
                         used=f"{int(f * 16)}G", shared_jobs=int(f > 0)) for i, f in
                enumerate(rng.choice((0.0, 0.0, 0.5)) for _ in range(rng.randint(1, 4)))]
        node = NodeState(make_node("a", gpus, cpus=rng.choice((8, 16, 32)), mem="64G",
                                   cpus_committed=rng.choice((0, 4)), mem_committed=rng.choice(("0", "32G"))))
        head, job = (rank_requests(rng.choice(specs))[0] for _ in range(2))
        alloc = node.fit(job)
        if alloc is None or node.fit(head) is None:
            continue
        after = node.copy()
        after.take(alloc)
        assert (Reservation(0.0, head, {0: node}).short_after(0, alloc) is None) == (after.fit(head) is not None)
        checked += 1
    assert checked > 100

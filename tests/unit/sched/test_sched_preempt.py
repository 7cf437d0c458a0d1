"""Preemption in the pure scheduler (sched/preempt.py, docs/SCHEDULING.md "Preemption"):
a blocked guaranteed job stops opportunistic jobs, never a guaranteed one, never when it
could run elsewhere now, the fewest victims and the youngest first, one job per victim."""

from __future__ import annotations

from mtgpu.model.cluster import Preemption, RunningAlloc
from mtgpu.model.job import GpuMode, GpuSlot, NodeAllocation
from mtgpu.sched import schedule

from builders import G, cluster, make_gpu, make_job, make_node

OVER = GpuMode.OVERSUBSCRIBE


def over_gpu(index: int, jobs: int = 1, used: str = "0", **kw):
    return make_gpu(index, oversubscribed_jobs=jobs, used=used, **kw)


def opportunistic(job_id: int, node: str, gpu: int, *, started_at: float = 0.0, cpus: float = 0,
                  preemptible: bool = True, preempting_for: int | None = None) -> RunningAlloc:
    return RunningAlloc(job_id, (NodeAllocation(node, (GpuSlot(gpu, 0.0, 0, OVER),), cpus=cpus),),
                        started_at=started_at, preemptible=preemptible, preempting_for=preempting_for)


def test_an_exclusive_job_that_fits_nowhere_preempts_the_oversubscribed_job_in_its_way():
    snap = cluster(make_node("a", [over_gpu(0, used="10G")]))
    snap.running.append(opportunistic(90, "a", 0))
    plan = schedule(snap, [make_job(1, "1")], now=100)
    assert plan.placements == []
    assert plan.preemptions == [Preemption(90, 1, "a")]
    assert "preempting opportunistic job 90 on node a" in plan.pending[1]


def test_a_job_that_can_start_elsewhere_now_preempts_nothing():
    snap = cluster(make_node("a", [over_gpu(0)]), make_node("b", [make_gpu(0)]))
    snap.running.append(opportunistic(90, "a", 0))
    plan = schedule(snap, [make_job(1, "1")], now=100)
    assert [p.job_id for p in plan.placements] == [1] and plan.preemptions == []


def test_a_guaranteed_job_is_never_preempted_and_an_opportunistic_job_never_preempts():
    # GPU 0 held by a guaranteed shared job (not preemptible), GPU 1 by an oversubscribed one
    snap = cluster(make_node("a", [make_gpu(0, committed_fraction=0.5, committed_vram="12G", shared_jobs=1),
                                   over_gpu(1)]))
    snap.running.append(RunningAlloc(80, (NodeAllocation("a", (GpuSlot(0, 0.5, 12 * G, GpuMode.SHARED),)),),
                                     preemptible=False))
    snap.running.append(opportunistic(90, "a", 1))
    plan = schedule(snap, [make_job(1, "2")], now=100)  # needs both GPUs: 80 is in the way, never stopped
    assert plan.preemptions == []
    plan = schedule(snap, [make_job(2, "1", mode="oversubscribe", vram="30G")], now=100)
    assert plan.preemptions == []  # an opportunistic job waits, it takes nothing from anyone


def test_the_node_with_fewest_victims_is_chosen_and_the_youngest_go_first():
    snap = cluster(make_node("a", [over_gpu(0, jobs=2)]), make_node("b", [over_gpu(0, jobs=1)]),
                   make_node("c", [over_gpu(0, jobs=2), over_gpu(1, jobs=1)]))
    snap.running += [opportunistic(10, "a", 0, started_at=5), opportunistic(11, "a", 0, started_at=9),
                     opportunistic(20, "b", 0, started_at=1),
                     opportunistic(30, "c", 0, started_at=1), opportunistic(31, "c", 0, started_at=2),
                     opportunistic(32, "c", 1, started_at=3)]
    plan = schedule(snap, [make_job(1, "1")], now=100)
    assert plan.preemptions == [Preemption(20, 1, "b")]
    # a job of two GPUs: node c, all three of its jobs (a and b have one GPU)
    plan = schedule(snap, [make_job(2, "2")], now=100)
    assert sorted(p.victim for p in plan.preemptions) == [30, 31, 32]
    assert {p.node for p in plan.preemptions} == {"c"}


def test_on_a_node_the_most_recently_started_victim_goes_first_and_no_more_than_needed():
    # two GPUs, one oversubscribed job on each: a one-GPU job stops only the younger one
    snap = cluster(make_node("a", [over_gpu(0), over_gpu(1)]))
    snap.running += [opportunistic(10, "a", 0, started_at=50), opportunistic(11, "a", 1, started_at=60)]
    plan = schedule(snap, [make_job(1, "1")], now=100)
    assert plan.preemptions == [Preemption(11, 1, "a")]


def test_a_victim_is_stopped_for_one_job_and_a_job_waiting_for_its_victims_preempts_no_more():
    snap = cluster(make_node("a", [over_gpu(0)]), make_node("b", [over_gpu(0)]))
    snap.running += [opportunistic(10, "a", 0), opportunistic(20, "b", 0)]
    plan = schedule(snap, [make_job(1, "1", priority=5), make_job(2, "1"), make_job(3, "1")], now=100)
    assert sorted((p.for_job, p.victim) for p in plan.preemptions) in ([(1, 10), (2, 20)], [(1, 20), (2, 10)])
    assert 3 not in {p.for_job for p in plan.preemptions}
    # next pass: 10 stops for job 1; job 1 waits for it, preempts nothing more
    snap.running[0] = opportunistic(10, "a", 0, preempting_for=1)
    plan = schedule(snap, [make_job(1, "1", priority=5)], now=101)
    assert plan.preemptions == []
    assert plan.pending[1].startswith("waits for job 10, preempted for it, to stop")


def test_a_job_preempted_too_often_lately_is_not_chosen():
    snap = cluster(make_node("a", [over_gpu(0)]))
    snap.running.append(opportunistic(90, "a", 0, preemptible=False))  # the server says: not now
    plan = schedule(snap, [make_job(1, "1")], now=100)
    assert plan.preemptions == [] and "preempting" not in plan.pending[1]


def test_cpus_held_by_an_opportunistic_job_are_freed_for_a_cpu_only_job():
    snap = cluster(make_node("a", [over_gpu(0)], cpus=8, cpus_committed=6))
    snap.running.append(opportunistic(90, "a", 0, cpus=6))
    plan = schedule(snap, [make_job(1, None, cpus=4)], now=100)
    assert plan.preemptions == [Preemption(90, 1, "a")]


def test_a_shared_job_that_needs_the_victims_measured_vram_preempts_them():
    snap = cluster(make_node("a", [over_gpu(0, used="20G")]))
    snap.running.append(opportunistic(90, "a", 0))
    plan = schedule(snap, [make_job(1, "1", mode="shared", vram="16G")], now=100)
    assert plan.preemptions == [Preemption(90, 1, "a")]


def test_a_gang_preempts_nothing():
    snap = cluster(make_node("a", [over_gpu(0)]), make_node("b", [over_gpu(0)]))
    snap.running += [opportunistic(10, "a", 0), opportunistic(20, "b", 0)]
    plan = schedule(snap, [make_job(1, "1", nodes=2)], now=100)
    assert plan.preemptions == []

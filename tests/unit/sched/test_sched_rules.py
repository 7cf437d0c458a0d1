"""Issue 3: alternatives, vendors, CPU-only, server=, gangs, arrays, order, backfill, packing."""

from __future__ import annotations

from mtgpu.model.cluster import RunningAlloc, TenantUsage
from mtgpu.model.job import GpuMode, GpuSlot, NodeAllocation
from mtgpu.sched import Scheduler, schedule
from mtgpu.sched.order import base_priority, fair_share_penalty

from builders import cluster, make_gpu, make_job, make_node, make_spec


def placed(plan):
    return {p.job_id: p for p in plan.placements}


def nodes_of(plan, job_id):
    return [a.node for a in placed(plan)[job_id].allocations]


# ---- requests -----------------------------------------------------------------

def test_alternatives_take_whichever_model_is_free():
    snap = cluster(make_node("a", [make_gpu(0, "a100", "80G", exclusive=True, committed_fraction=1.0)]),
                   make_node("b", 1, model="h100", vram="80G"))
    plan = schedule(snap, [make_job(1, "a100:1|h100:1")], now=0)
    assert nodes_of(plan, 1) == ["b"]


def test_alternatives_pending_reason_names_each_alternative():
    snap = cluster(make_node("a", [make_gpu(0, "a100", "80G", exclusive=True, committed_fraction=1.0)]))
    plan = schedule(snap, [make_job(1, "a100:1|h100:1")], now=0)
    assert plan.pending[1] == "node a: a100:1: no idle a100 / h100:1: no GPU of model h100"


def test_vendor_request_matches_only_that_vendor():
    snap = cluster(make_node("a", [make_gpu(0, "mi300x", "192G", vendor="amd")]), make_node("b", 1))
    plan = schedule(snap, [make_job(1, "nvidia:1"), make_job(2, "amd:1")], now=0)
    assert nodes_of(plan, 1) == ["b"] and nodes_of(plan, 2) == ["a"]
    assert placed(plan)[2].allocations[0].vendor == "amd"


def test_model_prefix_matches_variants_but_not_other_numbers():
    snap = cluster(make_node("a", 1, model="A100-SXM4-80GB", vram="80G"), make_node("b", 1, model="a10", vram="24G"))
    plan = schedule(snap, [make_job(1, "a100:1"), make_job(2, "a10:1")], now=0)
    assert nodes_of(plan, 1) == ["a"] and nodes_of(plan, 2) == ["b"]


def test_cpu_only_job_prefers_cpu_only_node_and_keeps_gpu_nodes_usable():
    snap = cluster(make_node("gpu", 2, cpus=16), make_node("cpu", 0, cpus=64))
    plan = schedule(snap, [make_job(1, cpus=12, mem="8G")], now=0)
    alloc = placed(plan)[1].allocations[0]
    assert alloc.node == "cpu" and alloc.gpus == () and alloc.cpus == 12


def test_cpu_only_node_refuses_gpu_jobs_with_a_reason():
    snap = cluster(make_node("cpu", 0), make_node("g", [make_gpu(0, exclusive=True, committed_fraction=1.0)]))
    plan = schedule(snap, [make_job(1, "1")], now=0)
    assert plan.pending[1] == "node cpu: no GPU (CPU-only node); node g: no idle GPU"


def test_server_pins_the_job_to_one_node():
    snap = cluster(make_node("a", 4), make_node("b", 4))
    plan = schedule(snap, [make_job(i, "1", server="b") for i in range(1, 6)], now=0)
    assert all(nodes_of(plan, i) == ["b"] for i in range(1, 5))
    assert plan.pending[5] == "node b: no idle GPU"


def test_server_on_unknown_node_is_rejected():
    plan = schedule(cluster(make_node("a", 1)), [make_job(1, "1", server="zz")], now=0)
    assert plan.rejected[1] == "server=zz: no node of that name in the cluster"


# ---- gangs ----------------------------------------------------------------------

def test_gang_places_ranks_on_distinct_nodes_at_once():
    snap = cluster(make_node("a", 2), make_node("b", 2), make_node("c", 2))
    plan = schedule(snap, [make_job(1, "2", nodes=3)], now=0)
    ranks = placed(plan)[1].allocations
    assert sorted(a.node for a in ranks) == ["a", "b", "c"]
    assert all(len(a.gpus) == 2 for a in ranks)


def test_gang_is_all_or_nothing():
    snap = cluster(make_node("a", 2), make_node("b", [make_gpu(0), make_gpu(1, exclusive=True, committed_fraction=1)]))
    plan = schedule(snap, [make_job(1, "2", nodes=2), make_job(2, "1", time=60)], now=0)
    assert 1 not in placed(plan)
    assert plan.pending[1].startswith("nodes=2: only 1 node can take a rank now")
    # the free GPUs stay free: nothing was half-placed
    sched = Scheduler(snap)
    assert sched.place(make_spec("2", nodes=2)) is None
    assert sched.place(make_spec("2")) is not None


def test_gang_needing_more_nodes_than_exist_is_rejected():
    plan = schedule(cluster(make_node("a", 2), make_node("b", 0)), [make_job(1, "1", nodes=2)], now=0)
    assert plan.rejected[1].startswith("nodes=2 but only 1 node could ever run one rank")


# ---- arrays ---------------------------------------------------------------------

def test_array_runs_at_most_k_tasks_at_once():
    snap = cluster(make_node("a", 8))
    jobs = [make_job(10 + i, "1", array_parent=10, array_max=3, array_n=6, submitted_at=i) for i in range(6)]
    plan = schedule(snap, jobs, now=100)
    assert set(placed(plan)) == {10, 11, 12}
    assert plan.pending[13] == "array limit: 3 of its tasks running (%3)"


def test_array_limit_counts_tasks_already_running():
    snap = cluster(make_node("a", 8))
    jobs = [make_job(10 + i, "1", array_parent=9, array_max=3, array_n=6, running_in_array=2) for i in range(4)]
    plan = schedule(snap, jobs, now=100)
    assert set(placed(plan)) == {10}


# ---- order ----------------------------------------------------------------------

def test_higher_priority_goes_first():
    snap = cluster(make_node("a", 1))
    plan = schedule(snap, [make_job(1, "1", submitted_at=0), make_job(2, "1", priority=5, submitted_at=10)], now=20)
    assert set(placed(plan)) == {2}


def test_aging_lets_a_long_waiting_low_priority_job_overtake():
    snap = cluster(make_node("a", 1))
    old = make_job(1, "1", submitted_at=0)
    new = make_job(2, "1", priority=5, submitted_at=6 * 3600 - 10)
    plan = schedule(snap, [new, old], now=6 * 3600)
    assert set(placed(plan)) == {1}
    assert base_priority(old, 6 * 3600) == 6.0


def test_fair_share_interleaves_a_burst_with_another_tenants_job():
    snap = cluster(make_node("a", 3))
    burst = [make_job(i, "1", tenant="alice", submitted_at=i) for i in range(1, 501)]
    bob = make_job(1000, "1", tenant="bob", submitted_at=600)
    plan = schedule(snap, burst + [bob], now=1000)
    assert 1000 in placed(plan)
    assert len(placed(plan)) == 3


def test_recent_usage_lowers_a_tenant_priority():
    snap = cluster(make_node("a", 1))
    jobs = [make_job(1, "1", tenant="heavy", submitted_at=0), make_job(2, "1", tenant="light", submitted_at=50)]
    usage = {"heavy": TenantUsage("heavy", gpu_seconds=100 * 3600)}
    plan = schedule(snap, jobs, now=100, usage=usage)
    assert set(placed(plan)) == {2}
    assert fair_share_penalty(3600) == 1.0


def test_a_share_divides_the_tenants_usage_in_the_fair_share_term():
    assert fair_share_penalty(2 * 3600, share=2) == 1.0 == fair_share_penalty(3600)
    snap = cluster(make_node("a", 1))
    jobs = [make_job(1, "1", tenant="small", submitted_at=0), make_job(2, "1", tenant="big", submitted_at=50)]
    same_use = {"small": TenantUsage("small", gpu_seconds=3 * 3600),
                "big": TenantUsage("big", gpu_seconds=3 * 3600, share=3)}
    assert set(placed(schedule(snap, jobs, now=100, usage=same_use))) == {2}
    same_use["big"].share = 1.0  # without the share the earlier job goes first
    assert set(placed(schedule(snap, jobs, now=100, usage=same_use))) == {1}


def test_busy_tenants_get_gpus_in_the_ratio_of_their_shares():
    snap = cluster(make_node("a", 8))
    jobs = [make_job(i, "1", tenant="a", submitted_at=0, time=3600) for i in range(1, 21)]
    jobs += [make_job(100 + i, "1", tenant="b", submitted_at=0, time=3600) for i in range(1, 21)]
    usage = {"a": TenantUsage("a", share=3.0), "b": TenantUsage("b")}
    started = placed(schedule(snap, jobs, now=10, usage=usage))
    assert sum(j < 100 for j in started) == 6 and sum(j > 100 for j in started) == 2
    even = placed(schedule(snap, jobs, now=10))
    assert sum(j < 100 for j in even) == 4


def test_a_fraction_of_a_point_of_priority_is_caught_up_in_that_fraction_of_an_hour():
    snap = cluster(make_node("a", 1))
    low = make_job(1, "1", priority=-0.01, submitted_at=0)  # 0.01 point = 36 s of waiting
    within = make_job(2, "1", submitted_at=35)
    beyond = make_job(3, "1", submitted_at=37)
    assert set(placed(schedule(snap, [low, within], now=1000))) == {2}
    assert set(placed(schedule(snap, [low, beyond], now=1000))) == {1}


# ---- backfill -------------------------------------------------------------------

def _busy_node(name, n_busy, n_free, job_id=99):
    gpus = [make_gpu(i, exclusive=True, committed_fraction=1.0) for i in range(n_busy)]
    gpus += [make_gpu(n_busy + i) for i in range(n_free)]
    return make_node(name, gpus)


def test_without_time_limits_nothing_jumps_a_blocked_head():
    snap = cluster(_busy_node("a", 3, 1))
    jobs = [make_job(1, "2", priority=10), make_job(2, "1")]
    plan = schedule(snap, jobs, now=0)
    assert plan.placements == []
    assert plan.pending[2].startswith("held for job 1")


def test_backfill_runs_a_short_job_that_ends_before_the_head_can_start():
    snap = cluster(_busy_node("a", 2, 2))
    snap.running.append(RunningAlloc(99, (NodeAllocation("a", (GpuSlot(0), GpuSlot(1))),), ends_at=3600))
    jobs = [make_job(1, "4", priority=10), make_job(2, "1", time=1800), make_job(3, "1", time=7200)]
    plan = schedule(snap, jobs, now=0)
    assert set(placed(plan)) == {2}
    assert plan.pending[3].startswith("held for job 1")


def test_backfill_may_use_nodes_the_head_could_never_use():
    snap = cluster(_busy_node("a", 3, 1), make_node("cpu", 0, cpus=64))
    jobs = [make_job(1, "2", priority=10), make_job(2, cpus=8)]
    plan = schedule(snap, jobs, now=0)
    assert nodes_of(plan, 2) == ["cpu"]


# ---- packing --------------------------------------------------------------------

def test_fractions_pack_onto_a_started_gpu_and_keep_whole_gpus_free():
    snap = cluster(make_node("a", [make_gpu(0, committed_fraction=0.5, committed_vram="12G", used="12G",
                                            shared_jobs=1), make_gpu(1)]), make_node("b", 2))
    plan = schedule(snap, [make_job(1, "0.5")], now=0)
    slot = placed(plan)[1].allocations[0]
    assert slot.node == "a" and slot.gpus[0].index == 0


def test_whole_gpu_job_goes_where_it_leaves_whole_nodes_for_big_jobs():
    snap = cluster(make_node("a", 8), make_node("b", [make_gpu(0), make_gpu(1),
                                                      make_gpu(2, exclusive=True, committed_fraction=1.0)]))
    queue = [make_job(1, "1"), make_job(2, "8"), make_job(3, "8")]
    plan = schedule(snap, queue, now=0)
    assert nodes_of(plan, 1) == ["b"]
    assert nodes_of(plan, 2) == ["a"]


def test_ties_are_broken_by_the_job_id_so_decisions_replay():
    snap = cluster(*[make_node(f"n{i}", 4) for i in range(8)])
    a = [nodes_of(schedule(snap, [make_job(j, "1")], now=0), j)[0] for j in range(1, 9)]
    b = [nodes_of(schedule(snap, [make_job(j, "1")], now=0), j)[0] for j in range(1, 9)]
    assert a == b and len(set(a)) > 1


def test_scheduler_place_commits_to_its_working_copy():
    sched = Scheduler(cluster(make_node("a", 1, vram="24G")))
    assert sched.place(make_spec("0.5"), 1) is not None
    assert sched.place(make_spec("0.5"), 2) is not None
    assert sched.place(make_spec("0.5"), 3) is None
    assert sched.fleet.states[0].gpus[0].frac == 1.0


def test_oversubscribe_shares_with_shared_jobs_but_not_exclusive_ones():
    snap = cluster(make_node("a", [make_gpu(0, committed_fraction=1.0, committed_vram="24G", shared_jobs=2)]))
    plan = schedule(snap, [make_job(1, "1", mode="oversubscribe")], now=0)
    assert placed(plan)[1].allocations[0].gpus[0].mode is GpuMode.OVERSUBSCRIBE


def test_fragmentation_counts_cpus_that_cannot_feed_the_free_gpus():
    # Same free GPUs; b's CPUs could feed only one of the 4-CPU jobs its 4 GPUs could take.
    sched = Scheduler(cluster(make_node("a", 4, cpus=16), make_node("b", 4, cpus=5)),
                      workload=[(Scheduler(cluster(make_node("x", 1))).requests(make_spec("1", cpus=4))[0], 1.0)])
    assert sched.value[1] < sched.value[0]


def test_nodes_within_one_score_step_are_chosen_by_job_id_not_best_fit():
    # a has 1 idle GPU of 4, b 4 of 4: both keep every kind usable, so both are in the top step.
    busy = [make_gpu(i, exclusive=True, committed_fraction=1.0) for i in range(3)]
    snap = cluster(make_node("a", busy + [make_gpu(3)]), make_node("b", 4))
    sched = Scheduler(snap, workload=[(Scheduler(snap).requests(make_spec("1"))[0], 1.0)])
    req = sched.requests(make_spec("1"))[0]
    score = sched.scores(req).score
    assert score[0] == score[1] == 0.0  # no fragmentation removed or added, the same step
    a = [sched.place(make_spec("1"), j) is not None for j in (1,)]
    assert a == [True]

"""Issue 2 #6 and issue 3: the basic fit rules and the three verdicts."""

from __future__ import annotations

from mtgpu.model.job import GpuMode
from mtgpu.sched import check_satisfiable, schedule

from builders import G, cluster, make_gpu, make_job, make_node, make_spec


def placed(plan):
    return {p.job_id: p for p in plan.placements}


def test_three_exclusive_one_gpu_jobs_on_two_gpus_two_run_one_waits():
    snap = cluster(make_node("a", 2))
    plan = schedule(snap, [make_job(i, "1") for i in (1, 2, 3)], now=0)
    got = placed(plan)
    assert set(got) == {1, 2}
    assert {got[1].allocations[0].gpus[0].index, got[2].allocations[0].gpus[0].index} == {0, 1}
    assert 3 in plan.pending and "no idle GPU" in plan.pending[3]


def test_exclusive_skips_gpus_with_shared_or_oversubscribed_jobs():
    snap = cluster(make_node("a", [make_gpu(0, committed_fraction=0.5, committed_vram="10G", shared_jobs=1),
                                   make_gpu(1, oversubscribed_jobs=1), make_gpu(2)]))
    plan = schedule(snap, [make_job(1, "1")], now=0)
    assert placed(plan)[1].allocations[0].gpus[0].index == 2


def test_two_shared_10g_jobs_share_a_24g_gpu_and_a_third_waits():
    snap = cluster(make_node("a", 1, vram="24G"))
    jobs = [make_job(i, "1", mode="shared", vram="10G") for i in (1, 2, 3)]
    plan = schedule(snap, jobs, now=0)
    got = placed(plan)
    assert set(got) == {1, 2}
    slot = got[1].allocations[0].gpus[0]
    assert slot.mode is GpuMode.SHARED and slot.vram_bytes == 10 * G
    assert plan.pending[3] == "node a: not enough free VRAM on any GPU (4G < 10G)"


def test_shared_mode_refuses_gpu_when_measured_free_vram_is_short():
    # Nothing committed, but another program uses 20G of 24G: the measurement counts.
    snap = cluster(make_node("a", [make_gpu(0, used="20G")]))
    plan = schedule(snap, [make_job(1, "rtx4090:1", mode="shared", vram="10G")], now=0)
    assert plan.pending[1] == "node a: not enough free VRAM on any rtx4090 (4G < 10G)"


def test_shared_never_lands_on_an_exclusive_gpu():
    snap = cluster(make_node("a", [make_gpu(0, exclusive=True, committed_fraction=1.0)]))
    plan = schedule(snap, [make_job(1, "0.25")], now=0)
    assert 1 in plan.pending and "held exclusively" in plan.pending[1]


def test_fraction_implies_shared_and_reserves_its_share_of_memory():
    snap = cluster(make_node("a", 1, vram="24G"))
    plan = schedule(snap, [make_job(i, "0.5") for i in (1, 2, 3)], now=0)
    got = placed(plan)
    assert set(got) == {1, 2}
    slot = got[1].allocations[0].gpus[0]
    assert slot.mode is GpuMode.SHARED and slot.fraction == 0.5 and slot.vram_bytes == 12 * G


def test_fractions_on_one_gpu_never_sum_past_one():
    snap = cluster(make_node("a", 1, vram="80G"))
    jobs = [make_job(1, "0.75", vram="1G"), make_job(2, "0.5", vram="1G")]
    plan = schedule(snap, jobs, now=0)
    assert set(placed(plan)) == {1} and 2 in plan.pending


def test_a_fraction_with_vram_counts_its_fraction_as_its_share_not_its_vram():
    # 0.75 of the GPU is given out with 1G reserved: a 0.25 share with vram=12G fits (shares 1.0,
    # VRAM 13G of 24G), though 12G is half the device.
    snap = cluster(make_node("a", [make_gpu(0, committed_fraction=0.75, committed_vram="1G", shared_jobs=1)]))
    plan = schedule(snap, [make_job(1, "0.25", vram="12G")], now=0)
    slot = placed(plan)[1].allocations[0].gpus[0]
    assert slot.fraction == 0.25 and slot.vram_bytes == 12 * G


def test_shared_whole_gpu_without_vram_reserves_the_whole_device():
    snap = cluster(make_node("a", 1))
    plan = schedule(snap, [make_job(1, "1", mode="shared"), make_job(2, "0.1")], now=0)
    got = placed(plan)
    assert set(got) == {1}
    assert got[1].allocations[0].gpus[0].vram_bytes == 24 * G


def test_shared_whole_gpu_without_vram_fits_beside_an_oversubscribed_job_as_its_slot_does():
    # Its slot (share 1, the whole device's VRAM) is what the state machine checks, and an
    # oversubscribed job commits neither; gpus=1 gpu-mode=shared vram=24G fits there too.
    snap = cluster(make_node("a", [make_gpu(0, oversubscribed_jobs=1)]))
    plan = schedule(snap, [make_job(1, "1", mode="shared"), make_job(2, "1", mode="shared", vram="24G")], now=0)
    slot = placed(plan)[1].allocations[0].gpus[0]
    assert slot.fraction == 1.0 and slot.vram_bytes == 24 * G
    assert plan.pending[2] == "node a: not enough free VRAM on any GPU (0B < 24G)"


def test_shared_whole_gpu_without_vram_waits_while_an_oversubscribed_job_uses_memory():
    snap = cluster(make_node("a", [make_gpu(0, oversubscribed_jobs=1, used="2G")]))
    plan = schedule(snap, [make_job(1, "1", mode="shared")], now=0)
    assert plan.pending[1] == "node a: no unshared GPU (0 of 1 asked)"


def test_oversubscribe_picks_least_loaded_gpu_and_guarantees_nothing():
    snap = cluster(make_node("a", [make_gpu(0, util=90, used="20G"), make_gpu(1, util=10, used="2G"),
                                   make_gpu(2, exclusive=True, committed_fraction=1.0)]))
    plan = schedule(snap, [make_job(1, "1", mode="oversubscribe")], now=0)
    slot = placed(plan)[1].allocations[0].gpus[0]
    assert slot.index == 1 and slot.vram_bytes == 0 and slot.mode is GpuMode.OVERSUBSCRIBE


def test_oversubscribe_never_uses_an_exclusive_gpu():
    snap = cluster(make_node("a", [make_gpu(0, exclusive=True, committed_fraction=1.0)]))
    plan = schedule(snap, [make_job(1, "1", mode="oversubscribe")], now=0)
    assert "held exclusively" in plan.pending[1]


def test_exclusive_vram_filters_by_total_and_measured_free():
    snap = cluster(make_node("a", [make_gpu(0, "a100", "40G"), make_gpu(1, "a100", "80G", used="50G"),
                                   make_gpu(2, "a100", "80G")]))
    plan = schedule(snap, [make_job(1, "1", vram="48G")], now=0)
    assert placed(plan)[1].allocations[0].gpus[0].index == 2


def test_cpus_and_memory_count_commitments_and_measurement():
    snap = cluster(make_node("a", 0, cpus=16, cpus_committed=10, mem="64G"),
                   make_node("b", 0, cpus=16, mem="64G", mem_committed="10G", mem_available="8G"),
                   make_node("c", 0, cpus=16, mem="64G"))
    plan = schedule(snap, [make_job(1, cpus=8, mem="16G"), make_job(2, cpus=8, mem="16G"),
                           make_job(3, cpus=8, mem="16G")], now=0)
    got = placed(plan)
    assert set(got) == {1, 2}
    assert {a.node for p in got.values() for a in p.allocations} == {"c"}
    assert plan.pending[3] == ("node a: not enough free CPUs (6 < 8); node b: not enough free memory (8G < 16G); "
                               "node c: not enough free CPUs (0 < 8)")


def test_one_pass_never_double_books_a_gpu():
    snap = cluster(make_node("a", 4), make_node("b", 4))
    plan = schedule(snap, [make_job(i, "1") for i in range(1, 12)], now=0)
    slots = [(a.node, s.index) for p in plan.placements for a in p.allocations for s in a.gpus]
    assert len(slots) == 8 and len(set(slots)) == 8
    assert len(plan.pending) == 3


def test_pending_reason_names_each_node():
    snap = cluster(make_node("a", [make_gpu(0, "rtx4090", "24G", used="12G", committed_vram="12G",
                                            committed_fraction=0.5, shared_jobs=1)]),
                   make_node("b", 2, model="a100", vram="80G"))
    plan = schedule(snap, [make_job(1, "rtx4090:1", mode="shared", vram="20G")], now=0)
    assert plan.pending[1] == "node a: not enough free VRAM on any rtx4090 (12G < 20G); node b: no GPU of model rtx4090"


def test_drained_node_takes_nothing_and_says_why():
    snap = cluster(make_node("a", 1, schedulable=False, reason="drained by an admin"))
    plan = schedule(snap, [make_job(1, "1")], now=0)
    assert plan.pending[1] == "node a: drained by an admin"
    assert plan.rejected == {}


def test_never_fitting_job_is_rejected_with_the_reason():
    snap = cluster(make_node("a", 2), make_node("b", 0))
    plan = schedule(snap, [make_job(1, "h200:1"), make_job(2, "1")], now=0)
    assert plan.rejected == {1: "node a: no GPU of model h200; node b: no GPU (CPU-only node)"}
    assert set(placed(plan)) == {2}


def test_check_satisfiable_verdicts():
    snap = cluster(make_node("a", 2, vram="24G", cpus=16, mem="64G"),
                   make_node("b", 0, cpus=64, mem="256G", schedulable=False))
    assert check_satisfiable(make_spec("1"), snap) is None
    assert check_satisfiable(make_spec(cpus=64), snap) is None  # the drained node may come back
    assert check_satisfiable(make_spec("3"), snap) == "node a: only 2 GPUs (3 asked); node b: no GPU (CPU-only node)"
    assert "no rtx4090 with 32G VRAM" in check_satisfiable(make_spec("rtx4090:1", vram="32G"), snap)
    assert "has 16 CPUs (32 asked)" in check_satisfiable(make_spec("1", cpus=32), snap)
    assert "has 64G memory (128G asked)" in check_satisfiable(make_spec("1", mem="128G"), snap)
    assert "no GPU of vendor amd" in check_satisfiable(make_spec("amd:1"), snap)
    assert check_satisfiable(make_spec("1", server="zz"), snap) == "server=zz: no node of that name in the cluster"
    assert check_satisfiable(make_spec(server="b"), snap) is None
    assert "only 1 node could ever run one rank" in check_satisfiable(make_spec("1", nodes=2), snap)
    assert check_satisfiable(make_spec(cpus=8, nodes=2), snap) is None


def test_schedule_is_deterministic_and_leaves_inputs_alone():
    snap = cluster(make_node("a", 4), make_node("b", 2, model="a100", vram="80G"), make_node("c", 0))
    queue = [make_job(i, g) for i, g in enumerate(["1", "0.5", "a100:1", "2", "0.25", None, "1"], 1)]
    before = repr(snap)
    p1, p2 = schedule(snap, queue, now=100.0), schedule(snap, queue, now=100.0)
    assert p1 == p2
    assert repr(snap) == before


def test_exclude_keeps_a_job_off_those_nodes_and_all_of_them_is_refused():
    from dataclasses import replace
    from mtgpu.sched import schedule
    snap = cluster(make_node("a", gpus=1), make_node("b", gpus=1))
    job = make_job(1, "1")
    job = replace(job, spec=replace(job.spec, exclude=("a",)))
    plan = schedule(snap, [job], 0.0)
    assert [a.node for p in plan.placements for a in p.allocations] == ["b"]
    every = replace(job.spec, exclude=("a", "b"))
    assert check_satisfiable(every, snap) == "exclude=a,b leaves no node of the cluster"
    two = replace(make_spec("1", nodes=2), exclude=("b",))
    assert check_satisfiable(two, snap) is not None  # a gang of 2 with one node left

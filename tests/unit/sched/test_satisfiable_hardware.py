"""The reject reason judged once per kind of node (satisfiable.hardware_ids) is the reason
judged node by node, and the scheduler's pass uses it."""

from __future__ import annotations

from mtgpu.sched import Scheduler
from mtgpu.sched.satisfiable import check_satisfiable, hardware_ids

from builders import cluster, make_gpu, make_job, make_node, make_spec


def _fleet():
    return cluster(
        make_node("a1", 2, "rtx4090", "24G", cpus=16, mem="64G"),
        make_node("a2", 2, "rtx4090", "24G", cpus=16, mem="64G", cpus_committed=8),  # same hardware as a1
        make_node("b1", 4, "a100", "80G", cpus=64, mem="512G"),
        make_node("b2", 4, "a100", "40G", cpus=64, mem="512G"),  # same model, other VRAM
        make_node("c1", [make_gpu(0, "t4", "16G"), make_gpu(1, "rtx4090", "24G")], cpus=8, mem="32G"),
        make_node("c2", [make_gpu(0, "rtx4090", "24G"), make_gpu(1, "t4", "16G")], cpus=8, mem="32G"),  # other order
        make_node("d1", 0, cpus=128, mem="1024G"),
        make_node("d2", 0, cpus=128, mem="1024G", schedulable=False, reason="drained"),
    )


def test_hardware_ids_group_only_equal_hardware():
    ids = hardware_ids(_fleet().nodes)
    assert ids["a1"] == ids["a2"] and ids["d1"] == ids["d2"]
    assert len({ids["a1"], ids["b1"], ids["b2"], ids["c1"], ids["c2"], ids["d1"]}) == 6


def test_reasons_with_hardware_ids_are_the_reasons_node_by_node():
    snap = _fleet()
    ids = hardware_ids(snap.nodes)
    specs = [make_spec("5"), make_spec("rtx4090:3"), make_spec("a100:1", vram="60G"), make_spec("h100:1"),
             make_spec("t4:2|a100:8"), make_spec(cpus=256), make_spec(mem="2048G"), make_spec("1", cpus=100),
             make_spec("rtx4090:1", nodes=4), make_spec("a100:4", nodes=3), make_spec("1"), make_spec(cpus=64)]
    seen = 0
    for spec in specs:
        plain = check_satisfiable(spec, snap)
        assert check_satisfiable(spec, snap, ids) == plain, spec
        seen += plain is not None
    assert seen >= 8  # most of them are refused, with reasons that name several nodes


def test_the_pass_rejects_with_the_same_reason():
    snap = _fleet()
    spec = make_spec("rtx4090:3")
    plan = Scheduler(snap).run([make_job(7, "rtx4090:3")], now=0.0)
    assert plan.rejected[7] == check_satisfiable(spec, snap)
    assert "nodes a1, a2" in plan.rejected[7]

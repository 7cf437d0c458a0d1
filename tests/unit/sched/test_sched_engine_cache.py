"""The engine's shortcuts agree with computing from scratch: kept V values and GPU share
left, incremental scores, state ids, the factored CPU weights of the fragmentation model."""

from __future__ import annotations

import numpy as np
import pytest

from mtgpu.sched import Scheduler, frag
from mtgpu.sched.engine import _Scores
from mtgpu.sched.fleet import row_sum

from builders import cluster, make_gpu, make_node, make_spec

MIXED = [
    make_node("a", 4, model="rtx4090", vram="24G", cpus=16, mem="64G"),
    make_node("b", 8, model="a100", vram="80G", cpus=64, mem="512G"),
    make_node("c", 2, model="t4", vram="16G", cpus=8, mem="32G"),
    make_node("d", [make_gpu(0, "rtx4090", "24G"), make_gpu(1, "l40s", "48G"), make_gpu(2, "l40s", "48G")], cpus=24),
    make_node("e", 0, cpus=32, mem="128G"),
    make_node("f", 4, model="rtx4090", vram="24G", cpus=16, mem="64G"),
]
JOBS = [
    make_spec("0.25", cpus=2), make_spec("1", vram="12G", mode="shared", cpus=2), make_spec("2", cpus=4),
    make_spec(None, cpus=4, mem="8G"), make_spec("0.5", cpus=1), make_spec("1", cpus=2),
    make_spec("l40s:1|rtx4090:1", cpus=2), make_spec("1", mode="oversubscribe"), make_spec("1", vram="20G", mode="shared"),
    make_spec("4", cpus=8), make_spec("0.75", cpus=2), make_spec("rtx4090:0.5", cpus=1),
]


def _placed_scheduler() -> Scheduler:
    sched = Scheduler(cluster(*MIXED))
    sched.set_workload([(sched.requests(s)[0], 1.0 + i % 3) for i, s in enumerate(JOBS)])
    for i in range(40):
        sched.place(JOBS[i % len(JOBS)], job_id=i + 1)
    return sched


def test_kept_node_values_equal_recomputed_ones():
    sched = _placed_scheduler()
    f = sched.fleet
    fresh = sched.frag.value(f.left, f.gmodel, f.cpus_free, f.mem_usable.astype(np.float64))
    assert np.allclose(sched.value, fresh, rtol=0, atol=1e-12)


def test_kept_gpu_share_left_per_node_equals_the_sum_over_its_gpus():
    f = _placed_scheduler().fleet
    assert np.array_equal(f.left_sum, [row_sum(r) for r in f.left.tolist()])
    assert np.allclose(f.left_sum, f.left.sum(axis=1), rtol=0, atol=1e-12)


def test_incremental_scores_equal_scores_from_scratch():
    sched = _placed_scheduler()
    for spec in JOBS:
        for req in sched.requests(spec):
            kept = sched.scores(req)
            fresh = _Scores(sched.fleet.n)
            sched._compute_rows(req, fresh, np.arange(sched.fleet.n))
            assert np.array_equal(kept.score, fresh.score)
            fits = fresh.score > -np.inf
            assert np.array_equal(kept.gpu[fits], fresh.gpu[fits])


def test_equal_node_states_share_a_state_id_until_one_changes():
    sched = Scheduler(cluster(make_node("a", 2), make_node("b", 2), make_node("c", 4)))
    every = np.arange(3)
    before = sched.fleet.row_keys(every).copy()
    assert before[0] == before[1] != before[2]
    (alloc,) = sched.place(make_spec("0.5"), job_id=1)
    row = sched.fleet.row_of[alloc.node]
    ids = sched.fleet.row_keys(every)
    assert ids[row] not in before
    assert all(ids[i] == before[i] for i in range(3) if i != row)


@pytest.mark.parametrize("table", [True, False])
def test_factored_cpu_weights_equal_the_direct_formula(monkeypatch, table):
    if not table:
        monkeypatch.setattr(frag, "HOST_TABLE_MAX", 0)
    sched = Scheduler(cluster(*MIXED))
    sched.set_workload([(sched.requests(s)[0], 1.0 + i % 3) for i, s in enumerate(JOBS)])
    fm = sched.frag
    assert (fm.host_p is not None) == table
    rng = np.random.default_rng(7)
    cpu = np.concatenate([rng.uniform(0, 20, 200), fm.t_cpu, [0.0]])
    mem = np.concatenate([rng.uniform(0, 40, 200) * 2**30, fm.t_mem, [0.0]])
    free = np.concatenate([rng.uniform(0, 8, 200), fm.t_need, [0.0]])
    host = (cpu[:, None] + frag.EPS >= fm.t_cpu) & (mem[:, None] >= fm.t_mem)
    jobs = np.maximum(1.0, np.floor(free[:, None] / fm.t_need + 1e-9))
    h = np.where(host, np.minimum(1.0, (cpu[:, None] + frag.EPS) / (fm.t_cpu_pos * jobs)), 0.0) ** frag.CPU_SOFTNESS
    assert np.allclose(fm._weights(cpu, mem, free), h @ fm.p_grp, rtol=1e-12, atol=1e-14)


def test_kept_values_stay_exact_for_vram_shares_that_differ_by_gpu():
    # A `vram=` share is a different fraction of GPUs of different sizes, and nodes with fewer
    # GPUs than the widest pad their rows: the V a score computes is then not the node's.
    jobs = [make_spec("1", vram="12G", mode="shared", cpus=1), make_spec("0.25", cpus=2),
            make_spec("1", vram="8G", mode="shared", cpus=2)]
    for k in range(3):
        sched = Scheduler(cluster(make_node("a", 2, vram="24G", cpus=8),
                                  make_node("b", 4, model="l40s", vram="48G", cpus=16),
                                  make_node("c", 8, model="t4", vram="16G", cpus=32)))
        sched.set_workload([(sched.requests(j)[0], 1.0) for j in jobs])
        for i in range(12):
            assert sched.place(jobs[(i + k) % 3], job_id=i + 1) is not None
        f = sched.fleet
        fresh = sched.frag.value(f.left, f.gmodel, f.cpus_free, f.mem_usable.astype(np.float64))
        assert np.allclose(sched.value, fresh, rtol=0, atol=1e-12)

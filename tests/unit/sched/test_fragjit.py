"""The compiled forms of FragModel's value and value_one_gpu (sched/fragjit.py) against
the numpy forms (frag.py), on seeded random fleets, workloads and node states: the same
values to rounding, the same -inf cells, and the same decisions of a whole engine pass."""

from __future__ import annotations

import random

import numpy as np
import pytest

from mtgpu.model.cluster import ClusterSnapshot, PendingJob
from mtgpu.model.job import GpuAlternative, GpuMode, JobSpec
from mtgpu.sched import frag, schedule
from mtgpu.sched.fleet import Fleet
from mtgpu.sched.frag import FragModel
from mtgpu.sched.request import RankRequest
from tests.unit.sched.builders import G, make_gpu, make_node

MODELS = [("rtx4090", "24G"), ("a100", "80G"), ("t4", "16G"), ("mi250", "64G")]


@pytest.fixture
def numpy_forms(monkeypatch):
    """Run `fn()` with the numpy forms; the compiled ones otherwise, at any fleet size."""
    monkeypatch.setattr(frag, "JIT_MIN_NODES", 0)

    def run(fn, model=None):
        with monkeypatch.context() as m:
            m.setattr(frag, "_JIT", [None])
            if model is not None:
                m.setattr(model, "jit_form", None)
            return fn()
    return run


def fleet_of(rng: random.Random) -> Fleet:
    nodes = []
    for i in range(rng.randint(3, 40)):
        model, vram = rng.choice(MODELS)
        n = rng.choice([0, 1, 2, 4, 8])
        gpus = [make_gpu(j, model if rng.random() < 0.9 else rng.choice(MODELS)[0], vram) for j in range(n)]
        nodes.append(make_node(f"n{i}", gpus, cpus=rng.choice([8, 32, 96]), mem=rng.choice(["64G", "512G"])))
    return Fleet(ClusterSnapshot(nodes=nodes))


def shapes_of(rng: random.Random) -> list:
    out = []
    for _ in range(rng.randint(1, 25)):
        n = rng.choice([1, 1, 1, 2, 4, 8])
        frac = rng.choice([1.0, 1.0, 0.5, 0.25, 0.3]) if n == 1 else 1.0
        mode = GpuMode.SHARED if frac < 1.0 else GpuMode.EXCLUSIVE
        model = rng.choice([None, None, "rtx4090", "a100", "t4"])
        req = RankRequest(n, frac, mode, None, model, None, rng.choice([0.0, 1.0, 4.0, 12.0, 40.0]),
                          rng.choice([0, 4 * G, 100 * G]), "x")
        out.append((req, rng.choice([0.5, 1.0, 3.0, 10.0])))
    return out


def states_of(rng: random.Random, f: Fleet) -> tuple[np.ndarray, ...]:
    b = rng.randint(1, 30)
    rows = np.array([rng.randrange(f.n) for _ in range(b)])
    left = f.left[rows].copy()
    for x in np.ndindex(left.shape):
        if f.gmodel[rows][x] != f.no_gpu:
            left[x] = rng.choice([0.0, 0.25, 0.5, 0.7, 1.0, 0.1 * rng.randint(0, 10)])
    cpu = np.array([rng.choice([0.0, 0.5, 3.0, 11.0, 64.0]) for _ in rows])
    mem = np.array([float(rng.choice([0, 3 * G, 50 * G, 400 * G])) for _ in rows])
    return rows, left, f.gmodel[rows].copy(), cpu, mem


def test_the_compiled_forms_give_the_numpy_forms_values(numpy_forms):
    assert frag.jit() is not None, "numba is a dependency (pyproject.toml): the compiled forms must load"
    rng = random.Random(2812)
    compared = 0
    for _case in range(120):
        f = fleet_of(rng)
        model = FragModel(f, shapes_of(rng))
        if model.empty:
            continue
        rows, left, gmodel, cpu, mem = states_of(rng, f)
        got = model.value(left, gmodel, cpu, mem)
        want = numpy_forms(lambda: model.value(left, gmodel, cpu, mem), model)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        cand = (gmodel != f.no_gpu) & (rng.random() < 0.5 or np.ones(left.shape, bool))
        cand &= np.array([[rng.random() < 0.8 for _ in range(left.shape[1])] for _ in range(left.shape[0])])
        for share in (rng.choice([0.25, 0.5, 1.0]), np.minimum(left, rng.choice([0.3, 1.0]))):
            got = model.value_one_gpu(left, gmodel, share, cpu, mem, cand)
            want = numpy_forms(lambda: model.value_one_gpu(left, gmodel, share, cpu, mem, cand), model)
            assert np.array_equal(np.isinf(got), np.isinf(want))
            finite = np.isfinite(want)
            np.testing.assert_allclose(got[finite], want[finite], rtol=1e-12, atol=1e-12)
            compared += int(finite.sum())
    assert compared > 500  # the cases did score candidates


def test_a_small_fleet_does_not_load_the_compiled_forms():
    small = Fleet(ClusterSnapshot(nodes=[make_node(f"n{i}", 2) for i in range(3)]))
    assert FragModel(small, shapes_of(random.Random(1))).jit_form is None
    big = Fleet(ClusterSnapshot(nodes=[make_node(f"n{i}", 2) for i in range(frag.JIT_MIN_NODES)]))
    assert FragModel(big, shapes_of(random.Random(1))).jit_form is frag.jit() is not None


def test_an_engine_pass_decides_the_same_with_either_form(numpy_forms):
    """Scores are whole SCORE_STEPs: rounding in the last bits does not move a placement."""
    rng = random.Random(7)
    nodes = []
    for i in range(30):
        model, vram = rng.choice(MODELS)
        nodes.append(make_node(f"n{i}", [make_gpu(j, model, vram) for j in range(rng.choice([1, 2, 4, 8]))],
                               cpus=64, mem="512G"))
    jobs = []
    for j in range(1, 400):
        frac = rng.choice([1.0, 0.5, 0.25])
        mode = GpuMode.SHARED if frac < 1.0 else GpuMode.EXCLUSIVE
        n = 1 if frac < 1.0 else rng.choice([1, 1, 2, 4])
        spec = JobSpec(gpus=(GpuAlternative(frac if frac < 1.0 else float(n), None, None),),
                       cpus=rng.choice([1, 4]), mem_bytes=rng.choice([1, 8]) * G, gpu_mode=mode)
        jobs.append(PendingJob(job_id=j, tenant=f"t{j % 7}", spec=spec, submitted_at=float(j)))

    def plan():
        result = schedule(ClusterSnapshot(nodes=nodes), jobs, now=1000.0)
        return [(p.job_id, [(a.node, [(g.index, g.fraction) for g in a.gpus]) for a in p.allocations])
                for p in result.placements]
    compiled = plan()
    assert len(compiled) > 50
    assert compiled == numpy_forms(plan)


def test_a_node_s_score_gpu_and_value_after_are_the_numpy_path_s(numpy_forms):
    """engine._compute_rows' compiled loop (fragjit.score_rows: CPU-only, one GPU's fraction,
    whole GPUs) on nodes in every state: busy, exclusive, partly shared, short of CPUs."""
    from mtgpu.sched.engine import Scheduler

    rng = random.Random(31)
    checked = 0
    for _case in range(25):
        nodes = []
        for i in range(rng.randint(5, 40)):
            model, vram = rng.choice(MODELS)
            gpus = [make_gpu(j, model, vram, exclusive=rng.random() < 0.2,
                             committed_fraction=rng.choice([0.0, 0.0, 0.25, 0.5, 0.75]),
                             shared_jobs=rng.choice([0, 1])) for j in range(rng.choice([0, 1, 2, 4, 8]))]
            nodes.append(make_node(f"n{i}", gpus, cpus=rng.choice([4, 32]), cpus_committed=rng.choice([0, 2, 3.5]),
                                   mem="256G", mem_committed=rng.choice([0, 200]) * G, schedulable=rng.random() < 0.9))
        snap = ClusterSnapshot(nodes=nodes)
        reqs = [RankRequest(0, 1.0, GpuMode.EXCLUSIVE, None, None, None, 2.0, G, "cpu"),
                RankRequest(1, rng.choice([0.25, 0.5]), GpuMode.SHARED, None, rng.choice([None, "a100"]), None,
                            1.0, G, "frac"),
                RankRequest(rng.choice([1, 2, 4]), 1.0, GpuMode.EXCLUSIVE, None, rng.choice([None, "rtx4090"]), None,
                            rng.choice([0.0, 8.0]), 4 * G, "whole")]
        compiled = Scheduler(snap)
        assert compiled.frag.jit_form is not None
        reference = numpy_forms(lambda: Scheduler(snap))
        assert reference.frag.jit_form is None
        for req in reqs:
            a, b = compiled.scores(req), reference.scores(req)
            assert np.array_equal(a.score, b.score, equal_nan=True), req
            assert np.array_equal(a.gpu, b.gpu), req
            assert np.allclose(a.after, b.after, rtol=1e-12, atol=1e-12, equal_nan=True), req
            checked += int(np.isfinite(a.score).sum())
    assert checked > 100


def test_nodes_are_one_state_only_when_every_input_of_their_score_is_equal():
    """score_rows scores one node of each state and copies its results to the others
    (fragjit._same_state): a node that differs in any one thing scoring reads is its own."""
    from mtgpu.sched import fragjit

    f = Fleet(ClusterSnapshot(nodes=[make_node(f"n{i}", [make_gpu(j, "a100", "80G") for j in range(2)])
                                     for i in range(2)]))
    def arrays():
        return dict(schedulable=f.schedulable.copy(), cpus_free=f.cpus_free.copy(), mem_usable=f.mem_usable.copy(),
                    left=f.left.copy(), gmodel=f.gmodel.copy(), idle=f.idle.copy(), open_=f.open.copy(),
                    shared_free=f.shared_free.copy(), vram_total=f.vram_total.copy())

    def same(a):
        return fragjit._same_state(0, 1, a["schedulable"], a["cpus_free"], a["mem_usable"], a["left"], a["gmodel"],
                                   a["idle"], a["open_"], a["shared_free"], a["vram_total"])

    assert same(arrays())
    changes = {"schedulable": False, "cpus_free": 3.5, "mem_usable": 1}
    for name, new in changes.items():
        a = arrays()
        a[name][1] = new
        assert not same(a), name
    for name, new in {"left": 0.75, "gmodel": 1, "idle": False, "open_": False, "shared_free": 5,
                      "vram_total": 1}.items():
        a = arrays()
        a[name][1, 1] = new
        assert not same(a), name


def test_a_fleet_of_look_alike_nodes_is_scored_as_node_by_node(numpy_forms):
    """Many nodes alike and a few that differ from them in one thing each: the compiled
    scores (one per state) are the numpy path's (every node on its own)."""
    from mtgpu.sched.engine import Scheduler

    def node(i, **kw):
        gpus = [make_gpu(j, "a100", "80G", **(kw.pop("gpu", {}) if j == 1 else {})) for j in range(2)]
        return make_node(f"n{i}", gpus, cpus=16, mem="256G", **kw)
    odd = [dict(cpus_committed=15.5), dict(mem_committed=255 * G), dict(schedulable=False, reason="drained"),
           dict(gpu=dict(committed_fraction=0.5, shared_jobs=1)), dict(gpu=dict(exclusive=True)),
           dict(gpu=dict(oversubscribed_jobs=1)), dict(gpu=dict(committed_vram="70G", shared_jobs=1))]
    nodes = [node(i) for i in range(60)] + [node(60 + i, **kw) for i, kw in enumerate(odd)]
    snap = ClusterSnapshot(nodes=nodes)
    reqs = [RankRequest(0, 1.0, GpuMode.EXCLUSIVE, None, None, None, 1.0, G, "cpu"),
            RankRequest(1, 0.25, GpuMode.SHARED, None, None, None, 1.0, G, "frac"),
            RankRequest(2, 1.0, GpuMode.EXCLUSIVE, None, None, None, 1.0, G, "whole")]
    compiled = Scheduler(snap)
    assert compiled.frag.jit_form is not None
    reference = numpy_forms(lambda: Scheduler(snap))
    for req in reqs:
        a, b = compiled.scores(req), reference.scores(req)
        assert np.array_equal(a.score, b.score), req
        assert np.array_equal(a.gpu, b.gpu), req
        assert len(set(a.score[60:].tolist())) > 1  # the odd nodes did score otherwise


def test_the_one_call_placement_picks_the_node_the_general_path_picks(monkeypatch):
    """engine._place_fast (fragjit.score_and_pick: scores, best, ties, a CPU-only job's least
    GPU share left, the job id's pick) places every job where _place_ranks does: the same
    jobs on two schedulers, one of them with the fast path off."""
    from mtgpu.sched import engine
    from mtgpu.sched.engine import Scheduler

    monkeypatch.setattr(frag, "JIT_MIN_NODES", 0)
    rng = random.Random(2804)
    nodes = []
    for i in range(40):  # alike nodes, so that CPU-only jobs tie and the least GPU share left decides
        model, vram = rng.choice(MODELS[:2])
        nodes.append(make_node(f"n{i}", [make_gpu(j, model, vram) for j in range(rng.choice([1, 2, 4]))],
                               cpus=64, mem="512G"))
    snap = ClusterSnapshot(nodes=nodes)
    specs = []
    for _ in range(600):
        kind = rng.choice(["cpu", "cpu", "frac", "whole", "model"])
        if kind == "cpu":
            specs.append(JobSpec(cpus=rng.choice([1, 2]), mem_bytes=G))
        elif kind == "frac":
            specs.append(JobSpec(gpus=(GpuAlternative(rng.choice([0.25, 0.5]), None, None),), cpus=1, mem_bytes=G,
                                 gpu_mode=GpuMode.SHARED))
        else:
            n = rng.choice([1, 2])
            specs.append(JobSpec(gpus=(GpuAlternative(float(n), "a100" if kind == "model" else None, None),),
                                 cpus=1, mem_bytes=G))
    fast, general = Scheduler(snap), Scheduler(snap)
    assert fast.frag.jit_form is not None
    calls = []
    real = Scheduler._place_fast

    def counted(self, *a):
        if self is not fast:
            return engine._UNKNOWN
        placed = real(self, *a)
        if placed is not engine._UNKNOWN:
            calls.append(1)
        return placed
    monkeypatch.setattr(Scheduler, "_place_fast", counted)

    def where(placed):
        return None if placed is None else [(a.node, [(g.index, g.fraction) for g in a.gpus]) for a in placed]
    placed_any = 0
    for i, spec in enumerate(specs):
        job_id = i + 1 + (rng.choice([0, 1 << 40]))  # ids past 32 bits: the pick's arithmetic must not wrap
        a, b = where(fast.place(spec, job_id)), where(general.place(spec, job_id))
        assert a == b, (i, spec, a, b)
        placed_any += a is not None
    assert placed_any > 200 and len(calls) > 300  # it placed, and mostly by the fast path
    # and its commit (only the changed GPU copied back, or none for a CPU-only job) left the
    # arrays and V as the general path's full refresh did
    for name in ("idle", "open", "left", "left_sum", "shared_free", "meas_free", "load", "cpus_free", "mem_usable",
                 "schedulable"):
        assert np.array_equal(getattr(fast.fleet, name), getattr(general.fleet, name)), name
    assert np.array_equal(fast.value, general.value)


def test_under_holds_the_one_call_placement_decides_what_the_general_path_decides(monkeypatch):
    """A whole pass (engine.run) whose blocked jobs hold capacity for later: jobs the holds
    bind are placed by the one-call path too (the nodes the holds refuse left out, a best
    node to check handed to the general path), and the plan is the general path's, every
    placement, pending reason and rejection."""
    from mtgpu.sched import engine
    from mtgpu.sched.engine import Scheduler

    monkeypatch.setattr(frag, "JIT_MIN_NODES", 0)
    rng = random.Random(2805)
    nodes = []
    for i in range(30):
        model, vram = rng.choice(MODELS[:3])
        nodes.append(make_node(f"n{i}", [make_gpu(j, model, vram) for j in range(rng.choice([1, 2, 4, 8]))],
                               cpus=rng.choice([16, 64]), mem=rng.choice(["128G", "512G"])))
    snap = ClusterSnapshot(nodes=nodes)
    queue = []
    for job_id in range(1, 501):
        common = dict(cpus=float(rng.choice([1, 2, 8])), mem_bytes=rng.choice([1, 8, 32]) * G,
                      time_limit_s=rng.choice([None, 3600.0, 86400.0]), priority=rng.choice([0, 0, 5]))
        x = rng.random()
        if x < 0.3:
            spec = JobSpec(gpus=(GpuAlternative(1.0, rng.choice([None, "a100", "t4"]), None),), **common)
        elif x < 0.45:  # big ones: blocked once the fleet fills, and then held for
            spec = JobSpec(gpus=(GpuAlternative(float(rng.choice([4, 8])), None, None),), **common)
        elif x < 0.7:
            spec = JobSpec(gpus=(GpuAlternative(rng.choice([0.25, 0.5]), None, None),), gpu_mode=GpuMode.SHARED,
                           **common)
        else:
            spec = JobSpec(**common)
        queue.append(PendingJob(job_id, f"t{rng.randrange(20)}", spec, submitted_at=rng.uniform(0, 1000)))

    real = Scheduler._place_fast
    calls = {"fast": 0, "held": 0}
    general_only = [False]

    def counted(self, spec, job_id, holds):
        if general_only[0]:
            return engine._UNKNOWN
        placed = real(self, spec, job_id, holds)
        if placed is not engine._UNKNOWN:
            calls["fast"] += 1
            calls["held"] += holds is not None
        return placed
    monkeypatch.setattr(Scheduler, "_place_fast", counted)

    fast = Scheduler(snap).run(queue, now=2000.0)
    general_only[0] = True
    general = Scheduler(snap).run(queue, now=2000.0)
    assert fast.placements == general.placements
    assert fast.pending == general.pending and fast.rejected == general.rejected
    assert len(fast.placements) > 100 and len(fast.pending) > 50
    assert calls["held"] > 50  # jobs bound by holds went the one-call way


def test_a_best_node_whose_verdict_only_its_allocation_tells_goes_to_the_general_path(monkeypatch):
    """Two alike nodes; a blocked two-GPU job holds node n0 from t=100 (a reservation). A
    one-GPU job running past then ties on both nodes, and its job id picks n0: the one-call
    path must not place it there (taking a GPU of n0 would delay the reservation) but hand
    it to the general path, which asks the holds and places it on n1."""
    from mtgpu.sched import engine
    from mtgpu.sched.engine import Scheduler
    from mtgpu.sched.holds import Holds, Reservation

    monkeypatch.setattr(frag, "JIT_MIN_NODES", 0)
    snap = ClusterSnapshot(nodes=[make_node(f"n{i}", [make_gpu(j, "a100", "80G") for j in range(2)], cpus=16,
                                            mem="128G") for i in range(2)])
    one = JobSpec(gpus=(GpuAlternative(1.0, None, None),), cpus=1, mem_bytes=G, time_limit_s=3600.0)
    two = JobSpec(gpus=(GpuAlternative(2.0, None, None),), cpus=1, mem_bytes=G)
    results = []
    real = Scheduler._place_fast
    for general_only in (False, True):
        sched = Scheduler(snap)
        (req_one,), (req_two,) = sched.requests(one), sched.requests(two)
        sched.scores(req_one)  # its scores exist: the one-call path applies
        holds = Holds(sched.fleet)
        holds.reserve(99, Reservation(100.0, req_two, {0: sched.fleet.states[0].copy()}), [req_two])
        binding = holds.for_job(3600.0)
        fast_answers = []

        def spy(self, spec, job_id, h, general_only=general_only):
            placed = engine._UNKNOWN if general_only else real(self, spec, job_id, h)
            fast_answers.append(placed)
            return placed
        monkeypatch.setattr(Scheduler, "_place_fast", spy)
        placed = sched.place(one, 2, binding)  # an even id: the first of two tied nodes, n0
        results.append([(a.node, [g.index for g in a.gpus]) for a in placed])
        assert fast_answers == [engine._UNKNOWN]  # neither placed it by the one-call path
    assert results[0] == results[1] == [("n1", [0])]
    # and with no holds, the same job id does pick n0 in one call
    monkeypatch.setattr(Scheduler, "_place_fast", real)
    sched = Scheduler(snap)
    sched.scores(sched.requests(one)[0])
    assert [a.node for a in sched.place(one, 2, None)] == ["n0"]


def test_fits_on_counts_as_numpy_does():
    """fragjit.fits_on (engine.fits_now's count, stopping early) against numpy's count of
    scores above -inf, with and without pins, NaN and -inf among the scores."""
    jit = frag.jit()
    rng = np.random.default_rng(2806)
    none = np.zeros(0, dtype=bool)
    for _ in range(300):
        n = int(rng.integers(1, 40))
        score = rng.choice([-np.inf, np.nan, -2.0, 0.0, 3.0], size=n, p=[0.6, 0.05, 0.15, 0.1, 0.1])
        pin = rng.random(n) < 0.5
        for enough in (1, 2, 4):
            assert jit.fits_on(score, -np.inf, enough, none) == (int((score > -np.inf).sum()) >= enough)
            assert jit.fits_on(score, -np.inf, enough, pin) == \
                (int((np.where(pin, score, -np.inf) > -np.inf).sum()) >= enough)


def test_score_and_pick_picks_as_the_general_path_on_any_scores(monkeypatch):
    """score_and_pick's pick (no rows to rescore) on random scores: -inf, NaN, ties, refused
    nodes and nodes to check, against the rule written out here as _place_ranks and _top
    apply it: -1 fits nowhere; a NaN among the nodes not refused or a best node to check:
    the general path (-2, -3); else the ties' (job id x hash mod n)-th, a CPU-only job's
    ties first narrowed to the least GPU share left."""
    from mtgpu.sched.engine import _HASH, TIE_EPS, Scheduler

    monkeypatch.setattr(frag, "JIT_MIN_NODES", 0)
    snap = ClusterSnapshot(nodes=[make_node(f"n{i}", [make_gpu(0, "a100", "80G")], cpus=8, mem="64G")
                                  for i in range(12)])
    rng = np.random.default_rng(2807)
    for kind_spec in (JobSpec(cpus=1, mem_bytes=G), JobSpec(gpus=(GpuAlternative(1.0, None, None),), cpus=1)):
        sched = Scheduler(snap)
        req = sched.requests(kind_spec)[0]
        sched.scores(req)
        _, kind, s, args = sched._fast_entry(kind_spec, sched.spec_key(kind_spec))
        left_sum = sched.fleet.left_sum
        for trial in range(400):
            # (0.4e-9 and 1.2e-9: within TIE_EPS of 0.0 or of each other, so a better score keeps some ties)
            s.score[:] = rng.choice([-np.inf, np.nan, -3.0, -1.0, 0.0, 0.4e-9, 1.2e-9], size=12,
                                    p=[0.4, 0.03, 0.2, 0.15, 0.1, 0.06, 0.06])
            left_sum[:] = rng.choice([0.0, 0.5, 1.0], size=12)
            refused = rng.random(12) < 0.3 if trial % 2 else np.zeros(0, dtype=bool)
            checks = rng.random(12) < 0.1 if trial % 3 == 0 else np.zeros(0, dtype=bool)
            job_id = int(rng.integers(1, 1 << 40))
            got = frag.jit().score_and_pick(kind, sched.fleet.log_rows, 0, 0, *args, job_id, _HASH, TIE_EPS,
                                            refused, checks)
            ok = [i for i in range(12) if not (len(refused) and refused[i])]
            vals = s.score[ok]
            if np.isnan(vals).any():  # the general path says what (-3 where a node to check came first)
                assert got in (-2, -3)
                continue
            if len(ok) == 0 or vals.max() == -np.inf:
                assert got == -1
                continue
            ties = [i for i in ok if s.score[i] >= vals.max() - TIE_EPS]
            if len(checks) and any(checks[i] for i in ties):
                assert got == -3
                continue
            if len(ties) > 1 and kind == 0:
                least = min(left_sum[i] for i in ties)
                ties = [i for i in ties if left_sum[i] <= least + TIE_EPS]
            assert got == ties[(job_id * _HASH) % len(ties)], (trial, got, ties)

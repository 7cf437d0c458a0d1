"""FragModel's two hot functions (frag.py: `value`, `value_one_gpu`) as compiled loops.

The numpy forms in frag.py run 60-70 operations on small arrays per call, and a placement
rescoring a few dozen nodes spends its time in numpy's per-operation overhead, not in the
arithmetic (bench/README.md, issue 28). These are the same formulas, one pass over each
node's GPUs and the model's groups, compiled by numba (`cache=True`: compiled once per
installation, then loaded). They agree with the numpy forms to rounding (the order of a
few additions differs; tests/unit/sched/test_fragjit.py), and the engine's scores are
whole SCORE_STEPs, so a decision does not turn on that. Without numba, and on fleets of
fewer than frag.JIT_MIN_NODES nodes, frag.py uses its numpy forms.

Pure: no I/O, no clock (numba's own cache files aside).
"""

from __future__ import annotations

import numpy as np
from numba import njit


POW_TABLE = 4096  # jobs ** -softness for 0 <= jobs < this, looked up (a pow call is most of a row's time)


@njit(cache=True, nogil=True)
def pow_table(softness):
    """t[j] = j ** -softness (t[0] unused), by the same pow the weights would call."""
    t = np.empty(POW_TABLE)
    t[0] = 0.0
    for j in range(1, POW_TABLE):
        jobs = np.float64(j)
        t[j] = jobs ** (-softness)
    return t


@njit(cache=True, nogil=True, inline="always")
def _row_weights(cpu_e, mem, free, g_need, s_start, s_cpu, s_mem, s_p, s_ap, softness, powtab, need, w):
    """w[k] for each group k with need[k]: the popularity of its kinds that a node with
    `cpu_e` CPUs (plus EPS), `mem` memory and `free` GPU share can host
    (frag.FragModel._weights, one row; the kinds are sorted by group, from s_start[k])."""
    cs = cpu_e ** softness if softness > 0 else 1.0
    t_n = s_p.shape[0]
    k_n = g_need.shape[0]
    for k in range(k_n):
        if not need[k]:
            continue
        y = 0.0
        if softness > 0:
            jobs = np.floor(free / g_need[k] + 1e-9)
            if jobs < 1.0:
                jobs = 1.0
            # jobs ** -softness, from the table where it holds it (pow_table: the same pow)
            y = (powtab[np.int64(jobs)] if jobs < powtab.shape[0] else jobs ** (-softness)) * cs
        end = s_start[k + 1] if k + 1 < k_n else t_n
        acc = 0.0
        for t in range(s_start[k], end):
            hp = s_p[t] if (cpu_e >= s_cpu[t] and mem >= s_mem[t]) else 0.0
            if softness > 0:
                h = y * s_ap[t]
                if hp < h:
                    h = hp
            else:
                h = hp
            acc += h
        w[k] = acc


@njit(cache=True, nogil=True, inline="always")
def _group_shares(lrow, grow, a_ord, g_d, eps, u, c):
    """Per group k: u[k] the share left on the node's GPUs that can take one of its jobs, c[k]
    how many such GPUs; returns the node's share left in all."""
    u[:] = 0.0
    c[:] = 0
    free = 0.0
    for g in range(lrow.shape[0]):
        lg = lrow[g]
        free += lg
        m = grow[g]
        for i in range(a_ord.shape[1]):  # the groups a GPU of model m serves, by demand (frag.allowed_order)
            k = a_ord[m, i]
            if k < 0 or lg + eps < g_d[k]:
                break
            u[k] += lg
            c[k] += 1
    return free


@njit(cache=True, nogil=True, inline="always")
def _value_row(lrow, grow, cpu, mem, allowed, a_ord, g_d, g_n, g_need, s_start, s_cpu, s_mem, s_p, s_ap, softness, powtab, eps,
               u, c, w, need):
    """V of one node state: lrow (G,) shares left, grow (G,) models (u, c, w, need: scratch)."""
    k_n = g_d.shape[0]
    free = _group_shares(lrow, grow, a_ord, g_d, eps, u, c)
    for k in range(k_n):
        need[k] = c[k] >= g_n[k] and u[k] != 0.0
    _row_weights(cpu + eps, mem, free, g_need, s_start, s_cpu, s_mem, s_p, s_ap, softness, powtab, need, w)
    v = 0.0
    for k in range(k_n):
        if need[k]:
            v += u[k] * w[k]
    return v


@njit(cache=True, nogil=True, inline="always")
def _one_gpu_row(lrow, grow, shrow, crow, cpu, mem, allowed, a_ord, g_d, g_n, g_need, s_start, s_cpu, s_mem, s_p, s_ap,
                 softness, powtab, eps, u, c, w, need, un, scored, out):
    """out[j]: V of one node after taking shrow[j] from its GPU j, for each candidate j
    (crow); -inf elsewhere and for a candidate alike the one before it."""
    g_count = lrow.shape[0]
    k_n = g_d.shape[0]
    free = _group_shares(lrow, grow, a_ord, g_d, eps, u, c)
    most = -np.inf
    for g in range(g_count):
        if shrow[g] > most:
            most = shrow[g]
    need[:] = False
    for j in range(g_count):
        out[j] = -np.inf
        scored[j] = False
        if not crow[j]:
            continue
        if j > 0 and crow[j - 1] and lrow[j] == lrow[j - 1] and grow[j] == grow[j - 1] and shrow[j] == shrow[j - 1]:
            continue  # alike the GPU before it: the same value (frag.py says why that is safe)
        scored[j] = True
        lj = lrow[j]
        aj = lj - shrow[j]
        m = grow[j]
        for k in range(k_n):
            x = u[k]
            n = c[k]
            if allowed[m, k]:
                if lj + eps >= g_d[k]:
                    x -= lj
                    n -= 1
                if aj + eps >= g_d[k]:
                    x += aj
                    n += 1
            if n < g_n[k]:
                x = 0.0
            un[j, k] = x
            if x != 0.0:
                need[k] = True
    _row_weights(cpu + eps, mem, free - most, g_need, s_start, s_cpu, s_mem, s_p, s_ap, softness, powtab, need, w)
    for j in range(g_count):
        if scored[j]:
            v = 0.0
            for k in range(k_n):
                if need[k]:
                    v += un[j, k] * w[k]
            out[j] = v


@njit(cache=True, nogil=True)
def value(left, gmodel, cpu, mem, allowed, a_ord, g_d, g_n, g_need, s_start, s_cpu, s_mem, s_p, s_ap, softness, powtab, eps):
    """V for B node states (frag.FragModel.value)."""
    k_n = g_d.shape[0]
    out = np.zeros(left.shape[0])
    u, c, w, need = np.empty(k_n), np.empty(k_n, np.int64), np.empty(k_n), np.empty(k_n, np.bool_)
    for b in range(left.shape[0]):
        out[b] = _value_row(left[b], gmodel[b], cpu[b], mem[b], allowed, a_ord, g_d, g_n, g_need, s_start, s_cpu, s_mem,
                            s_p, s_ap, softness, powtab, eps, u, c, w, need)
    return out


@njit(cache=True, nogil=True)
def value_one_gpu(left, gmodel, share, cand, cpu, mem, allowed, a_ord, g_d, g_n, g_need, s_start, s_cpu, s_mem, s_p,
                  s_ap, softness, powtab, eps):
    """V after taking share[b, j] from GPU j of node b, for every candidate j; -inf
    elsewhere, and for a candidate alike the one before it (frag.FragModel.value_one_gpu)."""
    b_n, g_count = left.shape
    k_n = g_d.shape[0]
    out = np.empty((b_n, g_count))
    u, c, w, need = np.empty(k_n), np.empty(k_n, np.int64), np.empty(k_n), np.empty(k_n, np.bool_)
    un = np.empty((g_count, k_n))
    scored = np.empty(g_count, np.bool_)
    for b in range(b_n):
        _one_gpu_row(left[b], gmodel[b], share[b], cand[b], cpu[b], mem[b], allowed, a_ord, g_d, g_n, g_need, s_start,
                     s_cpu, s_mem, s_p, s_ap, softness, powtab, eps, u, c, w, need, un, scored, out[b])
    return out


@njit(cache=True, nogil=True, inline="always")
def _step(gain, step):
    if step <= 0:
        return gain
    return np.floor(gain / step + 1e-6)


@njit(cache=True, nogil=True, inline="always")
def _fits(kind, r, ask, fleet, eps, cand):
    """Does one rank of the request fit on node r now? cand[g]: may it use GPU g (kinds 1, 2)."""
    count, fraction, req_cpus, req_mem = ask
    schedulable, cpus_free, mem_usable, match, idle, open_, shared_free, vram_total, left, gmodel, uniform, value_now = fleet
    fits = schedulable[r]
    if req_cpus > 0 and not cpus_free[r] + eps >= req_cpus:
        fits = False
    if req_mem > 0 and not mem_usable[r] >= req_mem:
        fits = False
    n_ok = 0
    for g in range(left.shape[1]):
        ok = False
        if kind == 1:
            ok = (match[r, g] and open_[r, g] and shared_free[r, g] >= np.int64(fraction * vram_total[r, g])
                  and left[r, g] + eps >= fraction)
        elif kind == 2:
            ok = match[r, g] and idle[r, g]
        cand[g] = ok
        if ok:
            n_ok += 1
    if kind != 0 and n_ok < count:
        fits = False
    return fits


@njit(cache=True, nogil=True, inline="always")
def _score_row(kind, r, ask, fleet, out, model, scratch):
    """One fitting node's score, GPU and V after for score_rows (`_fits` true, its cand[] in
    scratch). The inputs come in tuples (the request, the fleet's arrays, the outputs, the
    model, scratch) and it is inlined: a call of more than 30 arguments is a star call in
    Python's bytecode, which numba can neither inline nor make cheaply (it cost about 0.3 us
    a row, more than a row's fit test)."""
    count, fraction, req_cpus, req_mem = ask
    schedulable, cpus_free, mem_usable, match, idle, open_, shared_free, vram_total, left, gmodel, uniform, value_now = fleet
    score, gpu, after, step, neg = out
    allowed, a_ord, g_d, g_n, g_need, s_start, s_cpu, s_mem, s_p, s_ap, softness, powtab, eps = model
    u, c, w, need, un, scored, one, shares, cand, a = scratch
    g_count = left.shape[1]
    gpu[r] = -1
    after[r] = np.nan
    cpu = cpus_free[r] - req_cpus
    mem = np.float64(mem_usable[r]) - req_mem
    old = value_now[r]
    if kind == 0:
        v = _value_row(left[r], gmodel[r], cpu, mem, allowed, a_ord, g_d, g_n, g_need, s_start, s_cpu, s_mem, s_p, s_ap,
                       softness, powtab, eps, u, c, w, need)
        after[r] = v
        score[r] = _step(v - old, step)
    elif kind == 1:
        _one_gpu_row(left[r], gmodel[r], shares, cand, cpu, mem, allowed, a_ord, g_d, g_n, g_need, s_start, s_cpu, s_mem,
                     s_p, s_ap, softness, powtab, eps, u, c, w, need, un, scored, a)
        best = 0
        bv = a[0] + fraction
        for g in range(1, g_count):
            v = a[g] + fraction
            if v > bv:
                best, bv = g, v
        gpu[r] = best
        after[r] = a[best]
        score[r] = _step(bv - old, step)
    else:
        taken_sum = 0.0
        taken_n = 0
        for g in range(g_count):
            one[g] = left[r, g]
            if cand[g] and taken_n < count:
                taken_n += 1
                taken_sum += left[r, g]
                one[g] = left[r, g] - left[r, g]
        v = _value_row(one, gmodel[r], cpu, mem, allowed, a_ord, g_d, g_n, g_need, s_start, s_cpu, s_mem, s_p, s_ap,
                       softness, powtab, eps, u, c, w, need)
        if uniform[r]:
            after[r] = v
        score[r] = _step(v - old + taken_sum, step)


@njit(cache=True, nogil=True, inline="always")
def _state_hash(r, schedulable, cpus_free, mem_usable, left, gmodel, idle, open_, shared_free):
    """A hash of what _score_row reads of node r (_same_state tells for sure), its low bits
    mixed from all of them (the inputs' own low bits are mostly 0: bytes in GiB, halves)."""
    h = np.uint64(mem_usable[r]) ^ (np.uint64(np.int64(cpus_free[r] * 4096.0)) << np.uint64(40))
    if schedulable[r]:
        h ^= np.uint64(0x5bd1e995)
    for g in range(left.shape[1]):
        x = (np.uint64(np.int64(left[r, g] * 1048576.0)) + (np.uint64(gmodel[r, g]) << np.uint64(24))
             + np.uint64(shared_free[r, g]) + np.uint64(idle[r, g]) * np.uint64(7)
             + np.uint64(open_[r, g]) * np.uint64(13))
        h = (h ^ x) * np.uint64(1099511628211)
    h ^= h >> np.uint64(30)  # splitmix64's finalizer
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(27)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    return np.int64(h & np.uint64(0x7FFFFFFFFFFFFFFF))


@njit(cache=True, nogil=True, inline="always")
def _same_state(q, r, schedulable, cpus_free, mem_usable, left, gmodel, idle, open_, shared_free, vram_total):
    """Are nodes q and r in one state: equal in all _score_row reads (match and uniform follow
    from gmodel), but V now, which is V of that state (to rounding: computed after another
    placement, or by another form; engine._compute's dedupe by state id copies it alike)?"""
    if schedulable[q] != schedulable[r] or cpus_free[q] != cpus_free[r] or mem_usable[q] != mem_usable[r]:
        return False
    for g in range(left.shape[1]):
        if (left[q, g] != left[r, g] or gmodel[q, g] != gmodel[r, g] or idle[q, g] != idle[r, g]
                or open_[q, g] != open_[r, g] or shared_free[q, g] != shared_free[r, g]
                or vram_total[q, g] != vram_total[r, g]):
            return False
    return True


@njit(cache=True, nogil=True)
def score_rows(kind, rows, log_from, log_to, stamp, count, fraction, req_cpus, req_mem, schedulable, cpus_free,
               mem_usable, match, idle, open_, shared_free, vram_total, left, gmodel, uniform, value_now, score, gpu,
               after, step, neg, allowed, a_ord, g_d, g_n, g_need, s_start, s_cpu, s_mem, s_p, s_ap, softness, powtab,
               eps):
    """engine.Scheduler._compute_rows in one loop, for the requests most jobs make (no
    vram=): kind 0 CPU only, 1 one GPU's fraction (< 1) shared, 2 whole GPUs exclusive.
    Writes score, gpu and after at `rows`, as the numpy path does. With log_from <
    log_to, `rows` is Fleet.log_rows instead: the rows logged since log_from, each once
    (at its last entry, by `stamp`), skipping those this request already did not fit
    (engine.Scheduler.scores: within a pass a node only loses capacity).
    Nodes in the same state (all the empty ones of a model, at first) are scored once:
    the others copy the first one's results (_same_state: exactly equal inputs)."""
    _rescore(kind, rows, log_from, log_to, stamp, (count, fraction, req_cpus, req_mem),
             (schedulable, cpus_free, mem_usable, match, idle, open_, shared_free, vram_total, left, gmodel, uniform,
              value_now), (score, gpu, after, step, neg),
             (allowed, a_ord, g_d, g_n, g_need, s_start, s_cpu, s_mem, s_p, s_ap, softness, powtab, eps))


@njit(cache=True, nogil=True)
def _rescore(kind, rows, log_from, log_to, stamp, ask, fleet, out, model):
    """score_rows with its inputs in tuples (as _score_row; score_and_pick calls it too: one
    call per placement, compiled once). A row that does not fit is not hashed: only fitting
    rows are looked up among the states."""
    schedulable, cpus_free, mem_usable, match, idle, open_, shared_free, vram_total, left, gmodel, uniform, value_now = fleet
    n = left.shape[0]
    g_count = left.shape[1]
    score, gpu, after, step, neg = out
    allowed, a_ord, g_d, g_n, g_need, s_start, s_cpu, s_mem, s_p, s_ap, softness, powtab, eps = model
    k_n = g_d.shape[0]
    # the rows to score
    if log_from >= log_to:
        todo = rows
    elif log_to - log_from > n:  # a long stretch of the log: one pass over the stamps
        todo = np.empty(n, np.int64)
        m = 0
        for r in range(n):
            if stamp[r] >= log_from and score[r] > neg:
                todo[m] = r
                m += 1
        todo = todo[:m]
    else:
        todo = np.empty(log_to - log_from, np.int64)
        m = 0
        for i in range(log_from, log_to):
            r = rows[i]
            if stamp[r] == i and score[r] > neg:
                todo[m] = r
                m += 1
        todo = todo[:m]
    fraction = ask[1]
    u, c, w, need = np.empty(k_n), np.empty(k_n, np.int64), np.empty(k_n), np.empty(k_n, np.bool_)
    un = np.empty((g_count, k_n))
    scored = np.empty(g_count, np.bool_)
    one = np.empty(g_count)
    shares = np.full(g_count, fraction)
    cand = np.empty(g_count, np.bool_)
    a = np.empty(g_count)
    scratch = (u, c, w, need, un, scored, one, shares, cand, a)
    size = 4
    while size < 2 * todo.shape[0]:
        size *= 2
    table = np.full(size, -1, np.int64)  # open addressing: a scored row of each state seen
    mask = np.int64(size - 1)
    for r in todo:
        if not _fits(kind, r, ask, fleet, eps, cand):
            score[r] = neg
            gpu[r] = -1
            after[r] = np.nan
            continue
        slot = _state_hash(r, schedulable, cpus_free, mem_usable, left, gmodel, idle, open_, shared_free) & mask
        done = False
        while table[slot] >= 0:
            q = table[slot]
            if _same_state(q, r, schedulable, cpus_free, mem_usable, left, gmodel, idle, open_, shared_free,
                           vram_total):
                score[r] = score[q]
                gpu[r] = gpu[q]
                after[r] = after[q]
                done = True
                break
            slot = (slot + 1) & mask
        if done:
            continue
        _score_row(kind, r, ask, fleet, out, model, scratch)
        table[slot] = r


@njit(cache=True, nogil=True)
def top(cand, tie_eps):
    """(cand.max(), the indexes where cand >= that - tie_eps), as engine._top computed them
    (a NaN anywhere: NaN and no index, as numpy's max and comparison give)."""
    best = -np.inf
    for x in cand:
        if x != x:
            return np.nan, np.empty(0, np.int64)
        if x > best:
            best = x
    n = 0
    for x in cand:
        if x >= best - tie_eps:
            n += 1
    ties = np.empty(n, np.int64)
    n = 0
    for i in range(cand.shape[0]):
        if cand[i] >= best - tie_eps:
            ties[n] = i
            n += 1
    return best, ties


@njit(cache=True, nogil=True)
def score_and_pick(kind, rows, log_from, log_to, stamp, count, fraction, req_cpus, req_mem, schedulable, cpus_free,
                   mem_usable, match, idle, open_, shared_free, vram_total, left, gmodel, uniform, value_now, score, gpu,
                   after, step, neg, allowed, a_ord, g_d, g_n, g_need, s_start, s_cpu, s_mem, s_p, s_ap, softness,
                   powtab, eps, left_sum, job_id, tie_hash, tie_eps, refused, checks):
    """score_rows over the log since log_from, then the node engine._place_ranks picks for a
    one-rank job with no pins (engine.Scheduler._place_fast), in one call: the best score,
    the nodes within tie_eps of it (a CPU-only job: of those, the ones with the least GPU
    share left), and among them the (job_id x tie_hash mod n)-th. The holds that bind the
    job, where it has any (holds.JobHolds.refusal): `refused` nodes count as not fitting,
    and where a node among the best is one of `checks` (only the allocation there tells)
    the caller decides. An empty array: none such. -1: it fits nowhere; -2: a score is
    NaN (the caller takes the general path, which says so); -3: a best node is to check."""
    if log_from < log_to:
        _rescore(kind, rows, log_from, log_to, stamp, (count, fraction, req_cpus, req_mem),
                 (schedulable, cpus_free, mem_usable, match, idle, open_, shared_free, vram_total, left, gmodel,
                  uniform, value_now), (score, gpu, after, step, neg),
                 (allowed, a_ord, g_d, g_n, g_need, s_start, s_cpu, s_mem, s_p, s_ap, softness, powtab, eps))
    masked = refused.shape[0] > 0
    n = score.shape[0]
    # One pass: the best so far and its ties (within tie_eps) in row order; a better score
    # drops the ties it leaves behind. A NaN anywhere (not refused): -2, as numpy's max would
    # make it; a row at `neg` never fits.
    ties = np.empty(n, np.int64)
    m = 0
    best = neg
    low = neg
    for i in range(n):
        x = score[i]
        if x < low or x == neg:  # (NaN is neither: it is looked at below)
            continue
        if masked and refused[i]:
            continue
        if x != x:
            return -2
        if x > best:
            new_low = x - tie_eps
            if new_low > best:
                m = 0
            else:
                k = 0
                for j in range(m):
                    if score[ties[j]] >= new_low:
                        ties[k] = ties[j]
                        k += 1
                m = k
            best = x
            low = new_low
        ties[m] = i
        m += 1
    if m == 0:
        return -1
    if checks.shape[0] > 0:
        for j in range(m):
            if checks[ties[j]]:
                return -3
    if m > 1 and kind == 0:  # a CPU-only job: of those, the ones with the least GPU share left
        least = np.inf
        for j in range(m):
            if left_sum[ties[j]] < least:
                least = left_sum[ties[j]]
        k = 0
        for j in range(m):
            if left_sum[ties[j]] <= least + tie_eps:
                ties[k] = ties[j]
                k += 1
        m = k
    if m == 1:
        return ties[0]
    return ties[((job_id % m) * (tie_hash % m)) % m]


@njit(cache=True, nogil=True)
def fits_on(score, neg, enough, allowed):
    """Do at least `enough` nodes have a score above `neg` (where `allowed`, when not empty)?
    (engine.Scheduler.fits_now: it stops at the enough-th.)"""
    pinned = allowed.shape[0] > 0
    n = 0
    for i in range(score.shape[0]):
        if score[i] > neg and not (pinned and not allowed[i]):
            n += 1
            if n >= enough:
                return True
    return False


def warm() -> None:
    """Compile (or load) every form a pass uses, with the types it passes: a tiny fleet of
    frag.JIT_MIN_NODES nodes places a job of each kind. scripts/install.sh runs it, so a
    scheduler's first pass on a big fleet does not wait for the compiler."""
    from mtgpu.model.cluster import ClusterSnapshot, GpuView, NodeView
    from mtgpu.model.job import GpuAlternative, GpuMode, JobSpec

    from .engine import Scheduler
    from .frag import JIT_MIN_NODES

    gpus = [GpuView(index=i, vendor="nvidia", model="rtx4090", vram_total_bytes=24 << 30, vram_used_measured_bytes=0,
                    utilization_pct=0.0, committed_fraction=0.0, committed_vram_bytes=0, exclusive=False, shared_jobs=0,
                    oversubscribed_jobs=0) for i in range(2)]
    nodes = [NodeView(name=f"n{i}", gpus=gpus, cpus_total=8, mem_total_bytes=64 << 30, cpus_committed=0,
                      mem_committed_bytes=0, mem_available_measured_bytes=None, schedulable=True,
                      unschedulable_reason="", containers=None) for i in range(JIT_MIN_NODES)]
    sched = Scheduler(ClusterSnapshot(nodes=nodes))
    assert sched.frag.jit_form is not None
    specs = [JobSpec(cpus=1, mem_bytes=1 << 30),
             JobSpec(gpus=(GpuAlternative(0.5, None, None),), cpus=1, mem_bytes=1 << 30, gpu_mode=GpuMode.SHARED),
             JobSpec(gpus=(GpuAlternative(1.0, None, None),), cpus=1, mem_bytes=1 << 30),
             JobSpec(gpus=(GpuAlternative(1.0, None, None),), cpus=1, mem_bytes=1 << 30, vram_bytes=8 << 30,
                     gpu_mode=GpuMode.SHARED)]
    for job_id, spec in enumerate(specs * 2, 1):
        sched.place(spec, job_id)
        sched.fits_now(spec)


if __name__ == "__main__":
    warm()

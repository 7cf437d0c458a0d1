"""Idle culling is a pure function of samples and time (mtgpu/workspaces/idle.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mtgpu.workspaces.idle import Activity, observe, started, verdict

HOUR = 3600.0


def run(samples: list[Activity], start: float = 0.0):
    state = started(start)
    for s in samples:
        state = observe(state, s)
    return state


def test_an_idle_workspace_is_stopped_after_the_timeout_with_the_reason():
    state = run([Activity(at=t * 60.0) for t in range(0, 121)])  # two hours of quiet samples
    assert verdict(state, 2 * HOUR - 1, timeout_s=2 * HOUR) is None
    why = verdict(state, 2 * HOUR, timeout_s=2 * HOUR)
    assert why.startswith("stopped after 2h00m idle (idle_timeout 2h00m)") and "mt-container start" in why


def test_a_long_computation_with_nobody_attached_is_never_culled():
    samples = [Activity(at=t * 60.0, cpu_seconds=t * 60.0 * 0.9) for t in range(0, 600)]  # 90% of a core for 10 h
    state = run(samples)
    assert verdict(state, samples[-1].at + 1, timeout_s=HOUR) is None
    assert state.why_active == "CPU at 90% of a core"


def test_each_kind_of_activity_keeps_it_alive_and_is_named():
    for sample, words in [(Activity(at=100.0, sessions=1), "1 session attached"),
                          (Activity(at=100.0, port_connections=3), "3 connections to its ports"),
                          (Activity(at=100.0, gpu_util_pct=40.0), "GPU at 40%")]:
        state = run([Activity(at=0.0), sample])
        assert state.last_active_at == 100.0 and state.why_active == words
        assert verdict(state, 100.0 + HOUR - 1, timeout_s=HOUR) is None


def test_cpu_under_the_threshold_is_idle_and_a_restarted_counter_is_not_negative():
    state = run([Activity(at=0.0, cpu_seconds=10.0), Activity(at=1000.0, cpu_seconds=20.0)])  # 1% of a core
    assert state.last_active_at == 0.0
    state = run([Activity(at=0.0, cpu_seconds=500.0), Activity(at=10.0, cpu_seconds=5.0)])  # new processes: 50%
    assert state.last_active_at == 10.0


def test_off_never_culls_and_old_samples_change_nothing():
    state = run([Activity(at=0.0)])
    assert verdict(state, 100 * HOUR, timeout_s=None) is None
    later = observe(state, Activity(at=50.0, sessions=1))
    assert observe(later, Activity(at=20.0)) == later


@settings(max_examples=200)
@given(st.lists(st.tuples(st.floats(0, 600), st.integers(0, 2), st.floats(0, 100), st.floats(0, 1.0)), max_size=40),
       st.floats(60, 10 * HOUR))
def test_never_culled_within_the_timeout_of_its_last_busy_sample(steps, timeout):
    t, cpu, state = 0.0, 0.0, started(0.0)
    last_busy = 0.0
    for dt, sessions, gpu, cpu_rate in steps:
        t += dt + 0.001
        cpu += cpu_rate * (dt + 0.001)
        state = observe(state, Activity(at=t, sessions=sessions, gpu_util_pct=gpu, cpu_seconds=cpu))
        if state.last_active_at == t:
            last_busy = t
        assert state.last_active_at == last_busy
        assert verdict(state, t, timeout) is None or t - last_busy >= timeout

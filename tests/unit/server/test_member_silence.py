"""When the scheduler marks a member down: after MEMBER_DOWN_AFTER_S without a report taken,
counted from the last report, from the moment it began to schedule, or from the end of a
stall of its own (issue 23: a slow scheduler takes no one for dead). Time is injected."""

from __future__ import annotations

from pathlib import Path

from mtgpu.server.member.scheduler_role import SchedulerRole
from mtgpu.server.member.view import NodeTelemetry
from mtgpu.state import commands as C
from mtgpu.state.journal import JournaledState
from mtgpu.state.store import commit

DOWN_AFTER_S = 3.0


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make_role(tmp_path: Path) -> tuple[SchedulerRole, JournaledState, Clock]:
    store = JournaledState(tmp_path / "state")
    for name in ("sched", "b"):
        assert commit(store, C.NODE_REGISTER, name=name, gpus=[], cpus=2.0, mem_total_bytes=1 << 30, at=0.0)["ok"]
    mono = Clock()
    role = SchedulerRole(store, "sched", clock=lambda: 5000.0, down_after_s=DOWN_AFTER_S, monotonic=mono)
    role.run_once(5000.0, store.term())  # elected at mono 1000
    return role, store, mono


def hear(role: SchedulerRole, mono: Clock, node: str = "b") -> None:
    role.report(node, NodeTelemetry(heard_mono=mono.t))


def pass_at(role: SchedulerRole, store: JournaledState, mono: Clock, t: float) -> bool:
    """One pass at monotonic moment t; whether b is down after it."""
    mono.t = t
    role.run_once(5000.0, store.term())
    return store.machine.nodes["b"].down


def down_only_once_silent_past_the_limit(role: SchedulerRole, store: JournaledState, mono: Clock,
                                         heard: float) -> None:
    """b, last heard at `heard`: passes every 0.2 s from now (as the loop runs them) up to
    DOWN_AFTER_S after it leave b up; the pass just after marks it down."""
    t = mono.t
    while t < heard + DOWN_AFTER_S - 0.2:
        t += 0.2
        assert not pass_at(role, store, mono, t), t
    assert pass_at(role, store, mono, heard + DOWN_AFTER_S + 0.2)


def test_a_member_silent_past_member_down_after_s_is_marked_down(tmp_path):
    role, store, mono = make_role(tmp_path)
    hear(role, mono)
    down_only_once_silent_past_the_limit(role, store, mono, heard=1000.0)


def test_a_scheduler_back_from_its_own_stall_gives_members_the_full_time_again(tmp_path):
    role, store, mono = make_role(tmp_path)
    hear(role, mono)
    assert not pass_at(role, store, mono, 1000.5)
    # The scheduler itself ran nothing for 4 s (its machine starved it): b's reports may
    # be waiting unread in its socket. No one is marked down for that...
    assert not pass_at(role, store, mono, 1004.5)
    assert not pass_at(role, store, mono, 1006.0)
    hear(role, mono)  # ...and the reports read after it count
    assert not pass_at(role, store, mono, 1007.0)
    # a member that really went silent is still marked down, MEMBER_DOWN_AFTER_S later
    down_only_once_silent_past_the_limit(role, store, mono, heard=1006.0)


def test_the_longest_gap_between_a_members_reports_is_kept_since_this_scheduler_began(tmp_path):
    role, store, mono = make_role(tmp_path)
    for t in (1000.0, 1001.0, 1002.7, 1003.5):
        mono.t = t
        hear(role, mono)
    assert abs(role.longest_gap_s["b"] - 1.7) < 1e-9


def test_a_scheduler_that_stalls_again_and_again_still_marks_a_silent_member_down(tmp_path):
    role, store, mono = make_role(tmp_path)
    hear(role, mono)
    down_at = None
    t = 1000.0
    while down_at is None and t < 1100.0:
        t += 2.5  # every pass comes after a stall of the scheduler's own, and b never reports
        if pass_at(role, store, mono, t):
            down_at = t
    # excused once (the silence counts from 1002.5), then marked down within MEMBER_DOWN_AFTER_S more
    assert down_at is not None and down_at - 1002.5 <= DOWN_AFTER_S + 2.5, down_at

"""An idle member's loop rests between passes (server/member/runtime.py, _may_rest)."""

from __future__ import annotations

from types import SimpleNamespace

from mtgpu.server.member.runtime import IDLE_TICK_S, Member
from mtgpu.state.machine import StateMachine


def member(leads: bool, epoch: int | None, machine: StateMachine) -> Member:
    m = Member.__new__(Member)  # the rule only: no agent, no store of its own
    m.store = SimpleNamespace(machine=machine, is_leader=lambda: leads)
    m.scheduler = SimpleNamespace(epoch=epoch)
    return m


def test_a_member_with_nothing_queued_or_running_rests_until_the_idle_tick():
    idle = StateMachine()
    assert member(True, 3, idle)._may_rest(0.2)
    assert member(False, None, idle)._may_rest(0.5)
    assert not member(True, 3, idle)._may_rest(IDLE_TICK_S)  # its pass is due


def test_a_member_whose_role_changed_or_with_work_in_the_cluster_does_not_rest():
    idle = StateMachine()
    assert not member(True, None, idle)._may_rest(0.2)  # it leads and does not schedule yet
    assert not member(False, 3, idle)._may_rest(0.2)  # it schedules and no longer leads
    busy = StateMachine()
    busy._queued[1] = None
    assert not member(True, 3, busy)._may_rest(0.2)
    busy._queued.clear()
    busy._running[2] = None
    assert not member(False, None, busy)._may_rest(0.2)

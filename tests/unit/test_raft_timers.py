"""The Raft thread's wait ends when its next timer is due (state/raft_timers.py)."""

from __future__ import annotations

from mtgpu.state.raft_timers import OVERDUE_TICK_S, SLACK_S, TimedSyncObj
from pysyncobj.monotonic import monotonic


def timed(leader: bool, due_in: float | None, voter: bool = True) -> TimedSyncObj:
    class Stand(TimedSyncObj):  # the wait's arithmetic only: no replica, no port
        selfNode = object() if voter else None

    sync = Stand.__new__(Stand)
    now = monotonic()
    sync._isLeader = lambda: leader
    if leader:
        sync._SyncObj__newAppendEntriesTime = now + due_in
    else:
        sync._SyncObj__raftElectionDeadline = now + (due_in if due_in is not None else 0)
    return sync


def test_a_leader_waits_until_its_next_heartbeat_and_no_longer_than_the_tick():
    assert 0.05 < timed(True, 0.1)._wait_s(0.5) <= 0.1 + SLACK_S
    assert timed(True, 2.0)._wait_s(0.5) == 0.5
    assert timed(True, -0.01)._wait_s(0.5) == 0.0  # due during this tick: the next tick sends it


def test_a_follower_waits_until_its_election_deadline_and_an_overdue_one_does_not_spin():
    assert 0.2 < timed(False, 0.3)._wait_s(0.5) <= 0.3 + SLACK_S
    assert timed(False, -1.0)._wait_s(0.5) == OVERDUE_TICK_S  # connected to nobody: nothing to do yet


def test_a_non_voter_waits_the_whole_tick_and_a_zero_wait_stays_zero():
    assert timed(False, 0.1, voter=False)._wait_s(0.5) == 0.5
    assert timed(True, 0.1)._wait_s(0.0) == 0.0

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


def test_a_replica_built_on_a_thread_that_ends_goes_on_committing(tmp_path):
    """A replica reopened in a new role is built on an API call's worker thread, which
    AnyIO ends after 10 s idle; pysyncobj stopped the Raft thread once its builder had
    ended, and a lone voter committed nothing more. Real replica on loopback."""
    import socket
    import threading
    import time

    from mtgpu.state import commands as C
    from mtgpu.state.raft import RaftState

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
    built: list[RaftState] = []
    builder = threading.Thread(target=lambda: built.append(RaftState(tmp_path, address, [address], "x" * 40)))
    builder.start()
    builder.join(timeout=30)
    assert not builder.is_alive() and built
    rs = built[0]
    try:
        deadline = time.monotonic() + 30
        while not rs.is_leader():
            assert time.monotonic() < deadline, "the lone voter never led"
            time.sleep(0.05)
        time.sleep(2.0)  # several ticks after its builder ended (a tick is at most 0.5 s apart)
        raft_threads = [t for t in threading.enumerate() if "_autoTickThread" in repr(getattr(t, "_target", ""))]
        assert raft_threads, "the Raft thread ended with the thread that built the replica"
        assert rs.apply(C.command(C.TENANT_ENSURE, name="alice", uid=2001, gid=2001, at=1.0), timeout_s=10.0)["ok"]
    finally:
        rs.close()

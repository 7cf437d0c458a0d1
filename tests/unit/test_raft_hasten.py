"""The election brought forward when the leader's process is gone (state/raft_hasten.py)."""

from __future__ import annotations

import socket
from types import SimpleNamespace

from pysyncobj.monotonic import monotonic

from mtgpu.state.raft_hasten import HASTEN_STEP_S, ElectionHastener, election_delay, port_refused


def test_the_remaining_voters_stand_in_the_order_of_their_addresses():
    voters = ["10.0.0.3:7", "10.0.0.1:7", "10.0.0.2:7"]
    assert election_delay("10.0.0.1:7", voters, lost="10.0.0.2:7") == 0
    assert election_delay("10.0.0.3:7", voters, lost="10.0.0.2:7") == HASTEN_STEP_S
    assert election_delay("10.0.0.3:7", voters, lost="10.0.0.1:7") == HASTEN_STEP_S
    assert election_delay("10.0.0.9:7", voters, lost="10.0.0.1:7") is None  # not a voter


def test_a_port_nobody_listens_on_is_refused_and_a_listening_one_is_not():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.listen()
        assert port_refused("127.0.0.1", port) is False
    assert port_refused("127.0.0.1", port) is True


class Node(SimpleNamespace):
    def __eq__(self, other):
        return isinstance(other, Node) and other.address == self.address

    def __hash__(self):
        return hash(self.address)


def fake_sync(me: str, others: list[str], leader: str | None, term: int = 4, deadline_in: float = 0.7):
    nodes = {a: Node(address=a, ip=a.split(":")[0], port=int(a.split(":")[1])) for a in others}
    sync = SimpleNamespace(selfNode=Node(address=me) if me else None, otherNodes=set(nodes.values()),
                           raftCurrentTerm=term, _SyncObj__connectedNodes=set(),
                           _SyncObj__raftElectionDeadline=monotonic() + deadline_in)
    sync._getLeader = lambda: nodes.get(leader)
    return sync, nodes


def run(hastener: ElectionHastener, jobs: list, sync) -> None:
    for t in list(hastener_threads()):
        t.join(5)
    while jobs:
        jobs.pop(0)(sync)


def hastener_threads():
    import threading
    return [t for t in threading.enumerate() if t.name == "raft-leader-probe"]


def make(sync, refused, probes: list, window_s: float = 0.0):
    """`refused`: a bool for every probe, or a callable of the probe's number (0, 1, ...)."""
    jobs: list = []

    def probe(host, port):
        probes.append((host, port))
        return refused(len(probes) - 1) if callable(refused) else refused

    return ElectionHastener(lambda: sync, jobs.append, probe=probe, gap_s=0.01, window_s=window_s), jobs


def test_a_lost_leader_whose_port_refuses_brings_the_election_forward_by_rank():
    sync, nodes = fake_sync("127.0.0.1:3", ["127.0.0.1:1", "127.0.0.1:2"], leader="127.0.0.1:1")
    probes: list = []
    h, jobs = make(sync, refused=True, probes=probes)
    before = sync._SyncObj__raftElectionDeadline
    h.peer_lost(nodes["127.0.0.1:1"])
    run(h, jobs, sync)
    assert probes == [("127.0.0.1", 1)]
    assert h.hastened == 1
    # rank 1 of the two left (":2" < ":3"): one step from now, well before the timeout
    assert sync._SyncObj__raftElectionDeadline < before
    assert sync._SyncObj__raftElectionDeadline <= monotonic() + HASTEN_STEP_S


def test_nothing_changes_when_the_port_answers_or_another_member_is_lost_or_the_term_moved():
    sync, nodes = fake_sync("127.0.0.1:3", ["127.0.0.1:1", "127.0.0.1:2"], leader="127.0.0.1:1")
    probes: list = []
    h, jobs = make(sync, refused=False, probes=probes)
    before = sync._SyncObj__raftElectionDeadline
    h.peer_lost(nodes["127.0.0.1:1"])  # the port answers: maybe only the connection broke
    run(h, jobs, sync)
    assert h.hastened == 0 and sync._SyncObj__raftElectionDeadline == before

    h, jobs = make(sync, refused=True, probes=probes)
    h.peer_lost(nodes["127.0.0.1:2"])  # not the leader: nothing asked
    run(h, jobs, sync)
    assert probes == [("127.0.0.1", 1)] and h.hastened == 0

    h.peer_lost(nodes["127.0.0.1:1"])  # a new term before the answer came: too late to act on it
    for t in hastener_threads():
        t.join(5)
    sync.raftCurrentTerm += 1
    run(h, jobs, sync)
    assert h.hastened == 0 and sync._SyncObj__raftElectionDeadline == before


def test_a_port_that_still_answers_is_asked_again_until_it_refuses_within_the_window():
    """pysyncobj's destroy drops the connections before it closes the listening socket:
    the first probe of a leader stopping in good order can be accepted (a loaded suite run)."""
    sync, nodes = fake_sync("127.0.0.1:3", ["127.0.0.1:1", "127.0.0.1:2"], leader="127.0.0.1:1")
    probes: list = []
    h, jobs = make(sync, refused=lambda i: i >= 3, probes=probes, window_s=5.0)
    before = sync._SyncObj__raftElectionDeadline
    h.peer_lost(nodes["127.0.0.1:1"])
    run(h, jobs, sync)
    assert len(probes) == 4 and h.hastened == 1
    assert sync._SyncObj__raftElectionDeadline < before


def test_the_probes_stop_at_the_window_or_once_the_leader_is_back():
    sync, nodes = fake_sync("127.0.0.1:3", ["127.0.0.1:1", "127.0.0.1:2"], leader="127.0.0.1:1")
    probes: list = []
    h, jobs = make(sync, refused=False, probes=probes, window_s=0.2)
    before = sync._SyncObj__raftElectionDeadline
    h.peer_lost(nodes["127.0.0.1:1"])  # answers throughout: a live leader, only the connection broke
    run(h, jobs, sync)
    assert 2 <= len(probes) <= 21 and h.hastened == 0 and sync._SyncObj__raftElectionDeadline == before

    probes.clear()
    h, jobs = make(sync, refused=lambda i: (sync._SyncObj__connectedNodes.add(nodes["127.0.0.1:1"]), False)[1],
                   probes=probes, window_s=5.0)
    h.peer_lost(nodes["127.0.0.1:1"])  # it answers, and its connection is back: nothing more to ask
    run(h, jobs, sync)
    assert len(probes) == 1 and h.hastened == 0


def test_a_non_voting_member_stands_for_nothing():
    sync, nodes = fake_sync("", ["127.0.0.1:1", "127.0.0.1:2"], leader="127.0.0.1:1")
    probes: list = []
    h, jobs = make(sync, refused=True, probes=probes)
    h.peer_lost(nodes["127.0.0.1:1"])
    run(h, jobs, sync)
    assert probes == [] and h.hastened == 0


def test_the_majority_moment_is_carried_from_pysyncobjs_clock_to_time_monotonic(monkeypatch):
    """pysyncobj stamps answers with CLOCK_MONOTONIC_RAW, which parts from time.monotonic
    by the clock's drift over the uptime: a moment is carried over, never compared as is."""
    import time as _time

    from mtgpu.state import raft

    monkeypatch.setattr(raft, "raft_monotonic", lambda: _time.monotonic() - 100.0)  # a drift of 100 s
    a, b = Node(address="127.0.0.1:1"), Node(address="127.0.0.1:2")
    raw_now = _time.monotonic() - 100.0
    sync = SimpleNamespace(otherNodes={a, b}, _SyncObj__lastResponseTime={a: raw_now - 0.5, b: raw_now - 3.0})
    state = raft.RaftState.__new__(raft.RaftState)
    state._sync = sync
    age = state.majority_heard_age_s()
    assert 0.45 < age < 0.7  # the fresher of the two answers is a majority with itself: 0.5 s ago, not 100.5
    sync._SyncObj__lastResponseTime = {}
    assert state.majority_heard_age_s() > 1000  # never answered: as old as can be

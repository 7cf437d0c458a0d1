"""RaftState role changes with real pysyncobj replicas on loopback (several in one
process): a member is promoted to a voter and another demoted while commands commit,
reads never go back in time, and the promoted voter counts for the majority."""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import threading
import time

import pytest

from mtgpu.state import commands as C
from mtgpu.state.raft import RaftState
from mtgpu.state.store import ReplicationError
from tests.support.cluster import free_port_pair
from tests.support.node import wait_for


def register(store: RaftState, name: str) -> None:
    for _ in range(100):
        try:
            store.apply(C.command(C.NODE_REGISTER, name=name, at=1.0, gpus=[], cpus=1.0, mem_total_bytes=1 << 30),
                        timeout_s=5.0)
            return
        except ReplicationError:
            time.sleep(0.1)  # an election or a membership change is under way
    raise AssertionError(f"could not commit the registration of {name}")


def leader_of(stores: list[RaftState]) -> RaftState:
    return wait_for("a leader with a quorum", lambda: next((s for s in stores if s.is_leader()), None), timeout_s=20)


@contextlib.contextmanager
def three_voters(tmp_path):
    """Three voters on loopback, each in a folder of its own; all closed afterwards."""
    secret = secrets.token_urlsafe(48)
    addrs = [f"127.0.0.1:{free_port_pair()}" for _ in range(3)]
    stores = [RaftState(tmp_path / a.replace(":", "_"), a, addrs, secret) for a in addrs]
    try:
        yield stores
    finally:
        for s in stores:
            with contextlib.suppress(Exception):
                s.close()


def test_promote_and_demote_keep_the_state_and_the_majority(tmp_path):
    secret = secrets.token_urlsafe(48)
    addrs = [f"127.0.0.1:{free_port_pair()}" for _ in range(4)]
    voters = addrs[:3]
    stores = {a: RaftState(tmp_path / a.replace(":", "_"), a if a in voters else None, voters, secret)
              for a in addrs}
    a, b, c, d = (stores[x] for x in addrs)
    try:
        leader = leader_of([a, b, c])
        for i in range(20):
            register(leader, f"n{i}")
        wait_for("the member to have every entry", lambda: len(d.machine.nodes) == 20)
        assert not d.is_voter() and d.voters() == sorted(voters)

        # Promote d: propose it, reopen it as a voter, then the change commits.
        leader = leader_of([a, b, c])
        wait = leader.add_voter_async(addrs[3])
        d.reopen(addrs[3], sorted(voters + [addrs[3]]))
        assert len(d.machine.nodes) == 20  # the old state until the fresh replica caught up
        wait(15.0)
        assert d.is_voter() and d.generation == 1
        wait_for("d to catch up", lambda: d.caught_up() and len(d.machine.nodes) == 20)

        # Demote c (never the leader): reopen as a member first, then take it out.
        leader = leader_of([a, b, c, d])
        victim = next(s for s in (c, b, a) if s is not leader)
        victim_addr = victim.self_address
        rest = sorted(set(addrs) - {victim_addr})
        victim.reopen(None, rest)
        assert not victim.is_voter() and len(victim.machine.nodes) == 20
        leader.remove_voter(victim_addr)
        assert sorted(leader.voters()) == rest
        register(leader, "after-demotion")
        for s in stores.values():
            wait_for("every replica to apply it", lambda s=s: "after-demotion" in s.machine.nodes)

        # The promoted voter counts: with the leader gone, the two others elect one
        # of them and commit.
        leader.close()
        remaining = [s for s in stores.values() if s is not leader and s is not victim]
        new = leader_of(remaining)
        register(new, "after-failover")
        for s in remaining + [victim]:
            wait_for("every live replica to apply it", lambda s=s: "after-failover" in s.machine.nodes)
        stores.pop(leader.self_address)
    finally:
        for s in stores.values():
            with contextlib.suppress(Exception):
                s.close()


def test_proposals_in_flight_when_a_member_reopens_all_get_an_answer(tmp_path):
    secret = secrets.token_urlsafe(48)
    addrs = [f"127.0.0.1:{free_port_pair()}" for _ in range(4)]
    voters = addrs[:3]
    stores = [RaftState(tmp_path / str(i), a if a in voters else None, voters, secret) for i, a in enumerate(addrs)]
    member = stores[3]
    try:
        leader_of(stores[:3])
        register(member, "first")
        answers: list[tuple[int, object]] = []
        lock = threading.Lock()

        def answer(k):
            def callback(result, error):
                with lock:
                    answers.append((k, result if error is None else error))
            return callback

        for k in range(200):
            member.apply_async(C.command(C.NODE_REGISTER, name=f"x{k}", at=1.0, gpus=[], cpus=1.0,
                                         mem_total_bytes=1 << 30), answer(k))
        member.reopen(None, voters)
        wait_for("every proposal to be answered", lambda: len(answers) == 200, timeout_s=15)
        assert sorted(k for k, _ in answers) == list(range(200))  # each exactly once
        unknown = [a for _, a in answers if isinstance(a, ReplicationError)]
        assert unknown and all("may or may not have been recorded" in str(e) for e in unknown)
        register(member, "after-reopen")  # the reopened member proposes again
        wait_for("the member to see it", lambda: "after-reopen" in member.machine.nodes)
    finally:
        for s in stores:
            with contextlib.suppress(Exception):
                s.close()


def test_the_leader_knows_how_long_ago_a_majority_answered_it(tmp_path):
    """The jobs' lease on the scheduler's own member lapses from its last exchange with
    a majority, not from the moment it notices that it lost the lead."""
    with three_voters(tmp_path) as stores:
        leader = leader_of(stores)
        register(leader, "n0")
        wait_for("answers from the followers", lambda: leader.majority_heard_age_s() < 0.5, timeout_s=20)
        gone = time.monotonic()
        for s in stores:
            if s is not leader:
                s.close()
        age = wait_for("the age to grow", lambda: (a := leader.majority_heard_age_s()) >= 1.5 and a, timeout_s=20)
        assert age <= time.monotonic() - gone + 0.5


def test_leader_facts_are_the_leaders_own_and_never_make_the_majority_fresher(tmp_path):
    """What the scheduler answers each report with (RaftState.leader_facts, kept up to
    10 ms): its lead, voters and term, and a moment a majority answered that is never
    later than the one read now; a voter that stopped leading says so within that time."""
    secret = secrets.token_urlsafe(48)
    addrs = [f"127.0.0.1:{free_port_pair()}" for _ in range(3)]
    stores = [RaftState(tmp_path / str(i), a, addrs, secret) for i, a in enumerate(addrs)]
    try:
        leader = leader_of(stores)
        for _ in range(50):
            leading, heard_at, voters, term = leader.leader_facts()
            assert leading and voters == leader.voters() == sorted(addrs) and term == leader.term()
            age_now = leader.majority_heard_age_s()  # read after the facts, so never shorter by the truth
            assert time.monotonic() - heard_at >= age_now
            time.sleep(0.003)
        follower = next(s for s in stores if s is not leader)
        assert not follower.leader_facts()[0]
        # the leader alone: within a few facts' lifetimes it no longer claims the lead
        for s in stores:
            if s is not leader:
                s.close()
        wait_for("the lone leader to stop claiming the lead", lambda: not leader.leader_facts()[0], timeout_s=30)
    finally:
        for s in stores:
            with contextlib.suppress(Exception):
                s.close()


def test_a_leader_whose_process_is_gone_is_replaced_without_waiting_out_the_timeout(tmp_path):
    """Its followers see the connection end and its Raft port refuse: one of them stands for
    election at once (raft_hasten.py), instead of after 0.65-1.2 s of silence."""
    with three_voters(tmp_path) as stores:
        leader = leader_of(stores)
        register(leader, "n0")
        term = leader.term()
        rest = [s for s in stores if s is not leader]
        # Only the hastening may elect the next leader soon: the followers' own timeout is
        # made longer than any stall of a loaded machine. (With 0.65-1.2 s, a loaded suite
        # run's followers now and then stood by their timeout before the probe of the
        # leader's port had answered, and nothing was left to bring forward.)
        for s in rest:
            s._sync.conf.raftMinTimeout, s._sync.conf.raftMaxTimeout = 15.0, 16.0
        # Longer than pysyncobj's connectionTimeout (2 s) with nothing between the followers:
        # their connection must still carry the vote request (raft_route.py's keepalives).
        # The leader's heartbeats meanwhile set each follower's deadline by the new timeout.
        time.sleep(3.0)
        leader.close()  # its sockets closed, nothing listens on its port: as after a SIGKILL
        new = leader_of(rest)
        assert new is not leader
        assert sum(s.hastener.hastened for s in rest) >= 1
        # The logs are equal, so the first to stand wins the first election after the leader's.
        assert new.term() == term + 1, (term, new.term())
        register(new, "n1")  # the new leader commits


def test_a_raft_port_held_by_another_process_is_named_and_the_member_leads_once_it_is_free(tmp_path, caplog):
    """pysyncobj retries a failed bind every second without a word, and a voter that never
    binds never stands: a one-member cluster whose Raft port another process held answered
    its first command "no quorum reachable?" (a loaded suite run). Now the refusal names the
    port, and the member leads as soon as the port is free."""
    port = free_port_pair()
    address = f"127.0.0.1:{port}"
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))  # pysyncobj binds every interface: this one is enough to refuse it
    holder.listen()
    store = None
    try:
        with caplog.at_level(logging.ERROR, logger="mtgpu.state.raft_route"):
            store = RaftState(tmp_path / "r", address, [address], secrets.token_urlsafe(48))
            with pytest.raises(ReplicationError) as refused:
                store.apply(C.command(C.NODE_REGISTER, name="n0", at=1.0, gpus=[], cpus=1.0,
                                      mem_total_bytes=1 << 30), timeout_s=3.0)
        assert f"cannot bind its Raft port 0.0.0.0:{port}" in str(refused.value), refused.value
        assert "stop the process that holds the port" in str(refused.value)
        assert store.bind_problem() and any("cannot bind its Raft port" in r.getMessage() for r in caplog.records)
        assert not store.is_leader()
        holder.close()
        leader_of([store])
        register(store, "n0")
        assert store.bind_problem() == ""
    finally:
        holder.close()
        if store is not None:
            store.close()

"""A leader whose process is gone is replaced at once, not after an election timeout.

Raft finds a dead leader by silence: a follower that hears nothing for its election
timeout (0.35-0.8 s here, raft.py) stands for election, and a vote it loses to a longer
log costs another timeout. Most failures of a scheduler are not silent, though: a crashed
or killed process's sockets are closed by its kernel, so its followers see their
connection to it end at once, and a connection attempt to its Raft port is refused.

So when a voter's connection to the leader ends, it asks the leader's port directly
(in a thread of its own, never on pysyncobj's). Refused: nothing listens there, the
leader is gone, and the voter brings its election forward to `rank x HASTEN_STEP_S`
from now, its rank among the remaining voters by address. The first stands at once; if
its log is behind, the next one's vote is refused and it stands itself one step later,
when the first votes for it (a vote resets the voter's own timeout, so nobody else
stands). A port that still answers is asked again every PROBE_GAP_S for PROBE_WINDOW_S,
while the leader stays disconnected in the same term: a leader that stops in good order
(pysyncobj's destroy) drops its connections before it closes its listening socket, and
on a busy machine the first probe can land between the two (a loaded suite run saw it).
Anything else (the port answers throughout, or the probe times out: a machine that is
down or a network that drops the packets) leaves Raft to its timeout, as before. Only
the timing changes, never a rule of Raft: the vote, terms and logs decide as always,
and a voter that was wrong costs one election.

Not for a member reached through a route (raft_route.py: DirectLink through a relay):
there is no port of its to ask.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Callable

from pysyncobj.monotonic import monotonic  # pysyncobj's clock (CLOCK_MONOTONIC_RAW), not time.monotonic's

log = logging.getLogger(__name__)

HASTEN_STEP_S = 0.15  # between the ranks' elections: over pysyncobj's 50 ms tick and a vote's round trip
PROBE_TIMEOUT_S = 0.3  # a leader's machine that answers nothing in this time: Raft's timeout decides
PROBE_GAP_S = 0.1  # between the probes of a port that still answered
PROBE_WINDOW_S = 1.5  # how long a port that answers is asked again (a leader closing in good order)


def port_refused(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True when a connection to host:port is refused (nothing listens: the process is gone);
    False when it is accepted, times out or fails otherwise (nothing known)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def election_delay(self_address: str, voters: list[str], lost: str) -> float | None:
    """Seconds from now at which this voter stands for election once `lost` (the leader)
    is gone: its rank by address among the other voters, times HASTEN_STEP_S; None when
    it is not a voter."""
    remaining = sorted(v for v in set(voters) if v != lost)
    if self_address not in remaining:
        return None
    return remaining.index(self_address) * HASTEN_STEP_S


class ElectionHastener:
    """Wired into the transport (raft_route.py calls `peer_lost` on pysyncobj's thread when
    a connection to a member ends) and into the replica's tick jobs (`post` runs a job on
    pysyncobj's thread)."""

    def __init__(self, sync_of: Callable[[], object], post: Callable[[Callable], None],
                 probe: Callable[[str, int], bool] = port_refused, gap_s: float = PROBE_GAP_S,
                 window_s: float = PROBE_WINDOW_S) -> None:
        self._sync_of = sync_of
        self._post = post
        self._probe = probe
        self._gap_s, self._window_s = gap_s, window_s
        self.hastened = 0  # elections brought forward since start (read by tests)

    def peer_lost(self, node) -> None:
        """On pysyncobj's thread: the connection to `node` ended."""
        sync = self._sync_of()
        if sync is None or sync.selfNode is None:  # a non-voting member stands for nothing
            return
        leader = sync._getLeader()
        if leader is None or leader != node:
            return
        term = sync.raftCurrentTerm
        threading.Thread(target=self._check, args=(sync, node, term), name="raft-leader-probe",
                         daemon=True).start()

    def _check(self, sync, node, term: int) -> None:
        """In its own thread: probe until refused, the window ends, or the leader is back
        (connected again, or a new term: Raft moved on without us)."""
        end = time.monotonic() + self._window_s
        while True:
            if self._probe(node.ip, node.port):
                self._post(lambda s: self._hasten(s, sync, node, term))
                return
            if time.monotonic() + self._gap_s > end or not self._still_lost(sync, node, term):
                return
            time.sleep(self._gap_s)

    @staticmethod
    def _still_lost(sync, node, term: int) -> bool:
        """The same term, the same leader, and still not connected again. Read from the
        probe's thread too (plain reads; pysyncobj's thread may change them meanwhile, and
        _hasten asks again on that thread before acting)."""
        return (sync.raftCurrentTerm == term and sync._getLeader() == node
                and node not in sync._SyncObj__connectedNodes)

    def _hasten(self, current, sync, node, term: int) -> None:
        """On pysyncobj's thread: bring this voter's election forward, if nothing changed since."""
        if current is not sync or not self._still_lost(sync, node, term):
            return
        voters = [n.address for n in sync.otherNodes] + [sync.selfNode.address]
        delay = election_delay(sync.selfNode.address, voters, node.address)
        deadline = getattr(sync, "_SyncObj__raftElectionDeadline", None)
        if delay is None or deadline is None:
            return
        at = monotonic() + delay
        if at < deadline:
            sync._SyncObj__raftElectionDeadline = at
            self.hastened += 1
            wake = getattr(sync, "wake", None)
            if wake is not None:  # its wait was measured against the old deadline
                wake()
            log.info("the scheduler's Raft port at %s refuses connections: its process is gone; this member "
                     "stands for election in %.2fs instead of waiting out its timeout", node.address, delay)

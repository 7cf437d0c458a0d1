"""On the scheduler: carry out voter_policy's steps (Raft membership changes, role
calls to members, leadership transfers), one at a time, from its own thread (`mtgpu-voters`).

Every step first commits a barrier (an entry that changes nothing): pysyncobj puts
a membership change in force as soon as it is appended and does not itself refuse a
second one while the first is pending, and committing the barrier commits every
entry before it. So at most one change is ever pending, and a step whose barrier
does not commit is not taken.

A promotion tells the member to reopen its replica as a voter first (outside the
configuration nobody talks to it, so it cannot vote yet), then proposes it to Raft
(the cluster may need its vote to commit: from one voter to two), and takes the
change back at once if it does not commit. A demotion takes the member out of the
configuration first, committed, and only then tells it to reopen as a non-voting
member with an emptied log: a log the cluster still counts on is never emptied.
Any failure leaves a state the next step repairs: a voter in the configuration that
runs as a member is taken out (voter_policy), and a member that votes although the
scheduler does not count it steps down by itself (cluster.py).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import httpx

from ...state import commands as C
from ...state.store import ReplicationError
from .addresses import advertised, raft_address
from .errors import ClusterSetupError
from .voter_policy import MemberState, capability, plan_voters

log = logging.getLogger(__name__)

SETTLE_S = 3.0           # a new scheduler first collects a round of reports
STEP_EVERY_S = 2.0       # at most one membership step this often
TRANSFER_EVERY_S = 5.0
REPORT_FRESH_S = 3.0
CAUGHT_UP_ENTRIES = 2000  # a replica this close behind the commit index counts as caught up
CONNECT_WITHIN_S = 2.5   # a new voter must link up before the leader's quorum check gives up (3 s)


@dataclass(slots=True)
class RoleReport:
    voter: bool
    caught_up: bool
    generation: int
    boot: str
    lag: int
    at: float


class VoterKeeper:
    def __init__(self, link) -> None:
        self.link = link
        self.roles: dict[str, RoleReport] = {}
        self._min_generation: dict[str, tuple[str, int]] = {}  # name -> (boot, generation) it answered
        self._next_at = 0.0
        self._term = -1          # the term this keeper last saw itself lead in, and since when
        self._since = 0.0
        self.lock = threading.Lock()  # one membership change at a time, also an admin's removal

    # ------------------------------------------------------------ what members say
    def on_report(self, name: str, raft: dict | None, commit: int) -> None:
        """Keep what a member's report says of its replica (`commit`: the scheduler's
        commit index as it answers)."""
        if not raft:
            return
        self.roles[name] = RoleReport(bool(raft.get("voter")), bool(raft.get("caught_up")),
                                      int(raft.get("generation", 0)), str(raft.get("boot", "")),
                                      commit - int(raft.get("applied", 0)), time.monotonic())

    def _current(self, name: str, r: RoleReport) -> bool:
        """Whether a report was sent after the member's last role change we caused
        (a report of a later start of the member always is)."""
        seen = self._min_generation.get(name)
        return seen is None or r.boot != seen[0] or r.generation >= seen[1]

    def member_states(self) -> list[MemberState]:
        link = self.link
        telemetry = link.member.scheduler.telemetry
        mono = time.monotonic()
        states = []
        for rec in list(link.store.machine.nodes.values()):
            if not rec.address:
                continue
            tel = telemetry.get(rec.name)
            fresh = tel is not None and mono - tel.heard_mono < REPORT_FRESH_S  # a clock jump changes nothing
            role, settled = None, False
            if rec.name == link.node_name:
                role, settled = "voter", True
            else:
                r = self.roles.get(rec.name)
                if r is not None and mono - r.at < REPORT_FRESH_S and self._current(rec.name, r):
                    role = "voter" if r.voter else "member"
                    settled = r.caught_up and r.lag < CAUGHT_UP_ENTRIES
            states.append(MemberState(name=rec.name, raft=raft_address(rec.address), capability=capability(rec),
                                      healthy=fresh and not rec.down, down=rec.down, role=role, settled=settled))
        return states

    # ------------------------------------------------------------ acting
    def step(self) -> None:
        with self.lock:
            self._step()

    def remove_now(self, raft: str) -> None:
        """An admin's removal of a member: the same barrier and lock as a step."""
        with self.lock:
            self._barrier()
            self.link.store.remove_voter(raft)

    def _barrier(self) -> None:
        """Commit an entry that changes nothing: every membership change before it is
        then committed too."""
        self.link.store.apply(C.command(C.CLUSTER_BARRIER, at=self.link.member.clock()), timeout_s=5.0)

    def _step(self) -> None:
        link, store = self.link, self.link.store
        mono = time.monotonic()
        term = store.term()
        if not store.is_leader():
            return
        if term != self._term:  # newly leading: first collect a round of reports
            self._term, self._since = term, mono
        if mono - self._since < SETTLE_S or mono < self._next_at:
            return
        plan = plan_voters(self.member_states(), set(store.voters()), link.node_name)
        if plan is None:
            return
        self._next_at = mono + (TRANSFER_EVERY_S if plan.action == "transfer" else STEP_EVERY_S)
        log.info("voters: %s %s (%s)", plan.action, plan.name, plan.why)
        try:
            if plan.action == "transfer":
                store.transfer_leadership(plan.raft)
                return
            # Every earlier membership change is committed, and we still lead in the
            # term the step was planned in.
            self._barrier()
            if not store.is_leader() or store.term() != term:
                return
            if plan.action == "remove":
                store.remove_voter(plan.raft)
            elif plan.action == "promote":
                if not self._tell(plan.name, True, sorted(set(store.voters()) | {plan.raft}), term):
                    return
                wait = store.add_voter_async(plan.raft)
                try:
                    # From one voter to two the change needs the new voter: if it does not
                    # link up at once, take the change back while this member still leads.
                    deadline = time.monotonic() + CONNECT_WITHIN_S
                    while not store.is_connected(plan.raft) and time.monotonic() < deadline:
                        time.sleep(0.05)
                    if not store.is_connected(plan.raft):
                        raise ReplicationError(f"{plan.name} did not link up as a voter within {CONNECT_WITHIN_S:g}s")
                    wait(15.0)
                except ReplicationError:
                    store.remove_voter(plan.raft)  # back to a configuration that commits without it
                    raise
            elif plan.action == "demote":
                store.remove_voter(plan.raft)
                self._tell(plan.name, False, sorted(store.voters()), term)
        except (ReplicationError, ClusterSetupError, httpx.HTTPError) as e:
            log.warning("voters: %s %s did not complete: %s (the next step repairs it)", plan.action, plan.name, e)

    def _tell(self, name: str, voter: bool, voters: list[str], term: int) -> bool:
        """Ask the member to reopen in its new role; whether it did."""
        store = self.link.store
        rec = store.machine.nodes.get(name)
        if rec is None or not rec.address or not store.is_leader() or store.term() != term:
            return False
        try:
            r = self.link.call(advertised(rec.address), "POST", "/cluster/v1/role",
                               {"voter": voter, "voters": voters, "term": term}, timeout_s=20.0)
        except (httpx.HTTPError, ClusterSetupError) as e:
            log.warning("voters: could not tell %s to reopen as a %s: %s", name, "voter" if voter else "member", e)
            return False
        self._min_generation[name] = (str(r.get("boot", "")), int(r.get("generation", 0)))
        return bool(r.get("voter")) == voter

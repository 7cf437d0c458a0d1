"""Cluster mode: the same state machine, replicated with Raft through pysyncobj.

This is the only module that imports pysyncobj. Exactly one replicated method
exists, `apply_command` (pysyncobj also aliases it `apply_command_v0`): pysyncobj numbers
replicated methods by their sorted names, so adding a method would renumber the
entries of existing journals. New behaviour arrives as new *command names*
inside the payload (state.commands), never as new methods. Each command handed to
pysyncobj carries its checksum, and the snapshot the machine's (state/checksums.py),
checked before the replica opens (raft_files.py).

Traffic between members is encrypted and authenticated by pysyncobj's password,
derived from the cluster secret: a machine without the secret can neither join
nor read nor write. Voters take part in elections and commits; further members
run as non-voting (read-only) replicas that still receive every entry.

pysyncobj fixes a member's role when its replica opens, so a member changes role by
`reopen`: the replica is closed, its journal and snapshot are deleted and a fresh
one opens in the new role and fetches everything from the leader. Deleting is what
makes this safe: a demoted member never votes again with a log the cluster counted
on (a non-voting replica does not vote at all), and a promoted one joins like a new
server whose empty log no commit ever relied on. Until the fresh replica has caught
up, reads see the state as it was when the old replica closed, so the agent does
not take its running jobs for gone.
"""

from __future__ import annotations

import _socket
import collections
import hashlib
import itertools
import logging
import secrets
import socket
import threading
import time
from pathlib import Path

from pysyncobj import FAIL_REASON, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.monotonic import monotonic as raft_monotonic
from pysyncobj.node import TCPNode
from pysyncobj.syncobj import SyncObjException

# pysyncobj 0.3.17 (win_inet_pton.py) replaces socket.inet_ntop on every platform with a
# Windows-only stand-in that raises TypeError; psutil (server/ports.py, idle_watch.py)
# and asyncssh decode addresses with it. The standard library's own is put back.
if socket.inet_ntop is not _socket.inet_ntop:
    socket.inet_ntop = _socket.inet_ntop

from . import commands as C
from .checksums import seal_command, seal_state, state_problem, unsealed
from .machine import StateMachine
from .raft_files import check_replica_files, stop_on_full_disk
from .raft_hasten import ElectionHastener
from .raft_route import routed_transport
from .raft_timers import IDLE_TICK_S, TimedSyncObj
from .store import ReplicationError

log = logging.getLogger(__name__)


# Election timeouts (s). A freshly promoted voter starts with an empty log at term 0:
# it waits longer before it stands for election, so that it hears from the leader
# first and does not depose it with a higher term; it gets the normal ones once it
# has caught up. A leader sends a heartbeat every HEARTBEAT_S: a follower stands once it
# heard nothing for its timeout, so a leader may stall about 0.3 s (timeout - heartbeat)
# before it is deposed. A leader whose process is gone is replaced sooner (raft_hasten.py).
ELECTION_TIMEOUTS = (0.65, 1.2)
HEARTBEAT_S = 0.2
REOPEN_POLL_S = 0.05  # a command that met a reopen is proposed again this often (apply)
JOINING_ELECTION_TIMEOUTS = (1.5, 2.0)  # at most connectionTimeout (pysyncobj checks)
LEADER_FACTS_S = 0.01  # how old leader_facts() may be (an election takes longer)


def raft_password(secret: str, cluster_id: str) -> str:
    """The pysyncobj password: a key derived from the cluster secret and CLUSTER_ID, never
    the secret itself. Members of two clusters that share a secret file by mistake can
    then never form one Raft group."""
    return hashlib.sha256(b"mtgpu-raft-v2\0" + cluster_id.encode() + b"\0" + secret.encode()).hexdigest()


class SealedOnPickle:
    """The replicated state as the snapshot holds it, a dict with its checksum beside it
    (checksums.py; an older member reads the same format and ignores the checksum), built
    only when pickled: it unpickles as that plain dict. Only pysyncobj's thread changes the
    machine, so building it there, or in a child forked from there, reads no command half
    applied."""

    __slots__ = ("machine",)

    def __init__(self, machine: StateMachine) -> None:
        self.machine = machine

    def sealed(self) -> dict:
        return seal_state({"format": "mtgpu-state-v1", "machine": self.machine.to_dict()})

    def __reduce__(self):
        return (dict, (self.sealed(),))


class _ReplicatedMachine(SyncObjConsumer):
    """The state machine as a pysyncobj consumer, with an explicit snapshot format."""

    def __init__(self, lock: threading.RLock, on_applied=None, on_newer=None) -> None:
        super().__init__()
        self.machine = StateMachine()
        self.lock = lock
        self.on_applied = on_applied
        self.on_newer = on_newer  # on_newer(why): the log holds what this mtgpu cannot apply
        self.newer: str = ""

    def _refuse_newer(self, e: C.NewerFormat) -> None:
        """Stop here: pysyncobj applies the entry again on its next tick (and never goes
        past it), so this replica holds the state up to the entry before, and no snapshot
        of a state with a hole in it is ever written; `on_newer` (the server) is told once."""
        if not self.newer:
            self.newer = str(e)
            log.critical("the replicated state cannot be applied here: %s", e)
            if self.on_newer is not None:
                self.on_newer(self.newer)
        raise e

    @replicated
    def apply_command(self, command: dict) -> dict:
        command = unsealed(command)  # its checksum is checked where the journal is read (raft_files.py)
        with self.lock:
            try:
                result = self.machine.apply(command)
            except C.NewerFormat as e:
                self._refuse_newer(e)
        if self.on_applied is not None:
            try:
                self.on_applied(command, result)
            except Exception:  # a listener must never break replication
                log.exception("state listener failed")
        return result

    def _serialize(self):
        # Called in pysyncobj's thread at each log compaction (every logCompactionMinTime,
        # or sooner after logCompactionMinEntries): building and sealing the state there
        # took 0.35 s idle for 4,000 queued jobs and 1-1.5 s on a busy machine, during
        # which the leader sent no heartbeat and its followers called an election (issue
        # 23). So only a reference is taken here; the state is built and sealed when it is
        # pickled, which pysyncobj does in a child it forks to write the snapshot: a frozen
        # copy of this process, taken in this thread between two commands, so consistent.
        return SealedOnPickle(self.machine)

    def _deserialize(self, data):
        why = state_problem(data)
        if why:  # checked at start too (raft_files.py); never load a changed state
            raise ValueError(f"the replicated state's snapshot {why}")
        try:
            machine = StateMachine.from_dict(data["machine"])
        except C.NewerFormat as e:
            self._refuse_newer(e)
        with self.lock:
            self.machine = machine


def format_gate(command: dict, floor: int) -> str:
    """Why `command` must not be proposed now ("" when it may): it is of a state format
    newer than `floor`, the newest every member applies (an upgrade in progress)."""
    fmt = C.FORMAT_OF.get(command.get("cmd"), 1)
    if fmt <= floor:
        return ""
    return (f"{command.get('cmd')} is of state format {fmt}, and a member of this cluster applies state format "
            f"{floor} at most: it is not written until every member runs an mtgpu that applies it (finish upgrading "
            "every member: mtgpu-setup upgrade on each machine, docs/INSTALL.md)")


_IN_FLUX = (FAIL_REASON.LEADER_CHANGED, FAIL_REASON.NOT_LEADER, FAIL_REASON.DISCARDED, FAIL_REASON.QUEUE_FULL)
UNKNOWN_OUTCOME = ("this member changed its Raft role while the change was in flight: it may or may not "
                   "have been recorded (look before you repeat it)")


class RaftState:
    """Durable, replicated application of commands; the API mirrors JournaledState.

    `replica` names the journal and snapshot files (STATE_DIR/cluster/raft{replica}.*):
    each reopen starts new ones, so a snapshot still being written for the old
    replica (pysyncobj forks to write them) can never be loaded by the new one."""

    def __init__(self, directory: Path, self_address: str | None, voters: list[str], secret: str,
                 on_applied=None, fast: bool = True, replica: str = "", cluster_id: str = "",
                 route=None, on_newer=None, format_floor=None) -> None:
        self.directory = Path(directory)
        self._route = route  # raft_route.py: where to connect to reach a member (None: its address)
        self._cluster_id = cluster_id
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.lock = threading.RLock()
        self._on_applied = on_applied
        self._on_newer = on_newer
        # format_floor(): the newest state format every member of the cluster applies (the
        # scheduler learns it from the members' reports; a member, from the scheduler's
        # answers). A command of a newer format is not proposed. None: this mtgpu's own.
        self.format_floor = format_floor or (lambda: C.STATE_FORMAT)
        self._secret = secret
        self._fast = fast
        self._role_lock = threading.Lock()
        self._tick_jobs: collections.deque = collections.deque()
        # A leader whose process is gone is replaced without waiting out the election timeout.
        self.hastener = ElectionHastener(lambda: getattr(self, "_sync", None), self._post)
        self._reopening = False
        self._facts: tuple | None = None  # leader_facts(): (when, leading, majority heard at, voters, term)
        self._frozen: tuple[StateMachine, int] | None = None  # (the old state, its last applied index)
        self.generation = 0  # how many times the replica reopened in another role since this start
        self.boot = secrets.token_hex(6)  # tells this start's generations from an earlier start's
        self.replica = replica
        self._pending: dict[int, object] = {}  # in-flight proposals: failed if the replica reopens
        self._pending_ids = itertools.count()
        self._pending_lock = threading.Lock()
        self._remove_stale_files()
        check_replica_files(*self._files(self.replica))  # damage refuses the start (raft_files.py)
        self._open(self_address, voters)

    def _files(self, replica: str) -> tuple[Path, Path]:
        return self.directory / f"raft{replica}.journal", self.directory / f"raft{replica}.dump"

    def _remove_stale_files(self) -> None:
        keep = {p.name for p in self._files(self.replica)}
        for path in self.directory.glob("raft*"):
            if path.name not in keep and not any(path.name.startswith(k) for k in keep):
                path.unlink(missing_ok=True)

    def _conf(self, joining: bool = False) -> SyncObjConf:
        fast, secret = self._fast, self._secret
        low, high = JOINING_ELECTION_TIMEOUTS if joining else ELECTION_TIMEOUTS
        journal, dump = self._files(self.replica)
        return SyncObjConf(
            password=raft_password(secret, self._cluster_id),
            journalFile=str(journal),
            fullDumpFile=str(dump),
            dynamicMembershipChange=True,
            # One round trip per synchronous write instead of waiting for a batch
            # (~100 ms with batching; see shared/TESTING.md).
            appendEntriesUseBatch=not fast,
            raftMinTimeout=low,
            raftMaxTimeout=high,
            # Between heartbeats the thread sleeps (raft_timers.py); a commit is sent on at once
            # (appendEntriesUseBatch off), so followers do not wait for a heartbeat to learn it.
            appendEntriesPeriod=HEARTBEAT_S,
            autoTickPeriod=IDLE_TICK_S if fast else 0.05,  # fast: work handed over wakes it
            connectionTimeout=2.0,
            connectionRetryTime=0.5,
            # A leader that lost its quorum stops believing it leads after this long.
            leaderFallbackTimeout=3.0,
            commandsWaitLeader=True,
            logCompactionMinEntries=20000,
            logCompactionMinTime=600,
            useFork=True,  # the snapshot is built and written in a forked child (SealedOnPickle)
        )

    def _open(self, self_address: str | None, voters: list[str], joining: bool = False) -> None:
        self._consumer = _ReplicatedMachine(self.lock, self._on_applied, self._on_newer)
        self.self_address = self_address
        others = [v for v in voters if v != self_address]
        transport = routed_transport(self._route, on_peer_lost=self.hastener.peer_lost)
        self._sync = TimedSyncObj(self_address, others, conf=self._conf(joining), consumers=[self._consumer],
                             transportClass=transport)
        if not stop_on_full_disk(self._sync, self.directory, log):
            log.warning("this pysyncobj's journal is not the one mtgpu knows: a full STATE_DIR disk may stop this "
                        "member without a message (pysyncobj maps its journal into memory)")
        self._sync.addOnTickCallback(self._run_tick_jobs)

    def _post(self, job) -> None:
        """Run job(sync) on pysyncobj's thread at its next tick, which this brings on."""
        self._tick_jobs.append(job)
        sync = getattr(self, "_sync", None)
        if sync is not None:
            sync.wake()

    def _run_tick_jobs(self) -> None:
        """Work that must run on pysyncobj's own thread (its transport is not thread-safe).
        Runs under pysyncobj's tick-callback lock: a job must not add or remove callbacks."""
        while self._tick_jobs:
            job = self._tick_jobs.popleft()
            try:
                job(self._sync)
            except Exception:
                log.exception("a job on the Raft thread failed")

    def next_replica(self) -> str:
        """The name the next reopen gives its files (record it before reopening)."""
        return f"-{self.boot}-{self.generation + 1}"

    def reopen(self, self_address: str | None, voters: list[str]) -> None:
        """Take the role of a voter (self_address) or of a non-voting member (None)
        with a fresh replica named next_replica(); see the module's docstring. Not from
        pysyncobj's thread."""
        with self._role_lock:
            frozen = self._frozen or (self._consumer.machine, self._sync.raftLastApplied)
            with self._pending_lock:  # no proposal slips in between this and _fail_pending
                self._reopening = True
            try:
                self._sync.destroy_synchronous()
                self._fail_pending()
                self._frozen = frozen
                self.replica = self.next_replica()
                self.generation += 1
                self._remove_stale_files()
                try:
                    self._open(self_address, voters, joining=self_address is not None)
                except Exception:
                    # Never a voter with an emptied log: a non-voting member fetches everything.
                    log.exception("the replica could not reopen in its new role; it reopens as a non-voting member")
                    self._open(None, voters)
                    raise
            finally:
                self._reopening = False
        log.info("the replica reopened as a %s; it fetches the state from the leader",
                 "voter" if self_address else "non-voting member")

    def _fail_pending(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, {}
        for callback in pending.values():
            callback(None, ReplicationError(UNKNOWN_OUTCOME, in_flux=True))

    def caught_up(self) -> bool:
        """Whether the replica serves its own state (no reopen is still catching up)."""
        frozen = self._frozen
        if frozen is None:
            return True
        if self._reopening or self._sync.raftLastApplied < frozen[1]:
            return False
        self._frozen = None
        conf = self._sync.conf
        conf.raftMinTimeout, conf.raftMaxTimeout = ELECTION_TIMEOUTS
        return True

    # ------------------------------------------------------------------ the store API
    @property
    def machine(self) -> StateMachine:
        frozen = self._frozen
        if frozen is not None and not self.caught_up():
            return frozen[0]
        return self._consumer.machine

    def applied_index(self) -> int:
        return self._sync.raftLastApplied

    def commit_index(self) -> int:
        return self._sync.raftCommitIndex

    def apply(self, command: dict, timeout_s: float = 10.0) -> dict:
        """Propose and wait. While this member reopens its replica in a new role (a member
        joined or left the voters: a moment), the command is proposed once that is over,
        within `timeout_s`, rather than refused: it had not left this member."""
        deadline = time.monotonic() + timeout_s
        while True:
            done = threading.Event()
            outcome: list = []

            def callback(result, error, done=done, outcome=outcome):
                outcome.append((result, error))
                done.set()

            self.apply_async(command, callback)
            if not done.wait(max(0.0, deadline - time.monotonic())):
                why = self.bind_problem()
                raise ReplicationError("the cluster did not commit the change in time "
                                       + (f"({why})" if why else "(no quorum reachable?)"))
            result, error = outcome[0]
            if error is None:
                return result
            if getattr(error, "proposed", True) or time.monotonic() + REOPEN_POLL_S >= deadline:
                raise error
            time.sleep(REOPEN_POLL_S)

    def apply_async(self, command: dict, callback) -> None:
        """Propose `command` without waiting; callback(result, error) runs exactly once,
        when it is committed and applied (error None) or failed (a ReplicationError)."""
        why = format_gate(command, self.format_floor())
        if why:
            callback(None, ReplicationError(why, proposed=False))
            return
        key = next(self._pending_ids)
        with self._pending_lock:
            reopening = self._reopening
            if not reopening:
                self._pending[key] = callback
                consumer = self._consumer
        if reopening:
            callback(None, ReplicationError("this member is changing its Raft role right now; try again in a moment",
                                            in_flux=True, proposed=False))
            return

        def done(result, fail_reason):
            with self._pending_lock:
                if self._pending.pop(key, None) is None:
                    return  # already failed by a reopen
            if fail_reason == FAIL_REASON.SUCCESS and result is not None:
                callback(result, None)
            elif fail_reason == FAIL_REASON.MISSING_LEADER:
                callback(None, ReplicationError("the cluster has no leader right now (an election is running, or "
                                                "this member cannot reach a majority of the voters)"))
            else:
                # LEADER_CHANGED, NOT_LEADER, DISCARDED...: the leader changed under it
                callback(None, ReplicationError(f"the cluster did not commit the change (reason {fail_reason})",
                                                in_flux=fail_reason in _IN_FLUX))

        try:
            consumer.apply_command(seal_command(command), callback=done)
        except SyncObjException as e:
            done(None, e.errorCode)
        except Exception as e:  # e.g. the replica closed under us: answer, never hang
            done(None, f"{type(e).__name__}: {e}")

    def close(self) -> None:
        with self._role_lock:
            self._sync.destroy_synchronous()
            self._fail_pending()

    # ------------------------------------------------------------------ roles
    def is_leader(self) -> bool:
        return not self._reopening and self._sync._isLeader() and self._sync.hasQuorum

    def majority_heard_age_s(self) -> float:
        """On the leader: seconds since a majority of the voters (itself counted) last
        answered it; a leader cut off from its followers sees this grow from its last
        exchange with them, before it knows it lost the lead. (Reads pysyncobj's record
        of each follower's last response; a single voter is its own majority.)"""
        now = time.monotonic()
        return max(0.0, now - self._majority_heard_at(now))

    def _majority_heard_at(self, now: float) -> float:
        """`now` and the answer on time.monotonic's clock. pysyncobj stamps answers on its
        own, CLOCK_MONOTONIC_RAW, which NTP does not slew: the two part by the clock's drift
        over the uptime (0.26 s after a day here; minutes after months on a machine whose
        crystal is off by tens of ppm), so its moments are carried over by the difference
        between the two clocks now, never compared as they are."""
        sync = self._sync
        others = list(sync.otherNodes)
        need = (len(others) + 1) // 2  # answers needed besides its own
        if need == 0:
            return now
        heard = getattr(sync, "_SyncObj__lastResponseTime", None) or {}
        times = sorted((heard.get(n, 0.0) for n in others), reverse=True)
        if not times[need - 1]:
            return 0.0  # never answered
        return times[need - 1] + (now - raft_monotonic())

    def leader_facts(self) -> tuple[bool, float, list[str], int]:
        """(whether it leads with a quorum, the monotonic moment a majority of the voters
        last answered it, the voters, the term), as of at most LEADER_FACTS_S ago: what
        the scheduler answers every member's report with, a thousand times a second at a
        thousand members. The moment is never later than the truth, so an age measured
        from it is never shorter (the members' lease stays on the safe side)."""
        now = time.monotonic()
        facts = self._facts
        if facts is None or now - facts[0] > LEADER_FACTS_S:
            facts = self._facts = (now, self.is_leader(), self._majority_heard_at(now), self.voters(), self.term())
        return facts[1], facts[2], facts[3], facts[4]

    def leader_address(self) -> str | None:
        leader = self._sync._getLeader()
        return leader.address if leader is not None else None

    def term(self) -> int:
        return self._sync.raftCurrentTerm

    def status(self) -> dict:
        st = self._sync.getStatus()
        return {k: (v.address if hasattr(v, "address") else v) for k, v in st.items()}

    def voters(self) -> list[str]:
        nodes = {n.address for n in self._sync.otherNodes}
        if self.self_address:
            nodes.add(self.self_address)
        return sorted(nodes)

    def bind_problem(self) -> str:
        """Why this member cannot bind its Raft port, or "" (raft_route.py)."""
        transport = getattr(getattr(self, "_sync", None), "_SyncObj__transport", None)
        return getattr(transport, "bind_problem", "") or ""

    def is_voter(self) -> bool:
        return self.self_address is not None

    def is_connected(self, address: str) -> bool:
        """Whether the Raft link to the voter at `address` is up."""
        return self._sync.isNodeConnected(TCPNode(address))

    def add_voter_async(self, address: str):
        """Propose `address` as a voter; returns wait(timeout_s) that raises
        ReplicationError unless the change was committed. The new voter must be told
        to reopen as one before waiting when the cluster needs its vote to commit."""
        return self._membership_async(self._sync.addNodeToCluster, address)

    def remove_voter(self, address: str, timeout_s: float = 10.0) -> None:
        self._membership_async(self._sync.removeNodeFromCluster, address)(timeout_s)

    def transfer_leadership(self, address: str) -> None:
        """Ask `address` (a caught-up voter) to take over. pysyncobj's transport is not
        thread-safe, so the request is made from its own tick thread."""
        def done(_result, error):
            if error != FAIL_REASON.SUCCESS:
                log.info("leadership transfer to %s not done now (reason %s); tried again later", address, error)

        self._post(lambda sync: sync.transferLeadership(address, callback=done))

    @staticmethod
    def _membership_async(call, address: str):
        done = threading.Event()
        outcome: list = []

        def callback(result, error):
            outcome.append(error)
            done.set()

        call(address, callback=callback)

        def wait(timeout_s: float) -> None:
            if not done.wait(timeout_s):
                raise ReplicationError(f"changing the membership of {address} did not complete in {timeout_s:g}s")
            if outcome[0] != FAIL_REASON.SUCCESS:
                raise ReplicationError(f"changing the membership of {address} failed (reason {outcome[0]})")

        return wait

"""Cluster mode: the same state machine, replicated with Raft through pysyncobj.

This is the only module that imports pysyncobj. Exactly one replicated method
exists, `apply_command` (pysyncobj also aliases it `apply_command_v0`): pysyncobj numbers
replicated methods by their sorted names, so adding a method would renumber the
entries of existing journals. New behaviour arrives as new *command names*
inside the payload (state.commands), never as new methods.

Traffic between members is encrypted and authenticated by pysyncobj's password,
derived from the cluster secret: a machine without the secret can neither join
nor read nor write. Voters take part in elections and commits; further members
run as non-voting (read-only) replicas that still receive every entry.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.syncobj import SyncObjException

from .machine import StateMachine

log = logging.getLogger(__name__)


class ReplicationError(Exception):
    """A command could not be committed (no leader, no quorum, timeout)."""


def raft_password(secret: str) -> str:
    """The pysyncobj password: a key derived from the cluster secret, never the secret itself."""
    return hashlib.sha256(b"mtgpu-raft-v1\0" + secret.encode()).hexdigest()


class _ReplicatedMachine(SyncObjConsumer):
    """The state machine as a pysyncobj consumer, with an explicit snapshot format."""

    def __init__(self, lock: threading.RLock, on_applied=None) -> None:
        super().__init__()
        self.machine = StateMachine()
        self.lock = lock
        self.on_applied = on_applied

    @replicated
    def apply_command(self, command: dict) -> dict:
        with self.lock:
            result = self.machine.apply(command)
        if self.on_applied is not None:
            try:
                self.on_applied(command, result)
            except Exception:  # a listener must never break replication
                log.exception("state listener failed")
        return result

    def _serialize(self):
        with self.lock:
            return {"format": "mtgpu-state-v1", "machine": self.machine.to_dict()}

    def _deserialize(self, data):
        with self.lock:
            self.machine = StateMachine.from_dict(data["machine"])


class RaftState:
    """Durable, replicated application of commands; the API mirrors JournaledState."""

    def __init__(self, directory: Path, self_address: str | None, voters: list[str], secret: str,
                 on_applied=None, fast: bool = True) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.lock = threading.RLock()
        self._on_applied = on_applied
        self._secret = secret
        self._fast = fast
        self._open(self_address, voters)

    def _conf(self) -> SyncObjConf:
        fast, secret = self._fast, self._secret
        return SyncObjConf(
            password=raft_password(secret),
            journalFile=str(self.directory / "raft.journal"),
            fullDumpFile=str(self.directory / "raft.dump"),
            dynamicMembershipChange=True,
            # One round trip per synchronous write instead of waiting for a batch
            # (~100 ms with batching; see shared/TESTING.md).
            appendEntriesUseBatch=not fast,
            raftMinTimeout=0.35,
            raftMaxTimeout=0.8,
            appendEntriesPeriod=0.05,  # also how soon followers learn a commit when traffic is sparse
            connectionTimeout=2.0,
            connectionRetryTime=0.5,
            # A leader that lost its quorum stops believing it leads after this long.
            leaderFallbackTimeout=3.0,
            commandsWaitLeader=True,
            logCompactionMinEntries=20000,
            logCompactionMinTime=600,
        )

    def _open(self, self_address: str | None, voters: list[str]) -> None:
        self._consumer = _ReplicatedMachine(self.lock, self._on_applied)
        self.self_address = self_address
        others = [v for v in voters if v != self_address]
        self._sync = SyncObj(self_address, others, conf=self._conf(), consumers=[self._consumer])

    # ------------------------------------------------------------------ the store API
    @property
    def machine(self) -> StateMachine:
        return self._consumer.machine

    def apply(self, command: dict, timeout_s: float = 10.0) -> dict:
        try:
            result = self._consumer.apply_command(command, sync=True, timeout=timeout_s)
        except SyncObjException as e:
            code = e.errorCode
            if code == "Timeout":
                raise ReplicationError("the cluster did not commit the change in time (no quorum reachable?)") from None
            if code == FAIL_REASON.MISSING_LEADER:
                raise ReplicationError("the cluster has no leader right now (an election is running, or this "
                                       "member cannot reach a majority of the voters)") from None
            raise ReplicationError(f"the cluster refused the change (reason {code})") from None
        if result is None:
            raise ReplicationError("the change was not applied")
        return result

    def apply_async(self, command: dict, callback) -> None:
        """Propose `command` without waiting; callback(result, error) runs once it is
        committed and applied (error is a ReplicationError, or None)."""

        def done(result, fail_reason):
            if fail_reason == FAIL_REASON.SUCCESS and result is not None:
                callback(result, None)
            else:
                callback(None, ReplicationError(f"the cluster did not commit the change (reason {fail_reason})"))

        self._consumer.apply_command(command, callback=done)

    def close(self) -> None:
        self._sync.destroy()

    # ------------------------------------------------------------------ roles
    def is_leader(self) -> bool:
        return self._sync._isLeader() and self._sync.hasQuorum

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

    def is_voter(self) -> bool:
        return self.self_address is not None

    def add_voter(self, address: str, timeout_s: float = 10.0) -> None:
        self._wait_membership(self._sync.addNodeToCluster, address, timeout_s)

    def remove_voter(self, address: str, timeout_s: float = 10.0) -> None:
        self._wait_membership(self._sync.removeNodeFromCluster, address, timeout_s)

    def transfer_leadership(self, address: str) -> None:
        """Ask `address` (a caught-up voter) to take over. pysyncobj's transport is not
        thread-safe, so the request is made from its own tick thread."""
        sync = self._sync

        def done(_result, error):
            if error != FAIL_REASON.SUCCESS:
                log.info("leadership transfer to %s not done now (reason %s); tried again later", address, error)

        def on_tick():
            sync.removeOnTickCallback(on_tick)
            sync.transferLeadership(address, callback=done)

        sync.addOnTickCallback(on_tick)

    @staticmethod
    def _wait_membership(call, address: str, timeout_s: float) -> None:
        done = threading.Event()
        outcome: list = []

        def callback(result, error):
            outcome.append(error)
            done.set()

        call(address, callback=callback)
        if not done.wait(timeout_s):
            raise ReplicationError(f"changing the membership of {address} did not complete in {timeout_s:g}s")
        if outcome[0] != FAIL_REASON.SUCCESS:
            raise ReplicationError(f"changing the membership of {address} failed (reason {outcome[0]})")

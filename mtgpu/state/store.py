"""The seam between the services and the durable state.

Two stores keep the one state machine: `journal.JournaledState` (standalone: an
fsync'd journal) and `raft.RaftState` (cluster: replicated with pysyncobj). Both
implement `Store`, and every change goes through `commit` (or `try_commit` in the
loops that simply try again on their next pass).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Protocol

from . import commands as C
from .machine import StateMachine

log = logging.getLogger(__name__)


class ReplicationError(Exception):
    """A command could not be recorded: no leader, no quorum, a timeout, or a disk error.
    `in_flux`: the cluster was changing leader or this member its role; the same command
    (keyed or idempotent) may be proposed again at once. `proposed`: False when it never
    left this member (any command may then be proposed again)."""

    def __init__(self, message: str, in_flux: bool = False, proposed: bool = True) -> None:
        super().__init__(message)
        self.in_flux = in_flux
        self.proposed = proposed


class Store(Protocol):
    """Durable, serialized application of commands to the state machine."""

    lock: threading.RLock  # held while reading several things of `machine` that must agree

    @property
    def machine(self) -> StateMachine: ...

    def apply(self, command: dict) -> dict:
        """Apply `command` once it is durable (and, in a cluster, committed); the machine's
        answer. Raises ReplicationError when it could not be recorded."""
        ...

    def apply_async(self, command: dict, callback: Callable[[dict | None, Exception | None], None]) -> None:
        """The same without waiting: callback(answer, None) or callback(None, error), once."""
        ...

    def is_leader(self) -> bool:
        """Whether this member schedules (always true for a standalone node)."""
        ...

    def term(self) -> int: ...

    def close(self) -> None: ...


def commit(store: Store, cmd_name: str, /, **args) -> dict:
    """Apply one command; the state machine's answer ({"ok": True, ...} or {"ok": False,
    "error": ...}). Raises ReplicationError when the change could not be recorded."""
    try:
        return store.apply(C.command(cmd_name, **args))
    except ReplicationError:
        raise
    except OSError as e:  # the journal's disk
        raise ReplicationError(f"the state could not be written: {e}") from e


def try_commit(store: Store, cmd_name: str, /, **args) -> dict | None:
    """`commit` for loops that try again on their next pass: None (and a warning) when
    the change could not be recorded now."""
    try:
        return commit(store, cmd_name, **args)
    except ReplicationError as e:
        what = f" for job {args['job_id']}" if "job_id" in args else ""
        log.warning("could not commit %s%s: %s", cmd_name, what, e)
        return None

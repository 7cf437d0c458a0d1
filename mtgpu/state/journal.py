"""Standalone persistence: an append-only journal of commands plus snapshots.

A command is acknowledged only after its journal line is written and fsync'd,
so `kill -9` (or a power cut) at any moment loses no accepted command. On start
the newest snapshot is loaded and the journal lines after it are replayed. A
torn last line (the process died mid-write, before the fsync returned, so its
command was never acknowledged) is dropped and the file truncated there.

Layout in STATE_DIR/state/: `snapshot.json` (the machine at sequence N, written
to a temporary file, fsync'd, renamed) and `journal.jsonl` (commands N+1...).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from .machine import StateMachine

log = logging.getLogger(__name__)

SNAPSHOT_EVERY = 5000


class JournalCorrupt(Exception):
    """A journal line in the middle of the file cannot be read."""


class JournaledState:
    """The state machine with durable, serialized application of commands."""

    def __init__(self, directory: Path, snapshot_every: int = SNAPSHOT_EVERY) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.snapshot_path = self.directory / "snapshot.json"
        self.journal_path = self.directory / "journal.jsonl"
        self.snapshot_every = snapshot_every
        self.lock = threading.RLock()
        self.machine = self._load()
        self._journal = open(self.journal_path, "ab", buffering=0)
        self._since_snapshot = 0

    # ------------------------------------------------------------------ load
    def _load(self) -> StateMachine:
        if self.snapshot_path.exists():
            with open(self.snapshot_path, "rb") as f:
                machine = StateMachine.from_dict(json.load(f))
        else:
            machine = StateMachine()
        if not self.journal_path.exists():
            return machine
        good_end = 0
        replayed = 0
        with open(self.journal_path, "rb") as f:
            data = f.read()
        pos = 0
        while pos < len(data):
            nl = data.find(b"\n", pos)
            if nl < 0:
                log.warning("journal %s: dropping a torn last line (%d bytes) never acknowledged",
                            self.journal_path, len(data) - pos)
                break
            line = data[pos:nl]
            try:
                entry = json.loads(line)
            except ValueError:
                if nl + 1 >= len(data):
                    log.warning("journal %s: dropping an unreadable last line", self.journal_path)
                    break
                raise JournalCorrupt(f"{self.journal_path}: unreadable line at byte {pos}") from None
            seq = entry["seq"]
            if seq > machine.applied:
                if seq != machine.applied + 1:
                    raise JournalCorrupt(f"{self.journal_path}: sequence jumps from {machine.applied} to {seq}")
                machine.apply(entry["command"])
                replayed += 1
            pos = nl + 1
            good_end = pos
        if good_end < len(data):
            with open(self.journal_path, "r+b") as f:
                f.truncate(good_end)
        log.info("state loaded: %d jobs, %d journal entries replayed", len(machine.jobs), replayed)
        return machine

    # ------------------------------------------------------------------ apply
    def apply(self, command: dict) -> dict:
        """Apply `command` and make it durable before returning its result.

        Rejected commands are journaled too: replay must see the same sequence."""
        line = None
        with self.lock:
            seq = self.machine.applied + 1
            line = json.dumps({"seq": seq, "command": command}, separators=(",", ":")).encode() + b"\n"
            self._journal.write(line)
            os.fsync(self._journal.fileno())
            result = self.machine.apply(command)
            self._since_snapshot += 1
            if self._since_snapshot >= self.snapshot_every:
                self.snapshot()
        return result

    def apply_async(self, command: dict, callback) -> None:
        """The same contract as RaftState.apply_async (here it completes at once)."""
        try:
            result = self.apply(command)
        except OSError as e:
            callback(None, e)
            return
        callback(result, None)

    def snapshot(self) -> None:
        """Write the machine to snapshot.json and start an empty journal."""
        with self.lock:
            tmp = self.snapshot_path.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                f.write(json.dumps(self.machine.to_dict(), separators=(",", ":")).encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.snapshot_path)
            _fsync_dir(self.directory)
            self._journal.close()
            # The snapshot holds every entry; an empty journal follows it.
            self._journal = open(self.journal_path, "wb", buffering=0)
            os.fsync(self._journal.fileno())
            self._since_snapshot = 0

    def close(self) -> None:
        with self.lock:
            self._journal.close()

    # A standalone node is its own, only, permanent scheduler.
    def is_leader(self) -> bool:
        return True

    def term(self) -> int:
        return 1


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

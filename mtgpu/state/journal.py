"""Standalone persistence: an append-only journal of commands plus snapshots.

A command is acknowledged only after its journal line is written and fsync'd,
so `kill -9` (or a power cut) at any moment loses no accepted command. On start
the newest snapshot is loaded and the journal lines after it are replayed. A
torn last line (the process died mid-write, before the fsync returned, so its
command was never acknowledged) is dropped and the file truncated there.

Layout in STATE_DIR/state/: `snapshot.json` (the machine at sequence N, written
to a temporary file, fsync'd, renamed) and `journal.jsonl` (commands N+1...).

Every line and the snapshot carry a checksum of their exact bytes (state/checksums.py),
checked at start: a changed byte stops the start naming the file, the entry and the fix,
and is never replayed. Lines and a snapshot an older version wrote (no checksum) are
read once and rewritten at once as a checksummed snapshot.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import threading
from pathlib import Path

from .checksums import ChecksumMismatch, is_legacy_line, open_json, seal_json
from .commands import NewerFormat
from .machine import StateMachine

log = logging.getLogger(__name__)

SNAPSHOT_EVERY = 5000


class JournalCorrupt(Exception):
    """The snapshot or a journal line in the middle of the file cannot be read: the node
    refuses to start (acknowledged commands after it would be lost), naming the file,
    where, and the fix."""


class StateWriteError(OSError):
    """A command could not be made durable (the disk is full, or failing): it was not
    applied, and the journal is as it was before it."""


class JournaledState:
    """The state machine with durable, serialized application of commands."""

    def __init__(self, directory: Path, snapshot_every: int = SNAPSHOT_EVERY) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.snapshot_path = self.directory / "snapshot.json"
        self.journal_path = self.directory / "journal.jsonl"
        self.snapshot_every = snapshot_every
        self.lock = threading.RLock()
        self._legacy_read = False  # a snapshot or lines without checksums were read
        self.machine = self._load()
        self._journal = open(self.journal_path, "ab", buffering=0)
        self._since_snapshot = 0
        if self._legacy_read:
            # Written by a version before checksums: rewritten at once as a checksummed
            # snapshot, so no entry without a checksum is ever read again.
            self.snapshot()
            log.info("state %s: entries written without checksums were read once and rewritten with them",
                     self.directory)

    # ------------------------------------------------------------------ load
    def _load(self) -> StateMachine:
        sealed_snapshot = False
        if self.snapshot_path.exists():
            try:
                with open(self.snapshot_path, "rb") as f:
                    body, sealed_snapshot = open_json(f.read())
                machine = StateMachine.from_dict(json.loads(body))
            except NewerFormat as e:
                raise JournalCorrupt(f"{self.snapshot_path}: {e}") from None
            except ChecksumMismatch as e:
                raise JournalCorrupt(
                    f"the snapshot {self.snapshot_path} is damaged: {e} (changed on disk since it was written). "
                    + self._snapshot_fix()) from None
            except (ValueError, KeyError, TypeError) as e:
                raise JournalCorrupt(
                    f"the snapshot {self.snapshot_path} cannot be read ({type(e).__name__}: {str(e)[:200]}). "
                    + self._snapshot_fix()) from None
            self._legacy_read = not sealed_snapshot
        else:
            machine = StateMachine()
        if not self.journal_path.exists():
            return machine
        good_end = 0
        replayed = 0
        with open(self.journal_path, "rb") as f:
            data = f.read()
        pos = 0
        lineno = 0
        mended = False  # the last entry's line end was written back
        sealed_seen = sealed_snapshot  # after a checksummed entry, every entry has one
        while pos < len(data):
            nl = data.find(b"\n", pos)
            if nl < 0:
                whole = _whole_entry(data[pos:])
                if whole is None:
                    log.warning("journal %s: dropping a torn last line (%d bytes) never acknowledged",
                                self.journal_path, len(data) - pos)
                    break
                # A whole entry (its checksum matches) whose line end is missing or changed: a
                # flipped bit, not a torn write. Kept, and its line end written back below.
                log.warning("journal %s: the last entry's line end was lost or changed; the entry is whole (its "
                            "checksum matches) and kept", self.journal_path)
                data = data[:pos] + whole + b"\n"
                nl = len(data) - 1
                mended = True
            lineno += 1
            line = data[pos:nl]
            try:
                body, sealed = open_json(line)
            except ChecksumMismatch as e:
                changed = f"{self._which(line)} that was changed on disk since it was written ({e})"
                raise JournalCorrupt(self._cut_here(pos, len(data), lineno, changed)) from None
            try:
                entry = json.loads(body)
            except ValueError:
                if not sealed and nl + 1 >= len(data):
                    log.warning("journal %s: dropping an unreadable last line", self.journal_path)
                    break
                raise JournalCorrupt(self._cut_here(pos, len(data), lineno, "an unreadable line")) from None
            seq = entry.get("seq") if isinstance(entry, dict) else None
            if not isinstance(seq, int) or not isinstance(entry.get("command"), dict):
                raise JournalCorrupt(self._cut_here(pos, len(data), lineno, "a line that is not a journal entry"))
            if seq > machine.applied:
                if seq != machine.applied + 1:
                    jump = f"a sequence jump from {machine.applied} to {seq}"
                    raise JournalCorrupt(self._cut_here(pos, len(data), lineno, jump))
                if not sealed:
                    if sealed_seen or not is_legacy_line(line):
                        bare = f"{self._which(line)} without a checksum where every entry has one (its checksum lost?)"
                        raise JournalCorrupt(self._cut_here(pos, len(data), lineno, bare))
                    self._legacy_read = True
                try:
                    machine.apply(entry["command"])
                except NewerFormat as e:
                    raise JournalCorrupt(f"the journal {self.journal_path}, {self._which(line)} at line {lineno}: {e}; "
                                         "nothing of it or after it was applied") from None
                replayed += 1
            sealed_seen = sealed_seen or sealed
            pos = nl + 1
            good_end = pos
        if good_end < len(data):
            with open(self.journal_path, "r+b") as f:
                f.truncate(good_end)
        elif mended:
            with open(self.journal_path, "r+b") as f:
                f.truncate(good_end - 1)
                f.seek(good_end - 1)
                f.write(b"\n")
                os.fsync(f.fileno())
        log.info("state loaded: %d jobs, %d journal entries replayed", len(machine.jobs), replayed)
        return machine

    @staticmethod
    def _which(line: bytes) -> str:
        """'entry 12 (job.submit.v1)': as much of a damaged line as can be read."""
        seq = re.search(rb'"seq":(\d+)', line)
        name = re.search(rb'"cmd":"([A-Za-z0-9._-]{1,64})"', line)
        return ((f"entry {int(seq.group(1))}" if seq else "an entry")
                + (f" ({name.group(1).decode()})" if name else ""))

    def _snapshot_fix(self) -> str:
        return ("It holds every job and tenant up to its sequence, so the node does not start without it: restore "
                f"{self.snapshot_path} (or all of {self.directory}) from a backup, or, to start with an empty state "
                f"(every job and tenant record lost), move {self.directory} away")

    def _cut_here(self, pos: int, size: int, lineno: int, what: str) -> str:
        return (f"the journal {self.journal_path} has {what} at byte {pos} of {size} (line {lineno}): the commands "
                "from there on were acknowledged and cannot be replayed safely, so the node does not start. To start "
                f"from what is intact (the changes from byte {pos} on are lost: check the jobs submitted since), cut it "
                f"there: truncate -s {pos} {self.journal_path}; or restore {self.directory} from a backup")

    # ------------------------------------------------------------------ apply
    def apply(self, command: dict) -> dict:
        """Apply `command` and make it durable before returning its result.

        Rejected commands are journaled too: replay must see the same sequence."""
        with self.lock:
            seq = self.machine.applied + 1
            line = seal_json(json.dumps({"seq": seq, "command": command}, separators=(",", ":")).encode()) + b"\n"
            end = self._journal.tell()
            try:
                written = self._journal.write(line)
                if written != len(line):
                    raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (a short write)")
                os.fsync(self._journal.fileno())
            except OSError as e:
                self._undo_to(end)
                raise StateWriteError(e.errno, f"the command was not recorded: writing the journal "
                                               f"{self.journal_path} failed ({e.strerror or e}); free space in "
                                               f"{self.directory.parent} (STATE_DIR) or fix the disk, then retry") from None
            result = self.machine.apply(command)
            self._since_snapshot += 1
            if self._since_snapshot >= self.snapshot_every:
                self.snapshot()
        return result

    def _undo_to(self, end: int) -> None:
        """Cut what a failed write left after `end`, so no torn line sits mid-journal."""
        try:
            self._journal.truncate(end)
            self._journal.seek(end)
            os.fsync(self._journal.fileno())
        except OSError as e:
            log.error("journal %s: could not cut a failed write back to byte %d: %s", self.journal_path, end, e)

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
                f.write(seal_json(json.dumps(self.machine.to_dict(), separators=(",", ":")).encode()))
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


def _whole_entry(tail: bytes) -> bytes | None:
    """The checksummed entry a last line without its line end holds (the line end lost, or
    its byte changed), or None: a torn write, never acknowledged, cannot end in a whole
    checksummed entry."""
    for line in (tail, tail[:-1]):
        try:
            body, sealed = open_json(line)
            if sealed and isinstance(json.loads(body), dict):
                return line
        except ValueError:  # ChecksumMismatch too
            continue
    return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

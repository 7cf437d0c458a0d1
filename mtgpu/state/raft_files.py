"""A cluster member's own copy of the replicated state, checked before pysyncobj opens it.

pysyncobj keeps three files per replica (STATE_DIR/cluster/raft*.journal, its .meta and
the .dump snapshot) and reads them without asking whether they are whole: a truncated
journal stops the start with a bare struct.error, and a damaged snapshot is skipped
with a logged exception, after which the member runs on as if the state were empty (a
lone member would even schedule from it). So the node reads them first, entry by
entry, and refuses to start on damage, naming the file, what is wrong and the fix:
move that replica's files aside and start again, and the member fetches the state from
the other members (the cluster holds every committed entry on a majority of its voters,
so one member's copy is never the only one).

The layouts read here are pysyncobj 0.3's (journal.py, serializer.py): a journal is a
40-byte header (name, version, format, end of the last record) and records of
[size][index, term, command][size]; a snapshot is a gzip'd pickle of (state, last
entry, the entry before it).

Checksums (state/checksums.py): every command mtgpu hands pysyncobj carries the CRC-32
of its JSON text, and the state in a snapshot the CRC-32 of the machine's; both are
checked here, so a changed byte in an entry (a job's script, its uid) is refused at
start instead of being replayed. A snapshot's file is read to its end, which checks
gzip's own CRC-32 of every byte of the pickle too. Entries written before checksums
(without one, and with exactly a command's fields) are accepted as they are: pysyncobj
drops them at its next log compaction, when the snapshot that replaces them is written
with a checksum. pysyncobj's own entries (no-ops, membership changes) carry none.
"""

from __future__ import annotations

import ctypes
import errno
import gzip
import logging
import os
import pickle
import struct
import sys
import zlib
from pathlib import Path

from .checksums import command_problem, state_problem
from .journal import JournalCorrupt

_NAME = b"PYSYNCOBJ"
_HEADER = 24 + 8 + 4 + 4
_COMMAND_TYPES = {0, 1, 2, 3}  # regular, no-op, membership, version
# pysyncobj's number for raft.py's one replicated method (it numbers them from 0 by
# version and name); a regular entry with another number would call nothing of ours.
METHOD_ID = 0


def _refuse(path: Path, what: str, replica_files: list[Path]) -> JournalCorrupt:
    names = " ".join(str(p) for p in replica_files)
    return JournalCorrupt(
        f"this member's copy of the cluster state is damaged: {path} {what}. Its entries cannot be trusted, so "
        f"the member does not start on them. Fix: move this replica's files aside (mkdir -p {path.parent}/damaged "
        f"&& mv {names} {path.parent}/damaged/) and start again: the member then fetches the state from the "
        "other members, which hold every committed entry (one member at a time, with the others up: until it has "
        f"fetched the state, theirs are the only copies; on a cluster of one member, restore {path.parent} from a "
        "backup instead: its state is nowhere else)")


def check_replica_files(journal: Path, dump: Path) -> None:
    """Raise JournalCorrupt when the journal, its .meta or the snapshot of a replica is
    damaged; files that do not exist yet are fine (a new replica)."""
    meta = Path(str(journal) + ".meta")
    present = [p for p in (journal, meta, dump) if p.exists()]
    if journal.exists():
        why = _journal_problem(journal.read_bytes())
        if why:
            raise _refuse(journal, why, present)
    if meta.exists():
        why = _meta_problem(meta.read_bytes())
        if why:
            raise _refuse(meta, why, present)
    if dump.exists():
        why = _dump_problem(dump)
        if why:
            raise _refuse(dump, why, present)


def _journal_problem(data: bytes) -> str | None:
    if len(data) < _HEADER:
        return f"is {len(data)} bytes long, shorter than a journal's {_HEADER}-byte header"
    if data[:24].rstrip(b"\0") != _NAME:
        return "does not start with a pysyncobj journal header"
    fmt, end = struct.unpack("<II", data[32:40])
    if fmt != 1:
        return f"has journal format {fmt}, not 1"
    if not _HEADER <= end <= len(data):
        return f"says its records end at byte {end}, outside its {len(data)} bytes (cut short?)"
    at, previous = _HEADER, None
    while at < end:
        if at + 4 > end:
            return f"has a record cut short at byte {at}"
        (size,) = struct.unpack("<I", data[at:at + 4])
        if size < 17 or at + 8 + size > end:
            return f"has a record of {size} bytes at byte {at} that does not fit before the end ({end})"
        (trailer,) = struct.unpack("<I", data[at + 4 + size:at + 8 + size])
        if trailer != size:
            return f"has a record at byte {at} whose two sizes differ ({size}, {trailer})"
        index, term = struct.unpack("<QQ", data[at + 4:at + 20])
        if previous is not None and (index != previous[0] + 1 or term < previous[1]):
            return (f"has entry {index} (term {term}) at byte {at} after entry {previous[0]} (term {previous[1]}): "
                    "entries must follow one another")
        command = data[at + 20:at + 4 + size]
        if command[0] not in _COMMAND_TYPES:
            return f"has entry {index} at byte {at} of an unknown kind ({command[0]})"
        if command[0] != 1:  # every kind but the no-op carries a pickled body
            try:
                body = pickle.loads(command[1:])
            except Exception as e:  # noqa: BLE001 - any failure to read it is damage
                return f"has entry {index} at byte {at} that cannot be read ({type(e).__name__})"
            if command[0] == 0:  # a regular entry: (method id, (mtgpu's command,))
                why = _regular_problem(body)
                if why:
                    return f"has entry {index}{_command_name(body)} at byte {at} {why}: it was changed on disk"
        previous = (index, term)
        at += size + 8
    return None


def _regular_problem(body: object) -> str | None:
    if not (isinstance(body, tuple) and len(body) == 2 and body[0] == METHOD_ID
            and isinstance(body[1], tuple) and len(body[1]) == 1):
        return "that is not a call of the state machine's one replicated method"
    return command_problem(body[1][0])


def _command_name(body: object) -> str:
    """' (job.submit.v1)': the damaged entry's command name where it can be read."""
    try:
        name = body[1][0]["cmd"]  # type: ignore[index]
    except (TypeError, KeyError, IndexError):
        return ""
    return f" ({name[:64]})" if isinstance(name, str) else ""


def _meta_problem(data: bytes) -> str | None:
    """pysyncobj ignores a .meta it cannot read, and with it the vote this member cast in
    the current term (Raft needs it: without it the member could vote twice in a term)."""
    try:
        meta = pickle.loads(data)
    except Exception as e:  # noqa: BLE001
        return f"cannot be read ({type(e).__name__}): it holds this member's current term and vote"
    if not isinstance(meta, dict):
        return "does not hold the term and vote a .meta file holds"
    return None


def _dump_problem(path: Path) -> str | None:
    try:
        with open(path, "rb") as f, gzip.GzipFile(fileobj=f) as g:
            raw = g.read()  # to the end: gzip checks its CRC-32 of every byte there
        data = pickle.loads(raw)
    except (OSError, EOFError, zlib.error, pickle.UnpicklingError, ValueError, struct.error) as e:
        return f"(the snapshot) cannot be read ({type(e).__name__}: {str(e)[:120]})"
    except Exception as e:  # noqa: BLE001 - pickle raises many kinds on damaged input
        return f"(the snapshot) cannot be read ({type(e).__name__})"
    if not (isinstance(data, tuple) and len(data) >= 3 and all(isinstance(x, tuple) and len(x) == 3
                                                               for x in data[1:3])):
        return "(the snapshot) does not hold a pysyncobj snapshot"
    states = data[0][1:] if isinstance(data[0], list) else []  # [pysyncobj's own, then each consumer's]
    if not states:
        return "(the snapshot) does not hold mtgpu's state"
    for state in states:
        why = state_problem(state)
        if why:
            return f"(the snapshot) {why}: it was changed on disk"
    return None


# ---------------------------------------------------------------- a full disk
_FALLOC_FL_KEEP_SIZE = 1
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)


def reserve(fd: int, offset: int, length: int) -> None:
    """Give the file's bytes [offset, offset + length) blocks on disk without changing its
    size (pysyncobj's mmap takes the file's size for its own); OSError when the disk
    has no room. posix_fallocate cannot: it grows the file."""
    if _libc.fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS)


def stop_for_disk(what: str, directory: Path, e: OSError, log, state_dir: Path | None = None) -> None:
    """Stop this member at once with one line that names the write, the disk and the fix
    (a member that cannot write STATE_DIR can neither keep its journal nor its jobs'
    lease: the other members hold the state and take its jobs over)."""
    line = (f"mtgpu-server: stopped: {what} in {directory} failed ({e.strerror or e}); the member stops before "
            "it writes anything torn (its journal is whole up to its last entry, the other members hold the "
            f"state). Free space on the disk of STATE_DIR ({state_dir or directory.parent}), then start this member again")
    log.critical("%s", line)
    for handler in list(log.handlers) + list(getattr(log.parent, "handlers", [])) + list(log.root.handlers):
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - nothing may stop the exit
            pass
    if not logging.getLogger().handlers:  # else the log line above already went there
        print(line, file=sys.stderr, flush=True)
    os._exit(2)


def stop_on_full_disk(sync, directory: Path, log) -> bool:
    """Make the replica's journal and .meta writes fail cleanly on a full (or failing)
    STATE_DIR disk: pysyncobj maps the journal into memory, so a write into a page the
    disk has no room for kills the process with SIGBUS, without a word, and a .meta it
    cannot write is logged and forgotten (the member's vote with it). Each journal write
    now first reserves its bytes on disk (posix_fallocate); when that, or a .meta write,
    fails, the member stops at once with one line that says why and what to do, before
    anything torn is written: its journal stays whole up to the last entry, and it
    starts again once there is room (the others hold the state meanwhile). False when
    this pysyncobj's journal is not the one known here (nothing is changed then)."""
    journal = getattr(sync, "_SyncObj__raftLog", None)
    rfile = getattr(journal, "_FileJournal__journalFile", None)
    storer = getattr(journal, "_FileJournal__metaStorer", None)
    if rfile is None or storer is None or not hasattr(rfile, "_ResizableFile__f"):
        return False

    def stop(what: str, e: OSError) -> None:
        stop_for_disk(what, directory, e, log)

    write = rfile.write

    def reserved_write(offset, values):
        try:
            reserve(rfile._ResizableFile__f.fileno(), offset, len(values))
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.ENOSYS):  # a filesystem that cannot: written as before
                stop("writing a Raft journal entry", e)
        write(offset, values)

    store_meta = storer.storeMeta

    def checked_store_meta(meta):
        try:
            store_meta(meta)
        except OSError as e:
            stop("recording the term and vote (.meta)", e)

    rfile.write = reserved_write
    storer.storeMeta = checked_store_meta
    return True

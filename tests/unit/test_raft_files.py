"""A cluster member's replica files (state/raft_files.py): whole ones pass, and every kind
of damage pysyncobj would crash on or silently skip is refused naming the file and the fix."""

from __future__ import annotations

import gzip
import pickle
import socket
from pathlib import Path

import pytest
from pysyncobj.journal import FileJournal, MetaStorer

from mtgpu.state.journal import JournalCorrupt
from mtgpu.state.raft import RaftState
from mtgpu.state.raft_files import check_replica_files


def _regular(payload) -> bytes:
    return b"\x00" + pickle.dumps(payload)


@pytest.fixture()
def replica(tmp_path: Path) -> tuple[Path, Path]:
    """A journal of four entries (a no-op, then three commands), its .meta, a snapshot."""
    journal, dump = tmp_path / "raft.journal", tmp_path / "raft.dump"
    j = FileJournal(str(journal))
    j.add(b"\x01", 1, 1)
    for i in range(2, 5):
        j.add(_regular({"cmd": "node.register.v1", "args": {"name": f"n{i}"}}), i, 1 + i // 4)
    j._destroy()
    MetaStorer(str(journal) + ".meta").storeMeta({"currentTerm": 2, "votedForNodeId": "127.0.0.1:1"})
    with gzip.open(dump, "wb") as g:
        pickle.dump(({"state": 1}, (b"\x01", 4, 2), (b"\x01", 3, 1)), g)
    return journal, dump


def _refusal(journal: Path, dump: Path) -> str:
    with pytest.raises(JournalCorrupt) as e:
        check_replica_files(journal, dump)
    return str(e.value)


def test_whole_files_and_a_new_replica_pass(replica, tmp_path):
    check_replica_files(*replica)
    check_replica_files(tmp_path / "none.journal", tmp_path / "none.dump")


@pytest.mark.parametrize("damage, says", [
    (lambda d: d[:300] if len(d) > 300 else d[:60], "outside its"),
    (lambda d: b"", "0 bytes long"),
    (lambda d: b"X" * 12 + d[12:], "does not start with a pysyncobj journal header"),
    (lambda d: d[:40] + b"\xff\xff\x00\x00" + d[44:], "does not fit"),
])
def test_a_damaged_journal_is_refused_naming_it_and_the_fix(replica, damage, says):
    journal, dump = replica
    journal.write_bytes(damage(journal.read_bytes()))
    why = _refusal(journal, dump)
    assert str(journal) in why and says in why, why
    assert f"mv {journal} {journal}.meta {dump} {journal.parent}/damaged/" in why and "start again" in why


def test_an_unreadable_entry_and_entries_out_of_order_are_refused(replica):
    journal, dump = replica
    whole = journal.read_bytes()
    second = 40 + 4 + 17 + 4  # the no-op record: its two sizes around index, term and one byte
    data = bytearray(whole)
    data[second + 4 + 16 + 2:second + 4 + 16 + 12] = b"\x07" * 10  # inside its pickled command
    journal.write_bytes(bytes(data))
    why = _refusal(journal, dump)
    assert "entry 2" in why and "cannot be read" in why, why
    data = bytearray(whole)
    data[second + 4:second + 12] = (7).to_bytes(8, "little")  # entry 7 right after entry 1
    journal.write_bytes(bytes(data))
    assert "has entry 7 (term 1)" in _refusal(journal, dump) and "must follow one another" in _refusal(journal, dump)


def test_a_meta_that_cannot_be_read_and_a_damaged_snapshot_are_refused(replica):
    journal, dump = replica
    meta = Path(str(journal) + ".meta")
    good_meta = meta.read_bytes()
    meta.write_bytes(good_meta[:10])
    assert "current term and vote" in _refusal(journal, dump)
    meta.write_bytes(good_meta)
    whole = dump.read_bytes()
    for damaged in (whole[:20], b"", whole[:12] + bytes(40) + whole[52:]):
        dump.write_bytes(damaged)
        why = _refusal(journal, dump)
        assert str(dump) in why and "the snapshot" in why, why


def test_the_replicated_state_refuses_to_open_damaged_files(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
    (tmp_path / "raft.journal").write_bytes(b"PYSYNCOBJ")
    with pytest.raises(JournalCorrupt, match="raft.journal is 9 bytes long"):
        RaftState(tmp_path, address, [address], "x" * 40)

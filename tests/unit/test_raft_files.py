"""A cluster member's replica files (state/raft_files.py): whole ones pass, and every kind
of damage pysyncobj would crash on or silently skip is refused naming the file and the fix."""

from __future__ import annotations

import gzip
import pickle
import socket
import struct
import time
from pathlib import Path

import pytest
from pysyncobj.journal import FileJournal, MetaStorer

from mtgpu.model.job import JobSpec
from mtgpu.state import commands as C
from mtgpu.state.checksums import seal_command, seal_state
from mtgpu.state.journal import JournalCorrupt
from mtgpu.state.raft import RaftState
from mtgpu.state.raft_files import METHOD_ID, check_replica_files


def _regular(command: dict) -> bytes:
    """A regular entry as pysyncobj writes mtgpu's one replicated call: (method id, (command,))."""
    return b"\x00" + pickle.dumps((0, (command,)), protocol=2)


def _state(machine: dict) -> list:
    """A snapshot's state part as pysyncobj writes it: its own fields, then mtgpu's."""
    return [{}, seal_state({"format": "mtgpu-state-v1", "machine": machine})]


@pytest.fixture()
def replica(tmp_path: Path) -> tuple[Path, Path]:
    """A journal of four entries (a no-op, then three checksummed commands), its .meta, a snapshot."""
    journal, dump = tmp_path / "raft.journal", tmp_path / "raft.dump"
    j = FileJournal(str(journal))
    j.add(b"\x01", 1, 1)
    for i in range(2, 5):
        j.add(_regular(seal_command({"cmd": "node.register.v1", "args": {"name": f"n{i}"}})), i, 1 + i // 4)
    j._destroy()
    MetaStorer(str(journal) + ".meta").storeMeta({"currentTerm": 2, "votedForNodeId": "127.0.0.1:1"})
    with gzip.open(dump, "wb") as g:
        pickle.dump((_state({"applied": 4}), (b"\x01", 4, 2), (b"\x01", 3, 1)), g)
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


# ---------------------------------------------------------------- checksums (issue 23)
def test_entries_and_a_snapshot_written_before_checksums_pass(tmp_path):
    journal, dump = tmp_path / "raft.journal", tmp_path / "raft.dump"
    j = FileJournal(str(journal))
    j.add(b"\x01", 1, 1)
    j.add(_regular({"cmd": "node.register.v1", "args": {"name": "n2"}}), 2, 1)
    j._destroy()
    with gzip.open(dump, "wb") as g:
        state = [{}, {"format": "mtgpu-state-v1", "machine": {"applied": 2}}]  # no checksum
        pickle.dump((state, (b"\x01", 2, 1), (b"\x01", 1, 1)), g)
    check_replica_files(journal, dump)


@pytest.mark.parametrize("old, new, says", [
    (b"n3", b"nX", "has entry 3 (node.register.v1) at byte"),  # the command changed: its checksum no longer matches
    (b"crc", b"crb", "fields ['args', 'cmd', 'crb']"),  # its checksum's name damaged: not taken for an older entry
])
def test_a_changed_entry_is_refused_naming_it(replica, old, new, says):
    journal, dump = replica
    data = journal.read_bytes()
    at = data.index(b"node.register.v1")  # the first command's: entry 2
    at = data.index(old, at + 1) if old != b"crc" else data.index(old, data.index(b"n3") - 80)
    journal.write_bytes(data[:at] + new + data[at + len(old):])
    why = _refusal(journal, dump)
    assert says in why and "changed on disk" in why and str(journal) in why, why


def _free_address() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
    return address


def _wait(what: str, check, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        assert time.monotonic() < deadline, f"waited {timeout_s:g}s for {what}"
        time.sleep(0.05)
    return result


def _lone_replica(directory: Path, address: str) -> RaftState:
    rs = RaftState(directory, address, [address], "x" * 40)
    _wait("the lone voter to lead", rs.is_leader)
    return rs


def _submit(rs: RaftState, script: str) -> None:
    assert rs.apply(C.command(C.TENANT_ENSURE, name="alice", uid=2001, gid=2001, at=1.0))["ok"]
    assert rs.apply(C.command(C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001, spec=JobSpec(script=script).to_dict(),
                              at=2.0))["ok"]


def test_a_replica_s_changed_journal_entry_is_refused_before_it_is_replayed(tmp_path):
    """The issue's sed on a real replica's journal: the member's start is refused naming the
    entry and its command, where it used to replay the changed script."""
    address = _free_address()
    rs = _lone_replica(tmp_path, address)
    assert rs._sync._methodToID == {(id(rs._consumer), "apply_command_v0"): METHOD_ID}  # what the check expects
    _submit(rs, "echo hi 2")
    rs.close()
    journal = tmp_path / "raft.journal"
    RaftState(tmp_path, address, [address], "x" * 40).close()  # whole: it opens again
    data = journal.read_bytes()
    assert data.count(b"echo hi 2") == 1
    journal.write_bytes(data.replace(b"echo hi 2", b"echo hX 2"))
    with pytest.raises(JournalCorrupt) as e:
        RaftState(tmp_path, address, [address], "x" * 40)
    why = str(e.value)
    assert f"{journal} has entry " in why and "(job.submit.v1) at byte" in why and "changed on disk" in why, why
    assert "fetches the state from the other members" in why, why


def test_a_replica_s_snapshot_is_checksummed_read_back_whole_and_refused_changed(tmp_path):
    address = _free_address()
    rs = _lone_replica(tmp_path, address)
    _submit(rs, "echo hi 2")
    dump = tmp_path / "raft.dump"
    rs._sync.forceLogCompaction()
    _wait("pysyncobj to write its snapshot", dump.exists)
    _wait("the snapshot to be complete", lambda: not (tmp_path / "raft.dump.tmp").exists())
    rs.close()
    with gzip.open(dump, "rb") as g:
        raw = g.read()
    state = pickle.loads(raw)[0][1]
    assert state["machine_crc32"] and state["machine"]["applied"] == 2
    (tmp_path / "raft.journal").unlink()  # only the snapshot holds the job now
    again = RaftState(tmp_path, address, [address], "x" * 40)
    try:
        jobs = _wait("the snapshot to be loaded", lambda: list(again.machine.jobs.values()))
        assert [j.spec.script for j in jobs] == ["echo hi 2"]
    finally:
        again.close()
    (tmp_path / "raft.journal").unlink(missing_ok=True)
    with gzip.open(dump, "wb") as g:  # unpacked, changed and packed again: gzip's own CRC is new and whole
        g.write(raw.replace(b"echo hi 2", b"echo hX 2"))
    with pytest.raises(JournalCorrupt) as e:
        RaftState(tmp_path, address, [address], "x" * 40)
    why = str(e.value)
    assert f"{dump} (the snapshot) holds a state whose checksum" in why and "changed on disk" in why, why
    packed = dump.read_bytes()  # a byte of the packed file changed: gzip's CRC-32 sees it
    dump.write_bytes(packed[:-6] + bytes([packed[-6] ^ 0x10]) + packed[-5:])
    assert "(the snapshot) cannot be read" in _refusal(tmp_path / "raft.journal", dump)


def test_every_single_bit_flip_in_a_command_is_refused_or_changes_nothing(replica):
    """Wherever one bit of a command's pickled bytes flips, the replica is refused, or the
    command pysyncobj would apply is exactly the one written (a flip in pickle's own
    framing that changes no value): a changed command is never taken as whole, nor as
    one written before checksums."""
    journal, dump = replica
    whole = journal.read_bytes()
    at = 40 + 4 + 17 + 4  # entry 2's record, after the no-op's
    (size,) = struct.unpack("<I", whole[at:at + 4])
    body_start, body_end = at + 4 + 16 + 1, at + 4 + size  # after index, term and the kind byte
    written = pickle.loads(whole[body_start:body_end])
    for i in range(body_start, body_end):
        damaged = bytearray(whole)
        damaged[i] ^= 1 << (i % 8)
        journal.write_bytes(bytes(damaged))
        try:
            check_replica_files(journal, dump)
        except JournalCorrupt:
            continue
        assert pickle.loads(bytes(damaged[body_start:body_end])) == written, f"a flip at byte {i} was taken as whole"


def test_the_raft_thread_hands_over_the_snapshot_without_building_it(tmp_path):
    """At a log compaction pysyncobj's thread asks for the state; building and sealing it
    there (0.35-1.5 s for 4,000 jobs) kept the leader from sending heartbeats, and its
    followers called an election (issue 23). It is built when pickled, in the child
    pysyncobj forks to write the snapshot, and unpickles as the same sealed dict."""
    address = _free_address()
    rs = _lone_replica(tmp_path, address)
    try:
        _submit(rs, "echo hi 2")
        consumer = rs._consumer
        built = []
        real = consumer.machine.to_dict
        consumer.machine.to_dict = lambda: built.append(1) or real()
        handed = consumer._serialize()
        assert built == []
        state = pickle.loads(pickle.dumps(handed))
        assert built == [1] and type(state) is dict
        assert state == seal_state({"format": "mtgpu-state-v1", "machine": real()})
        assert state["machine"]["applied"] == 2
    finally:
        rs.close()


def test_a_command_that_meets_a_reopen_waits_for_it_instead_of_failing(tmp_path):
    """A member reopens its replica when the voters change (a member joins): a command
    proposed in that moment never left it, so `apply` proposes it once the reopen is over
    (CI: a tenant's join was refused "changing its Raft role right now")."""
    import threading
    rs = _lone_replica(tmp_path, _free_address())
    try:
        rs._reopening = True
        threading.Timer(0.4, lambda: setattr(rs, "_reopening", False)).start()
        t0 = time.monotonic()
        assert rs.apply(C.command(C.TENANT_ENSURE, name="alice", uid=2001, gid=2001, at=1.0))["ok"]
        assert time.monotonic() - t0 >= 0.35  # it waited for the reopen, then went through
        rs._reopening = True  # a reopen that outlasts the caller's bound: refused, saying why
        from mtgpu.state.store import ReplicationError
        with pytest.raises(ReplicationError, match="changing its Raft role"):
            rs.apply(C.command(C.TENANT_ENSURE, name="bob", uid=2002, gid=2002, at=1.0), timeout_s=0.3)
        rs._reopening = False
    finally:
        rs.close()

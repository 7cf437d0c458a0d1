"""The standalone journal on a bad day: a torn or corrupt line, a corrupt snapshot, a full
disk. Never a silent loss: either what is intact is used and what was dropped is said,
or the node refuses to start naming the file and the fix."""

import errno
import json
import os

import pytest

from mtgpu.model.job import JobSpec
from mtgpu.state import commands as C
from mtgpu.state.journal import JournalCorrupt, JournaledState, StateWriteError


def fill(directory, n=3) -> JournaledState:
    js = JournaledState(directory)
    js.apply(C.command(C.TENANT_ENSURE, name="alice", uid=2001, gid=2001, at=1.0))
    for _ in range(n):
        js.apply(C.command(C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001, spec=JobSpec(script="true").to_dict(),
                           at=2.0))
    js.close()
    return js


def test_a_torn_last_line_is_dropped_and_the_rest_kept(tmp_path, caplog):
    js = fill(tmp_path)
    with open(js.journal_path, "ab") as f:
        f.write(b'{"seq": 5, "comm')
    again = JournaledState(tmp_path)
    assert len(again.machine.jobs) == 3 and "torn last line" in caplog.text


def test_a_corrupt_line_mid_journal_refuses_the_start_naming_the_byte_and_the_cut(tmp_path):
    js = fill(tmp_path)
    lines = js.journal_path.read_bytes().split(b"\n")
    lines[2] = b"\x00garbage\x00"
    js.journal_path.write_bytes(b"\n".join(lines))
    at = len(lines[0]) + len(lines[1]) + 2
    with pytest.raises(JournalCorrupt) as e:
        JournaledState(tmp_path)
    msg = str(e.value)
    assert f"unreadable line at byte {at}" in msg and f"truncate -s {at} {js.journal_path}" in msg, msg
    os.truncate(js.journal_path, at)  # the fix it names works: what is intact loads
    assert len(JournaledState(tmp_path).machine.jobs) == 1


def test_a_corrupt_snapshot_refuses_the_start_naming_it(tmp_path):
    js = JournaledState(tmp_path)
    js.apply(C.command(C.TENANT_ENSURE, name="alice", uid=2001, gid=2001, at=1.0))
    js.snapshot()
    js.close()
    js.snapshot_path.write_text('{"applied": 1, "next_job_id"')
    with pytest.raises(JournalCorrupt) as e:
        JournaledState(tmp_path)
    assert f"the snapshot {js.snapshot_path} cannot be read" in str(e.value) and "backup" in str(e.value)


def test_a_full_disk_refuses_the_command_leaves_no_torn_line_and_the_next_write_works(tmp_path, monkeypatch):
    js = fill(tmp_path, n=1)
    js = JournaledState(tmp_path)
    size = js.journal_path.stat().st_size
    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    cmd = C.command(C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001, spec=JobSpec(script="true").to_dict(), at=3.0)
    with pytest.raises(StateWriteError) as e:
        js.apply(cmd)
    assert "No space left on device" in str(e.value) and "free space" in str(e.value)
    assert len(js.machine.jobs) == 1 and js.journal_path.stat().st_size == size  # not applied, nothing left behind
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert js.apply(cmd)["ok"]
    js.close()
    again = JournaledState(tmp_path)
    assert len(again.machine.jobs) == 2 and [json.loads(x)["seq"] for x in
                                            again.journal_path.read_bytes().splitlines()] == [1, 2, 3]


# ---------------------------------------------------------------- checksums (issue 23)
def hi_journal(directory) -> JournaledState:
    """A tenant, then the jobs `echo hi 1` to `echo hi 3` (entries 2 to 4)."""
    js = JournaledState(directory)
    js.apply(C.command(C.TENANT_ENSURE, name="alice", uid=2001, gid=2001, at=1.0))
    for i in (1, 2, 3):
        js.apply(C.command(C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001,
                           spec=JobSpec(script=f"echo hi {i}").to_dict(), at=2.0))
    js.close()
    return js


def sed(path, old: bytes, new: bytes) -> None:
    """What `sed -i 's/OLD/NEW/'` does to the file (the same length: every other byte as it was)."""
    data = path.read_bytes()
    assert data.count(old) == 1, data
    path.write_bytes(data.replace(old, new))


def test_a_changed_byte_in_a_journal_entry_is_refused_naming_the_entry_and_the_fix(tmp_path):
    js = hi_journal(tmp_path)
    at = sum(len(x) + 1 for x in js.journal_path.read_bytes().split(b"\n")[:2])  # the start of line 3
    sed(js.journal_path, b"echo hi 2", b"echo hX 2")
    with pytest.raises(JournalCorrupt) as e:
        JournaledState(tmp_path)
    msg = str(e.value)
    assert f"the journal {js.journal_path} has entry 3 (job.submit.v1) that was changed on disk" in msg, msg
    assert f"at byte {at} of" in msg and "(line 3)" in msg and f"truncate -s {at} {js.journal_path}" in msg, msg
    os.truncate(js.journal_path, at)  # the fix it names: what is before it loads, the changed script never runs
    assert [j.spec.script for j in JournaledState(tmp_path).machine.jobs.values()] == ["echo hi 1"]


def test_a_changed_byte_in_the_snapshot_is_refused_naming_it_and_the_fix(tmp_path):
    js = hi_journal(tmp_path)
    js = JournaledState(tmp_path)
    js.snapshot()
    js.close()
    sed(js.snapshot_path, b"echo hi 2", b"echo hX 2")
    with pytest.raises(JournalCorrupt) as e:
        JournaledState(tmp_path)
    msg = str(e.value)
    assert f"the snapshot {js.snapshot_path} is damaged: its checksum" in msg and "backup" in msg, msg


def test_every_single_bit_flip_in_an_entry_is_refused(tmp_path):
    """Wherever one bit of an entry flips (its checksum, its name, its seq, its command,
    the line's end), the start is refused: never replayed, never read as an entry of the
    version before checksums."""
    js = hi_journal(tmp_path)
    whole = js.journal_path.read_bytes()
    lines = whole.split(b"\n")
    start = len(lines[0]) + 1 + len(lines[1]) + 1
    end = start + len(lines[2]) + 1  # its newline too
    for i in range(start, end):
        damaged = bytearray(whole)
        damaged[i] ^= 1 << (i % 8)
        js.journal_path.write_bytes(bytes(damaged))
        with pytest.raises(JournalCorrupt, match="at byte"):
            JournaledState(tmp_path)


def test_a_flipped_line_end_of_the_last_entry_keeps_it_and_writes_the_line_end_back(tmp_path, caplog):
    """The last line without its line end is a torn write (dropped), unless it holds a whole
    checksummed entry: then a bit flipped, and the entry, acknowledged, is kept."""
    js = hi_journal(tmp_path)
    whole = js.journal_path.read_bytes()
    for damaged in (whole[:-1], whole[:-1] + b"\x0b"):
        js.journal_path.write_bytes(damaged)
        again = JournaledState(tmp_path)
        again.close()
        assert [j.spec.script for j in again.machine.jobs.values()] == ["echo hi 1", "echo hi 2", "echo hi 3"]
        assert js.journal_path.read_bytes() == whole and "line end was lost or changed" in caplog.text


def legacy_journal(directory, scripts=("echo hi 1", "echo hi 2")) -> list[bytes]:
    """A journal as the version before checksums wrote it, byte for byte."""
    commands = [C.command(C.TENANT_ENSURE, name="alice", uid=2001, gid=2001, at=1.0)] + [
        C.command(C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001, spec=JobSpec(script=s).to_dict(), at=2.0)
        for s in scripts]
    lines = [json.dumps({"seq": i, "command": c}, separators=(",", ":")).encode() for i, c in enumerate(commands, 1)]
    (directory / "journal.jsonl").write_bytes(b"".join(x + b"\n" for x in lines))
    return lines


def test_a_journal_and_snapshot_of_the_version_before_checksums_start_and_are_rewritten_with_them(tmp_path):
    legacy_journal(tmp_path)
    js = JournaledState(tmp_path)
    assert [j.spec.script for j in js.machine.jobs.values()] == ["echo hi 1", "echo hi 2"]
    js.close()
    # Rewritten at once: a checksummed snapshot and an empty journal, so a change is caught from now on.
    assert js.snapshot_path.read_bytes().startswith(b'{"crc":"') and js.journal_path.read_bytes() == b""
    sed(js.snapshot_path, b"echo hi 2", b"echo hX 2")
    with pytest.raises(JournalCorrupt, match="is damaged: its checksum"):
        JournaledState(tmp_path)
    # A snapshot of the version before (no checksum) with a journal after it: read, then rewritten.
    m = js.snapshot_path
    m.write_bytes(m.read_bytes().replace(b"echo hX 2", b"echo hi 2"))
    body = b"{" + m.read_bytes()[len(b'{"crc":"12345678",'):]
    m.write_bytes(body)
    with open(js.journal_path, "wb") as f:
        cmd = C.command(C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001, spec=JobSpec(script="echo hi 3").to_dict(),
                        at=3.0)
        f.write(json.dumps({"seq": 4, "command": cmd}, separators=(",", ":")).encode() + b"\n")
    again = JournaledState(tmp_path)
    assert [j.spec.script for j in again.machine.jobs.values()] == ["echo hi 1", "echo hi 2", "echo hi 3"]
    assert again.snapshot_path.read_bytes().startswith(b'{"crc":"')


def test_an_entry_without_a_checksum_after_checksummed_ones_is_refused(tmp_path):
    """Only what the version before checksums wrote is read without one: a line that lost
    its checksum among checksummed lines is damage, not an old entry."""
    js = hi_journal(tmp_path)
    lines = js.journal_path.read_bytes().split(b"\n")
    lines[2] = b"{" + lines[2][len(b'{"crc":"12345678",'):]
    js.journal_path.write_bytes(b"\n".join(lines))
    with pytest.raises(JournalCorrupt, match=r"has entry 3 \(job.submit.v1\) without a checksum where every entry has"):
        JournaledState(tmp_path)

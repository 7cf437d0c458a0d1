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

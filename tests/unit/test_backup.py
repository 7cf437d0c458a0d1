"""Backups (state/backup.py): the file round-trips; a changed byte, a newer format or state
version is refused naming why; a job that ran at the backup is requeued, or lost when it
said requeue=no, and nothing is left running."""

import pytest

from mtgpu.model.job import JobState
from mtgpu.state import commands as C
from mtgpu.state.backup import BackupError, backup_document, decode, encode, restored_machine

from test_state_machine import alloc, setup_machine, submit


def _doc():
    sm = setup_machine()
    again, kept = submit(sm), submit(sm, requeue=False)
    queued = submit(sm)
    for jid, index in ((again, 0), (kept, 1)):
        assert sm.apply(C.command(C.JOB_START, job_id=jid, allocations=[alloc(index=index)], at=3.0))["ok"]
    return backup_document(sm, "n1", None, "standalone", 5.0, "0.1.0"), again, kept, queued


def test_a_backup_round_trips_and_its_running_jobs_are_requeued_or_lost():
    doc, again, kept, queued = _doc()
    assert doc["summary"] == {"jobs": 3, "queued": 1, "running": 2, "tenants": 1, "applied": doc["state"]["applied"]}
    back = decode(encode(doc), "f")
    machine, said = restored_machine(back, 9.0, "f")
    assert machine.jobs[again].state is JobState.QUEUED and machine.jobs[again].attempt == 1
    assert "restored from a backup taken at 5" in machine.jobs[again].history[0]["outcome"]
    assert machine.jobs[kept].state is JobState.LOST and "requeue=no" in machine.jobs[kept].reason
    assert machine.jobs[queued].state is JobState.QUEUED
    assert not machine.running_jobs() and not any(g.exclusive for g in machine.commitment("n1").gpus.values())
    assert said == [f"job {again}: requeued (it ran when the backup was taken)",
                    f"job {kept}: lost (it ran when the backup was taken; requeue=no)"]
    assert machine.tenants["alice"].uid == 2001


def test_a_changed_byte_a_newer_format_and_a_newer_state_are_refused():
    doc = _doc()[0]
    data = encode(doc)
    with pytest.raises(BackupError, match="f is damaged"):
        decode(data.replace(b'"alice"', b'"alicf"', 1), "f")
    with pytest.raises(BackupError, match=r"newer mtgpu \(2\.0, backup format 2\)"):
        decode(encode({**doc, "format_version": 2, "mtgpu_version": "2.0"}), "f")
    with pytest.raises(BackupError, match="state of version 7"):
        decode(encode({**doc, "state": {**doc["state"], "version": 7}}), "f")
    with pytest.raises(BackupError, match="not an mtgpu backup"):
        decode(b'{"format":"x"}', "f")

"""Backups (state/backup.py): the file round-trips; a changed byte, a newer format or state
version is refused naming why; a job that ran at the backup is requeued, or lost when it
said requeue=no, and nothing is left running; a new cluster takes a backup as its seed
(state.seed.v1) only while its state holds no jobs and no tenants, and its founder proposes
it once its own node is registered."""

import logging
import threading

import pytest

from mtgpu.model.job import JobState
from mtgpu.server.cluster.seed import APPLIED, SEED, ClusterSeed
from mtgpu.state import commands as C
from mtgpu.state.backup import BackupError, backup_document, decode, encode, restored_machine
from mtgpu.state.machine import StateMachine

from test_state_machine import alloc, make_spec, setup_machine, submit


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


def _register(sm, name: str) -> None:
    assert sm.apply(C.command(C.NODE_REGISTER, name=name, cpus=8, mem_total_bytes=1 << 30, at=1.0, gpus=[]))["ok"]


def test_a_new_cluster_takes_a_seed_once_and_its_job_ids_go_on_after_the_seeds():
    doc, again, kept, queued = _doc()
    seed = restored_machine(decode(encode(doc), "f"), 9.0, "f")[0].to_dict()
    new = StateMachine()
    _register(new, "m0")
    before = new.applied
    r = new.apply(C.command(C.STATE_SEED, state=seed, at=10.0, source="the backup"))
    assert r == {"ok": True, "jobs": 3, "tenants": 1}, r
    assert new.applied == before + 1  # its own count of commands, not the seed's
    assert set(new.jobs) == {again, kept, queued} and new.tenants["alice"].uid == 2001
    assert {j.id for j in new.queued_jobs()} == {queued, again} and not new.running_jobs()
    assert not new.nodes["m0"].down  # the member registered now stays as it is
    assert new.nodes["n1"].down and "restored from the backup" in new.nodes["n1"].down_reason
    jid = new.apply(C.command(C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001, spec=make_spec(), at=11.0))["job_id"]
    assert jid == max(again, kept, queued) + 1
    # never over a state that holds jobs or tenants: the cluster's state is as it was
    r = new.apply(C.command(C.STATE_SEED, state=seed, at=12.0))
    assert not r["ok"] and "holds 4 jobs and 1 tenants already" in r["error"], r
    assert len(new.jobs) == 4
    only_tenant = StateMachine()
    assert only_tenant.apply(C.command(C.TENANT_ENSURE, name="bob", uid=2002, gid=2002, at=1.0))["ok"]
    r = only_tenant.apply(C.command(C.STATE_SEED, state=seed, at=12.0))
    assert not r["ok"] and "0 jobs and 1 tenants" in r["error"] and not only_tenant.jobs


def test_a_seed_with_running_jobs_is_refused():
    doc = _doc()[0]
    r = StateMachine().apply(C.command(C.STATE_SEED, state=doc["state"], at=10.0))
    assert not r["ok"] and "running jobs" in r["error"], r


class _Store:
    """The store API ClusterSeed uses, over a StateMachine in this process."""

    def __init__(self) -> None:
        self.machine, self.lock = StateMachine(), threading.RLock()

    def applied_index(self) -> int:
        return self.machine.applied

    def commit_index(self) -> int:
        return self.machine.applied

    def apply(self, command: dict) -> dict:
        return self.machine.apply(command)


def test_the_founder_proposes_its_seed_once_its_node_is_registered_and_never_over_a_state(tmp_path, caplog):
    doc, again, kept, queued = _doc()
    seed_doc = {**doc, "state": restored_machine(doc, 9.0, "f")[0].to_dict()}
    (tmp_path / SEED).write_bytes(encode(seed_doc))
    store = _Store()
    seed = ClusterSeed(tmp_path, "n1")  # the backup's node has the founder's name
    seed.step(store)
    assert seed.pending and not store.machine.jobs  # its own node first
    _register(store.machine, "n1")
    with caplog.at_level(logging.INFO):
        seed.step(store)
    assert set(store.machine.jobs) == {again, kept, queued} and not store.machine.nodes["n1"].down
    assert not (tmp_path / SEED).exists() and (tmp_path / APPLIED).exists()
    assert sum("took the seed" in r.getMessage() for r in caplog.records) == 1
    (tmp_path / SEED).write_bytes(encode(seed_doc))  # a live state is never seeded over
    again_seed = ClusterSeed(tmp_path, "n1")
    again_seed.step(store)
    assert not again_seed.pending and (tmp_path / SEED).exists() and len(store.machine.jobs) == 3


def test_keys_invitations_and_usage_come_back_as_they_were():
    """Issue 29 point 2: besides jobs and uid/gid, a tenant's keys, open invitations and
    the usage of finished and of forgotten jobs are restored unchanged."""
    sm = setup_machine()
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBackupRestoreKeyOfBob bob@laptop"
    assert sm.apply(C.command(C.TENANT_ADMIT, name="bob", uid=2002, gid=2002, keys=[key], clusters=["lab"],
                              servers={}, at=1.0))["ok"]
    assert sm.apply(C.command(C.TENANT_INVITE, name="carol", code_hash="h" * 64, expires_at=99.0,
                              clusters=["lab"], at=1.0))["ok"]
    done, forgotten = submit(sm), submit(sm)
    for jid, index in ((done, 0), (forgotten, 1)):
        assert sm.apply(C.command(C.JOB_START, job_id=jid, allocations=[alloc(index=index)], at=2.0))["ok"]
        assert sm.apply(C.command(C.JOB_FINISH, job_id=jid, exit_code=0, at=50.0))["ok"]
    assert sm.apply(C.command(C.JOB_FORGET, job_id=forgotten, at=60.0))["ok"]
    kept_usage, summary = sm.usage_copy()
    assert kept_usage and summary  # a finished job's usage in its record, a forgotten one's in the summary
    doc = backup_document(sm, "n1", None, "standalone", 70.0, "0.1.0")
    machine, _said = restored_machine(decode(encode(doc), "f"), 80.0, "f")
    assert machine.tenants["bob"].keys == [key] and (machine.tenants["bob"].uid, machine.tenants["bob"].gid) == (2002, 2002)
    assert machine.invites.keys() == sm.invites.keys()
    assert machine.usage_copy() == (kept_usage, summary)
    assert forgotten not in machine.jobs and machine.jobs[done].usage == sm.jobs[done].usage

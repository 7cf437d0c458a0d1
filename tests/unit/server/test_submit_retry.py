"""A submission whose proposal fails while the leader changes is proposed again and
gets exactly one set of jobs: the state machine remembers each submission's key."""

import asyncio
import threading

import pytest

from mtgpu.model.job import ArraySpec, JobSpec
from mtgpu.server.api.batching import SubmitBatcher
from mtgpu.state import commands as C
from mtgpu.state.machine import StateMachine
from mtgpu.state.store import ReplicationError


def spec(**kw) -> dict:
    return JobSpec(script="#!/bin/bash\ntrue\n", **kw).to_dict()


def machine() -> StateMachine:
    sm = StateMachine()
    assert sm.apply(C.command(C.TENANT_ENSURE, name="alice", uid=2001, gid=2001, at=1.0))["ok"]
    assert sm.apply(C.command(C.TENANT_ENSURE, name="bob", uid=2002, gid=2002, at=1.0))["ok"]
    return sm


def test_the_same_key_applied_twice_answers_with_the_first_jobs_and_adds_none():
    sm = machine()
    array = spec(array=ArraySpec((0, 1, 2)))
    cmd = C.command(C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001, spec=array, at=2.0, key="k1")
    first = sm.apply(cmd)
    again = sm.apply(cmd)
    assert first["ok"] and again == first and len(first["job_ids"]) == 3
    assert len(sm.jobs) == 3
    other = sm.apply(C.command(C.JOB_SUBMIT, tenant="bob", uid=2002, gid=2002, spec=spec(), at=2.0, key="k1"))
    assert not other["ok"] and "another tenant" in other["error"]
    # a snapshot remembers the keys; forgetting the jobs forgets the key
    back = StateMachine.from_dict(sm.to_dict())
    assert back.apply(cmd)["job_ids"] == first["job_ids"] and len(back.jobs) == 3
    for jid in first["job_ids"]:
        assert back.apply(C.command(C.JOB_CANCEL, job_id=jid, at=3.0))["ok"]
        assert back.apply(C.command(C.JOB_FORGET, job_id=jid, at=4.0))["ok"]
    fresh = back.apply(cmd)
    assert fresh["ok"] and set(fresh["job_ids"]).isdisjoint(first["job_ids"])


def test_a_keyless_submission_still_adds_jobs_each_time():
    sm = machine()
    cmd = C.command(C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001, spec=spec(), at=2.0)
    assert sm.apply(cmd)["job_id"] != sm.apply(cmd)["job_id"]


class LeaderChangingStore:
    """A store over a real state machine whose first proposals are applied (the old
    leader replicated them) but answered as failed, as pysyncobj answers LEADER_CHANGED."""

    def __init__(self, failures: int) -> None:
        self.machine = machine()
        self.lock = threading.RLock()
        self.failures = failures
        self.proposals = 0

    def apply_async(self, cmd, callback) -> None:
        with self.lock:
            self.proposals += 1
            result = self.machine.apply(cmd)
            fail = self.failures > 0
            self.failures -= 1
        if fail:
            callback(None, ReplicationError("the cluster did not commit the change (reason 5)", in_flux=True))
        else:
            callback(result, None)


def test_a_submission_answered_leader_changed_is_proposed_again_and_makes_one_job():
    store = LeaderChangingStore(failures=2)
    batcher = SubmitBatcher(store, clock=lambda: 5.0)

    async def go():
        return await batcher.submit(tenant="alice", uid=2001, gid=2001, spec=spec())

    answer = asyncio.run(go())
    assert answer["ok"] and store.proposals == 3
    assert list(store.machine.jobs) == [answer["job_id"]]


def submit_once(batcher: SubmitBatcher) -> dict:
    async def go():
        return await batcher.submit(tenant="alice", uid=2001, gid=2001, spec=spec())
    return asyncio.run(go())


def test_a_cluster_that_never_decides_gets_the_error_after_the_retry_time(monkeypatch):
    monkeypatch.setattr("mtgpu.server.api.batching.RETRY_FOR_S", 1.0)
    store = LeaderChangingStore(failures=10**6)
    with pytest.raises(ReplicationError) as e:
        submit_once(SubmitBatcher(store, clock=lambda: 5.0))
    assert "reason 5" in str(e.value) and "proposed" in str(e.value)
    assert len(store.machine.jobs) == 1  # every proposal after the first found the first's job


def test_no_leader_at_all_is_answered_at_once_not_proposed_again():
    class NoLeader(LeaderChangingStore):
        def apply_async(self, cmd, callback) -> None:
            self.proposals += 1
            callback(None, ReplicationError("the cluster has no leader right now"))

    store = NoLeader(failures=0)
    with pytest.raises(ReplicationError, match="no leader"):
        submit_once(SubmitBatcher(store, clock=lambda: 5.0))
    assert store.proposals == 1


def test_a_proposal_never_answered_gets_an_error_after_the_retry_time(monkeypatch):
    monkeypatch.setattr("mtgpu.server.api.batching.RETRY_FOR_S", 0.5)

    class Silent(LeaderChangingStore):
        def apply_async(self, cmd, callback) -> None:  # pysyncobj waiting for a leader that never comes
            self.proposals += 1

    store = Silent(failures=0)
    batcher = SubmitBatcher(store, clock=lambda: 5.0)

    async def go():
        return await asyncio.wait_for(batcher.submit(tenant="alice", uid=2001, gid=2001, spec=spec()), 30)

    try:
        asyncio.run(go())
    except ReplicationError as e:
        assert "no quorum reachable" in str(e)
    else:
        raise AssertionError("no error")

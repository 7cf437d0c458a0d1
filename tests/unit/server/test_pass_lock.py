"""A placement pass holds the state's lock only to take its inputs (issue 23): the Raft
thread takes that lock to apply any command, and a pass that read 4,000 queued jobs
under it held that thread for 76-480 ms on a busy member, long enough for its followers
to call an election. While the pass builds its queue, its dependencies and the tenants'
usage, another thread must be able to take the lock (as the Raft thread would)."""

from __future__ import annotations

import threading

from mtgpu.model.job import JobSpec
from mtgpu.server.member import scheduler_role
from mtgpu.server.member.scheduler_role import SchedulerRole
from mtgpu.state import commands as C
from mtgpu.state.journal import JournaledState
from mtgpu.state.store import commit


def lock_free_for_another_thread(lock) -> bool:
    """Whether a thread other than this one gets `lock` (the pass's own RLock hold would let
    this thread in again, so it must be another)."""
    got: list[bool] = []

    def take() -> None:
        ok = lock.acquire(timeout=2.0)
        if ok:
            lock.release()
        got.append(ok)

    t = threading.Thread(target=take)
    t.start()
    t.join()
    return got == [True]


def test_the_pass_builds_its_queue_dependencies_and_usage_without_the_states_lock(tmp_path, monkeypatch):
    store = JournaledState(tmp_path / "state")
    assert commit(store, C.TENANT_ENSURE, name="alice", uid=2001, gid=2001, at=1.0)["ok"]
    assert commit(store, C.NODE_REGISTER, name="n1", gpus=[], cpus=2.0, mem_total_bytes=1 << 30, at=1.0)["ok"]
    first = commit(store, C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001, at=2.0,
                   spec=JobSpec(script="#!/bin/bash\nsleep 1\n", cpus=64.0).to_dict())["job_id"]  # never fits
    commit(store, C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001, at=2.0,
           spec=JobSpec(script="#!/bin/bash\ntrue\n", after=(("afterok", (first,)),)).to_dict())
    seen: dict[str, bool] = {}

    def watched(name: str, real):
        def call(*a, **kw):
            seen[name] = lock_free_for_another_thread(store.lock)
            return real(*a, **kw)
        return call

    for name in ("build_queue", "hold_dependents", "build_usage"):
        monkeypatch.setattr(scheduler_role, name, watched(name, getattr(scheduler_role, name)))
    role = SchedulerRole(store, "n1", clock=lambda: 10.0, down_after_s=10.0)
    role.run_once(10.0, store.term())
    assert seen == {"build_queue": True, "hold_dependents": True, "build_usage": True}
    # and the pass still did its work from what it took: the dependent job waits for its first
    assert role.pending_reasons.get(first + 1) == f"waiting for job {first} (queued)", role.pending_reasons

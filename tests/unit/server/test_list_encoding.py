"""A long list of jobs is encoded in chunks (the interpreter lock can change hands between
two), and the answer is the same bytes as before (server/api/encoding.py, issue 23)."""

from __future__ import annotations

from types import SimpleNamespace

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from pydantic import TypeAdapter

from mtgpu.model.job import Job, JobSpec, JobState, NodeAllocation, GpuSlot
from mtgpu.server.api import encoding
from mtgpu.server.api.identity import Caller
from mtgpu.server.api.routes import add_job_routes

ADMIN = Caller(uid=0, gid=0, pid=1, name="root", is_admin=True)


def job_dicts(n: int) -> list[dict]:
    """What MemberService.job_json gives, with what an encoder could change: non-ASCII text,
    floats, None, nested lists and dicts."""
    out = []
    for i in range(1, n + 1):
        spec = JobSpec(script="#!/bin/bash\necho 'héllo ✓' \"q\"\n", name=f"ß-job-{i}")
        allocs = (NodeAllocation("gpu-1", (GpuSlot(0), GpuSlot(1))),) if i % 3 == 0 else ()
        job = Job(id=i, tenant="alice", uid=200000, gid=200000, spec=spec,
                  state=JobState.RUNNING if allocs else JobState.QUEUED, submitted_at=100.0 + i / 7,
                  allocations=allocs)
        d = job.to_dict()
        d["name"] = job.spec.name
        d["nodes"] = [a.node for a in job.allocations]
        d["gpus"] = [{"node": a.node, "index": g.index, "fraction": g.fraction, "vram_bytes": g.vram_bytes,
                      "mode": g.mode.value} for a in job.allocations for g in a.gpus]
        d["reason"] = None if allocs else "Dependency: waits for job(s) 1 (afterany)"
        d["ratio"] = 1e16 + i if i % 5 == 0 else 0.1 * i
        out.append(d)
    return out


def test_list_bytes_are_fastapis_and_starlettes_own():
    for n in (0, 1, encoding.CHUNK - 1, encoding.CHUNK, encoding.CHUNK + 1, 3 * encoding.CHUNK + 7):
        items = job_dicts(n)
        adapter = TypeAdapter(list[dict])  # what FastAPI does for `-> list[dict]`: validate, then dump_json
        assert encoding.list_bytes(items) == adapter.dump_json(adapter.validate_python(items)), n
        assert encoding.list_bytes_stdlib(items) == JSONResponse(items).body, n


def test_the_job_list_route_encodes_in_chunks_and_answers_the_same(monkeypatch):
    items = job_dicts(4 * encoding.CHUNK + 3)
    expected = TypeAdapter(list[dict]).dump_json(items)
    calls: list[int] = []
    real = encoding._ITEMS

    class Recording:
        def dump_json(self, part):
            calls.append(len(part))
            return real.dump_json(part)

    monkeypatch.setattr(encoding, "_ITEMS", Recording())
    service = SimpleNamespace(
        list_jobs=lambda who, all_tenants=False, include_final=True: items if all_tenants else [],
        member=SimpleNamespace(link=SimpleNamespace(quorum_problem=lambda: None)), config=None)

    async def identify(_request):
        return ADMIN

    app = FastAPI()
    add_job_routes(app, service, identify)
    r = TestClient(app).get("/v1/jobs", params={"all": True})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.content == expected
    assert calls and max(calls) <= encoding.CHUNK and sum(calls) == len(items), calls
    assert TestClient(app).get("/v1/jobs").content == b"[]"


def test_long_lists_are_built_one_at_a_time():
    """Each thread running Python beside the Raft thread is one more it queues behind."""
    import asyncio
    import threading
    import time

    busy, most = [0], [0]
    guard = threading.Lock()

    def build():
        with guard:
            busy[0] += 1
            most[0] = max(most[0], busy[0])
        time.sleep(0.2)  # long enough for the others to start, were they let in
        with guard:
            busy[0] -= 1
        return encoding.list_response([{"n": 1}])

    async def three_clients():
        return await asyncio.gather(*(encoding.in_turn(build) for _ in range(3)))

    answers = asyncio.run(three_clients())
    assert [a.body for a in answers] == [b'[{"n":1}]'] * 3
    assert most[0] == 1

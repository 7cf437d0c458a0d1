"""Accounting (issue 16): the figures of a known workload, with every time injected through
the commands' `at`, match to the second; they survive retention in the daily summary and a
snapshot round trip (docs/ACCOUNTING.md)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mtgpu.model.job import GpuMode, JobSpec, WorkspaceSpec
from mtgpu.model.usage import (WAIT_EDGES_S, UsageError, UsageSummary, exact_percentile, histogram_percentile,
                               parse_day, wait_bucket)
from mtgpu.model.usage_report import usage_report
from mtgpu.state import commands as C
from mtgpu.state.machine import StateMachine

GiB = 1024**3
T0 = 1740787200.0  # 2025-03-01 00:00 UTC
DAY = 86400.0
ALICE, BOB = ("alice", 2001), ("bob", 2002)


def ok(sm: StateMachine, cmd: str, /, **args) -> dict:
    r = sm.apply(C.command(cmd, **args))
    assert r["ok"], r
    return r


def make_cluster() -> StateMachine:
    """n1: two H100s; n2: two RTX 4090s; tenants alice and bob."""
    sm = StateMachine()
    for name, uid in (ALICE, BOB):
        ok(sm, C.TENANT_ENSURE, name=name, uid=uid, gid=uid, at=1.0)
    for node, model in (("n1", "NVIDIA H100"), ("n2", "NVIDIA GeForce RTX 4090")):
        ok(sm, C.NODE_REGISTER, name=node, cpus=16, mem_total_bytes=128 * GiB, at=1.0,
           gpus=[{"index": i, "vendor": "nvidia", "model": model, "vram_total_bytes": 24 * GiB} for i in range(2)])
    return sm


def submit(sm, who, at: float, **spec) -> int:
    return ok(sm, C.JOB_SUBMIT, tenant=who[0], uid=who[1], gid=who[1], at=at,
              spec=JobSpec(script="#!/bin/sh\ntrue\n", **spec).to_dict())["job_id"]


def alloc(node: str, gpus: list[tuple[int, float, GpuMode]], cpus: float = 1.0, mem_bytes: int = 0) -> dict:
    return {"node": node, "cpus": cpus, "mem_bytes": mem_bytes, "vendor": "nvidia",
            "gpus": [{"index": i, "fraction": f, "vram_bytes": 10 * GiB if m is GpuMode.SHARED else 0,
                      "mode": m.value} for i, f, m in gpus]}


EX, SH = GpuMode.EXCLUSIVE, GpuMode.SHARED


def known_workload() -> tuple[StateMachine, dict[str, int]]:
    """A: alice, 2 H100s, 8 cpus, 32 GiB, waits 100 s, runs 3600 s.
    B: alice, half an RTX 4090 (shared), 2 cpus, 4 GiB, waits 300 s, runs 1800 s.
    C: bob, one RTX 4090 then (requeued once) one H100, 4 cpus: waits 60 s, runs 600 s + 1000 s.
    D: bob, cancelled while queued on the next day after 300 s: no GPU, a job with a wait."""
    sm = make_cluster()
    a = submit(sm, ALICE, T0)
    b = submit(sm, ALICE, T0)
    c = submit(sm, BOB, T0 + 50)
    ok(sm, C.JOB_START, job_id=a, at=T0 + 100, allocations=[alloc("n1", [(0, 1.0, EX), (1, 1.0, EX)], 8, 32 * GiB)])
    ok(sm, C.JOB_START, job_id=c, at=T0 + 110, allocations=[alloc("n2", [(1, 1.0, EX)], 4)])
    ok(sm, C.JOB_START, job_id=b, at=T0 + 300, allocations=[alloc("n2", [(0, 0.5, SH)], 2, 4 * GiB)])
    ok(sm, C.JOB_REQUEUE, job_id=c, at=T0 + 710, reason="its member stopped reporting")
    ok(sm, C.JOB_FINISH, job_id=b, at=T0 + 2100, exit_code=0)
    ok(sm, C.JOB_FINISH, job_id=a, at=T0 + 3700, exit_code=1)
    ok(sm, C.JOB_START, job_id=c, at=T0 + 4000, allocations=[alloc("n1", [(0, 1.0, EX)], 4)])
    ok(sm, C.JOB_FINISH, job_id=c, at=T0 + 5000, exit_code=0)
    d = submit(sm, BOB, T0 + DAY + 200)
    ok(sm, C.JOB_CANCEL, job_id=d, at=T0 + DAY + 500, by="bob")
    return sm, {"A": a, "B": b, "C": c, "D": d}


def report(sm: StateMachine, by: str, **kw) -> dict:
    records, rows = sm.usage_copy()
    return usage_report(records, rows, kw.pop("since", None), kw.pop("until", None), by, **kw)


def rows(rep: dict) -> dict[str, dict]:
    return {r[rep["by"]]: r for r in rep["rows"]}


def test_each_finished_job_keeps_its_usage_in_its_record_to_the_second():
    sm, ids = known_workload()
    a, b, c, d = (sm.jobs[ids[k]].usage for k in "ABCD")
    assert (a["run_s"], a["wait_s"], a["gpu_s_by_model"], a["cpu_s"], a["mem_byte_s"]) == \
        (3600.0, 100.0, {"h100": 7200.0}, 28800.0, 32 * GiB * 3600.0)
    assert (a["state"], a["exit_code"], a["day"], [p["node"] for p in a["parts"]]) == ("failed", 1, "2025-03-01", ["n1"])
    # a shared half GPU counts half its seconds
    assert (b["run_s"], b["wait_s"], b["gpu_s_by_model"], b["cpu_s"]) == (1800.0, 300.0, {"rtx4090": 900.0}, 3600.0)
    # the requeued attempt counts too; the wait is to the first start
    assert (c["run_s"], c["wait_s"], c["attempts"], c["gpu_s_by_model"], c["cpu_s"]) == \
        (1600.0, 60.0, 2, {"h100": 1000.0, "rtx4090": 600.0}, 6400.0)
    assert {(p["node"], p["model"]): p["weight"] for p in c["parts"]} == {("n1", "h100"): 0.625, ("n2", "rtx4090"): 0.375}
    # cancelled while queued: no GPU-seconds, but a job that waited
    assert (d["run_s"], d["wait_s"], d["started_at"], d["gpu_s_by_model"], d["state"], d["day"]) == \
        (0.0, 300.0, None, {}, "cancelled", "2025-03-02")


def test_the_report_of_a_known_workload_matches_to_the_second():
    sm, _ = known_workload()
    by_tenant = report(sm, "tenant")
    t = by_tenant["totals"]
    assert (t["jobs"], t["gpu_s_by_model"], t["cpu_s"], t["run_s"], t["wait_s"]) == \
        (4, {"h100": 8200.0, "rtx4090": 1500.0}, 38800.0, 7000.0, 760.0)
    alice, bob = rows(by_tenant)["alice"], rows(by_tenant)["bob"]
    assert (alice["jobs"], alice["gpu_s"], alice["gpu_s_by_model"], alice["run_s"], alice["wait_s"]) == \
        (2, 8100.0, {"h100": 7200.0, "rtx4090": 900.0}, 5400.0, 400.0)
    assert (bob["jobs"], bob["gpu_s"], bob["run_s"], bob["wait_s"], bob["mem_byte_s"]) == (2, 1600.0, 1600.0, 360.0, 0.0)
    models = rows(report(sm, "model"))
    assert {m: (r["jobs"], r["gpu_s"]) for m, r in models.items()} == \
        {"h100": (1.625, 8200.0), "rtx4090": (1.375, 1500.0), "-": (1, 0.0)}
    nodes = rows(report(sm, "node"))
    assert {n: (r["jobs"], r["cpu_s"]) for n, r in nodes.items()} == \
        {"n1": (1.625, 28800.0 + 4000.0), "n2": (1.375, 3600.0 + 2400.0), "-": (1, 0.0)}
    days = rows(report(sm, "day"))
    assert {k: r["jobs"] for k, r in days.items()} == {"2025-03-01": 3, "2025-03-02": 1}


def test_wait_percentiles_per_gpu_model_are_exact_from_the_kept_records():
    sm, _ = known_workload()
    waits = {w["model"]: w for w in report(sm, "tenant")["wait_by_model"]}
    # h100: A waited 100 s, C 60 s (C ran longest on an H100); rtx4090: B 300 s; D never started
    assert {m: (w["wait_samples"], w["wait_p50_s"], w["wait_p90_s"], w["wait_p99_s"], w["wait_exact"])
            for m, w in waits.items()} == {"h100": (2, 60.0, 100.0, 100.0, True), "rtx4090": (1, 300.0, 300.0, 300.0, True)}


def test_the_range_and_the_tenant_filter_select_what_is_counted():
    sm, _ = known_workload()
    assert report(sm, "day", since="2025-03-02")["totals"]["jobs"] == 1
    assert report(sm, "day", until="2025-03-01")["totals"]["jobs"] == 3
    assert report(sm, "day", since="2025-03-01", until="2025-03-01")["totals"]["run_s"] == 7000.0
    mine = report(sm, "model", tenant=ALICE)
    assert mine["totals"]["jobs"] == 2 and set(rows(mine)) == {"h100", "rtx4090"}
    assert report(sm, "model", tenant=("alice", 9999))["totals"]["jobs"] == 0  # the name alone is not the tenant
    with pytest.raises(UsageError, match="after --until"):
        report(sm, "day", since="2025-03-02", until="2025-03-01")
    with pytest.raises(UsageError, match="--by 'week'"):
        report(sm, "week")


def forget_all(sm: StateMachine, at: float) -> None:
    for jid in sorted(sm.jobs):
        ok(sm, C.JOB_FORGET, job_id=jid, at=at)


def test_after_retention_forgets_the_records_the_summary_gives_the_same_figures():
    sm, ids = known_workload()
    before = {by: report(sm, by) for by in ("tenant", "model", "node", "day")}
    ok(sm, C.JOB_FORGET, job_id=ids["C"], at=T0 + 40 * DAY)  # some kept, some summarized
    mixed = report(sm, "tenant")
    forget_all(sm, T0 + 40 * DAY)
    assert sm.jobs == {}
    for by, old in before.items():
        new = report(sm, by)
        strip = ("wait_samples", "wait_p50_s", "wait_p90_s", "wait_p99_s", "wait_exact")
        for old_row, new_row in zip(old["rows"] + [old["totals"]], new["rows"] + [new["totals"]]):
            assert {k: v for k, v in old_row.items() if k not in strip} == \
                   {k: v for k, v in new_row.items() if k not in strip}, by
        assert new["sources"]["job_records"] == 0
    assert {k: v for k, v in mixed["totals"].items() if not k.startswith("wait_")} == \
        {k: v for k, v in before["tenant"]["totals"].items() if not k.startswith("wait_")}
    # percentiles survive as the upper edges of their histogram buckets: 60 s and 100 s are
    # in [60 s, 120 s), 300 s in [300 s, 600 s)
    waits = {w["model"]: w for w in report(sm, "tenant")["wait_by_model"]}
    assert {m: (w["wait_samples"], w["wait_p50_s"], w["wait_p99_s"], w["wait_exact"]) for m, w in waits.items()} == \
        {"h100": (2, 120.0, 120.0, False), "rtx4090": (1, 600.0, 600.0, False)}


def test_the_summary_is_one_row_per_tenant_day_node_and_model():
    sm, _ = known_workload()
    forget_all(sm, T0 + 40 * DAY)
    keys = [(r["tenant"], r["day"], r["node"], r["model"]) for r in sm.usage.rows()]
    assert keys == [("alice", "2025-03-01", "n1", "h100"), ("alice", "2025-03-01", "n2", "rtx4090"),
                    ("bob", "2025-03-01", "n1", "h100"), ("bob", "2025-03-01", "n2", "rtx4090"),
                    ("bob", "2025-03-02", "", "")]
    # a second identical day adds to the same rows
    sm2, _ = known_workload()
    forget_all(sm2, T0 + 40 * DAY)
    rows2 = sm2.usage.rows()
    assert len(rows2) == 5 and rows2[0]["gpu_s"] == 7200.0


def test_the_summary_drops_days_older_than_it_keeps():
    sm, _ = known_workload()
    forget_all(sm, T0 + 40 * DAY)
    late = submit(sm, ALICE, T0 + 500 * DAY)  # a job from much later, forgotten much later
    ok(sm, C.JOB_CANCEL, job_id=late, at=T0 + 500 * DAY + 10)
    ok(sm, C.JOB_FORGET, job_id=late, at=T0 + 530 * DAY)
    assert [r["day"] for r in sm.usage.rows()] == ["2026-07-14"]


def test_a_snapshot_round_trip_keeps_the_records_usage_and_the_summary():
    sm, ids = known_workload()
    ok(sm, C.JOB_FORGET, job_id=ids["A"], at=T0 + 40 * DAY)
    ok(sm, C.JOB_FORGET, job_id=ids["D"], at=T0 + 40 * DAY)
    again = StateMachine.from_dict(json.loads(json.dumps(sm.to_dict())))
    assert again.to_dict() == sm.to_dict()
    for by in ("tenant", "model", "node", "day"):
        assert report(again, by) == report(sm, by)


def test_a_snapshot_from_before_accounting_loads_and_counts_its_finished_jobs():
    sm, ids = known_workload()
    d = json.loads(json.dumps(sm.to_dict()))
    del d["usage"]
    for j in d["jobs"]:
        del j["usage"]
    old = StateMachine.from_dict(d)
    assert old.usage.rows() == []
    assert old.jobs[ids["A"]].usage == sm.jobs[ids["A"]].usage
    assert report(old, "tenant")["totals"] == report(sm, "tenant")["totals"]
    assert UsageSummary.from_dict(None).rows() == []


def test_a_late_report_taken_as_the_jobs_end_counts_that_attempt_once():
    sm = make_cluster()
    jid = submit(sm, ALICE, T0)
    ok(sm, C.JOB_START, job_id=jid, at=T0 + 10, allocations=[alloc("n1", [(0, 1.0, EX)])])
    ok(sm, C.JOB_REQUEUE, job_id=jid, at=T0 + 110, reason="down")
    assert ok(sm, C.JOB_LATE_REPORT, job_id=jid, attempt=0, node="n1", at=T0 + 150, exit_code=0)["taken"]
    u = sm.jobs[jid].usage
    assert (u["run_s"], u["attempts"], u["gpu_s_by_model"], u["wait_s"]) == (140.0, 1, {"h100": 140.0}, 10.0)


def test_a_workspace_counts_its_runs_not_the_time_it_stood_stopped():
    sm = make_cluster()
    jid = submit(sm, ALICE, T0, workspace=WorkspaceSpec(name="w"))
    ok(sm, C.JOB_START, job_id=jid, at=T0 + 10, allocations=[alloc("n2", [(0, 1.0, EX)])])
    ok(sm, C.WORKSPACE_STOP, job_id=jid, at=T0 + 110)
    ok(sm, C.WORKSPACE_START, job_id=jid, at=T0 + 500)
    ok(sm, C.JOB_START, job_id=jid, at=T0 + 520, allocations=[alloc("n2", [(1, 1.0, EX)])])
    ok(sm, C.WORKSPACE_STOP, job_id=jid, at=T0 + 620)
    ok(sm, C.JOB_CANCEL, job_id=jid, at=T0 + 5000, by="alice")  # mt-container rm, long after it stopped
    u = sm.jobs[jid].usage
    assert (u["run_s"], u["attempts"], u["gpu_s_by_model"], u["wait_s"]) == (200.0, 2, {"rtx4090": 200.0}, 10.0)


def test_a_gang_splits_its_count_across_its_nodes_and_adds_its_gpus():
    sm = make_cluster()
    jid = submit(sm, ALICE, T0, nodes=2)
    ok(sm, C.JOB_START, job_id=jid, at=T0 + 30, allocations=[alloc("n1", [(0, 1.0, EX)], 2),
                                                               alloc("n2", [(0, 1.0, EX), (1, 1.0, EX)], 2)])
    ok(sm, C.JOB_FINISH, job_id=jid, at=T0 + 330, exit_code=0)
    u = sm.jobs[jid].usage
    assert (u["run_s"], u["gpu_s_by_model"], u["cpu_s"]) == (300.0, {"h100": 300.0, "rtx4090": 600.0}, 1200.0)
    nodes = rows(report(sm, "node"))
    assert {n: (r["jobs"], r["run_s"]) for n, r in nodes.items()} == {"n1": (0.5, 150.0), "n2": (0.5, 150.0)}
    assert report(sm, "tenant")["totals"]["jobs"] == 1


def test_percentiles_are_nearest_rank_and_the_histogram_gives_bucket_upper_edges():
    assert exact_percentile([], 50) is None
    assert [exact_percentile([5, 1, 3, 2, 4], p) for p in (50, 90, 99)] == [3, 5, 5]
    assert exact_percentile(list(range(1, 101)), 90) == 90
    assert wait_bucket(0) == 0 and wait_bucket(0.99) == 0 and wait_bucket(1) == 1 and wait_bucket(59.9) == 6
    assert histogram_percentile({wait_bucket(45): 9, wait_bucket(4000): 1}, 90) == 60.0
    assert histogram_percentile({wait_bucket(45): 9, wait_bucket(4000): 1}, 99) == 7200.0
    assert histogram_percentile({wait_bucket(90 * 86400): 1}, 50) == float(WAIT_EDGES_S[-1])


def test_a_day_must_be_a_real_yyyy_mm_dd_date():
    assert parse_day("2025-02-28", "--since") == "2025-02-28"
    for bad in ("2025-13-01", "2025-02-30", "20250101", "yesterday", "2025-1-1"):
        with pytest.raises(UsageError, match=r"--since .* YYYY-MM-DD"):
            parse_day(bad, "--since")


@pytest.mark.parametrize("module, args, needle", [
    ("mtgpu.cli.job", ["usage", "--since", "2025-13-01"], "--since '2025-13-01' is not a date"),
    ("mtgpu.cli.job", ["usage", "--until", "31/01/2025"], "--until '31/01/2025' is not a date: give YYYY-MM-DD"),
    ("mtgpu.cli.job", ["usage", "--by", "tenant"], "--by 'tenant': group by one of model, day, node"),
    ("mtgpu.cli.admin", ["usage", "--by", "week"], "group by one of tenant, model, node, day"),
    ("mtgpu.cli.admin", ["usage", "--since", "2025-02-01", "--until", "2025-01-01"], "is after --until"),
])
def test_bad_usage_flags_are_refused_naming_the_flag_before_any_request(module, args, needle, monkeypatch):
    import importlib
    monkeypatch.setenv("MTGPU_SOCKET", "/nonexistent/mtgpu.sock")
    app = importlib.import_module(module).app
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    assert needle in r.output

"""Accounting end to end (issue 16): a real node runs jobs of two tenants; `mtgpu-admin
usage` and `mt-job usage` give the run and wait seconds of the jobs' own records, and a
tenant sees only its own usage (docs/ACCOUNTING.md)."""

from __future__ import annotations

import json

import pytest

from tests.support.node import running_node
from tests.support.users import can_create_users

if can_create_users():
    pytest.skip(can_create_users(), allow_module_level=True)

GPUS = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 2}]


def shown(node, user, job_id: int) -> dict:
    r = node.mt_job(user, "show", "--json", str(job_id))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def usage_json(node, user, *args: str) -> dict:
    r = node.mt_job(user, "usage", "--json", *args) if user else node.admin("usage", "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_usage_reports_the_jobs_own_times_and_a_tenant_sees_only_its_own(alice, bob):
    with running_node(GPUS) as node:
        ids = [node.submit_json(alice, "--gpus", "1", "--cpus", "1", "--wrap", "sleep 0.3")["job_id"],
               node.submit_json(alice, "--gpus", "0.5", "--vram", "4G", "--wrap", "true")["job_id"]]
        theirs = node.submit_json(bob, "--gpus", "1", "--wrap", "true")["job_id"]
        for jid in ids + [theirs]:
            node.wait_state(jid, {"completed", "failed"})
        jobs = [shown(node, alice, jid) for jid in ids]
        run = sum(j["ended_at"] - j["started_at"] for j in jobs)
        wait = sum(j["started_at"] - j["submitted_at"] for j in jobs)
        gpu = sum((j["ended_at"] - j["started_at"]) * g["fraction"] for j in jobs for g in j["gpus"])
        cpu = sum((j["ended_at"] - j["started_at"]) * a["cpus"] for j in jobs for a in j["allocations"])
        assert [j["usage"]["run_s"] for j in jobs] == [j["ended_at"] - j["started_at"] for j in jobs]

        everyone = usage_json(node, None, "--by", "tenant")
        rows = {r["tenant"]: r for r in everyone["rows"]}
        assert set(rows) == {alice.name, bob.name}
        a = rows[alice.name]
        assert a["jobs"] == 2
        assert a["run_s"] == pytest.approx(run, abs=0.002) and a["wait_s"] == pytest.approx(wait, abs=0.002)
        assert a["gpu_s_by_model"] == {"rtx4090": pytest.approx(gpu, abs=0.002)}
        assert a["cpu_s"] == pytest.approx(cpu, abs=0.002)
        assert a["wait_exact"] and a["wait_p99_s"] == pytest.approx(max(j["started_at"] - j["submitted_at"]
                                                                         for j in jobs), abs=0.002)
        assert everyone["totals"]["jobs"] == 3

        mine = usage_json(node, alice)  # by model
        assert mine["by"] == "model" and [r["model"] for r in mine["rows"]] == ["rtx4090"]
        assert {k: mine["totals"][k] for k in ("jobs", "run_s", "wait_s", "gpu_s")} == \
            {k: a[k] for k in ("jobs", "run_s", "wait_s", "gpu_s")}  # bob's job is not in it
        assert usage_json(node, bob)["totals"]["jobs"] == 1
        today = jobs[0]["usage"]["day"]
        assert usage_json(node, alice, "--by", "day", "--since", today, "--until", today)["rows"][0]["jobs"] == 2
        assert usage_json(node, alice, "--until", "2000-01-01")["totals"]["jobs"] == 0

        r = node.mt_job(alice, "usage", "--by", "node")
        assert r.returncode == 0 and "node-a" in r.stdout and "TOTAL" in r.stdout, r.stderr
        r = node.admin("usage", "--by", "model")
        assert r.returncode == 0 and "rtx4090" in r.stdout, r.stderr
        r = node.run_cli("mtgpu.cli.admin", alice, "usage")  # every tenant's: admins only
        assert r.returncode != 0 and "mt-job usage" in r.stderr
        r = node.mt_job(alice, "usage", "--since", "2025-02-30")
        assert r.returncode == 2 and "--since '2025-02-30' is not a date" in r.stderr

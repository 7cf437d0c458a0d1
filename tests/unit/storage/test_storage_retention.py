"""storage.retention: what JOB_RETENTION_DAYS and TENANT_RETENTION_DAYS remove, at the boundaries."""

from __future__ import annotations

import json

from mtgpu.storage.retention import RetentionReport, TenantActivity, jobs_to_forget, tenants_to_remove

DAY = 86_400.0
NOW = 1_800_000_000.0
KEEP = 30 * DAY


def job(job_id, state, age_s, log="/var/lib/mtgpu/logs/x.log"):
    return (job_id, state, None if age_s is None else NOW - age_s, log)


def test_final_jobs_older_than_retention_are_forgotten_at_exactly_the_limit():
    jobs = [
        job("j-exact", "completed", KEEP),
        job("j-younger", "completed", KEEP - 1),
        job("j-older", "failed", KEEP + 1),
        job("j-cancelled", "cancelled", 2 * KEEP),
        job("j-lost", "lost", 40 * DAY),
    ]
    gone = [j.job_id for j in jobs_to_forget(jobs, NOW, KEEP)]
    assert gone == ["j-cancelled", "j-lost", "j-older", "j-exact"]


def test_queued_running_and_undated_jobs_are_never_forgotten():
    jobs = [job("q", "queued", 99 * DAY), job("r", "running", 99 * DAY), job("u", "completed", None),
            job("weird", "bogus-state", 99 * DAY)]
    assert jobs_to_forget(jobs, NOW, KEEP) == []


def test_idle_tenant_is_removed_at_exactly_the_limit_and_not_a_second_before():
    limit = 180 * DAY
    tenants = [
        ("exact", NOW - limit, NOW - limit - 5, 0),
        ("younger", NOW - limit + 1, None, 0),
        ("old", NOW - 2 * limit, NOW - 3 * limit, 0),
    ]
    assert [t.name for t in tenants_to_remove(tenants, NOW, limit)] == ["old", "exact"]


def test_a_recent_job_or_a_running_job_keeps_a_tenant():
    limit = 180 * DAY
    tenants = [
        ("recent-job", NOW - 2 * limit, NOW - DAY, 0),
        ("running", NOW - 2 * limit, NOW - 2 * limit, 1),
    ]
    assert tenants_to_remove(tenants, NOW, limit) == []


def test_a_tenant_never_seen_is_kept_until_its_authorization_is_old():
    limit = 180 * DAY
    assert tenants_to_remove([("new", None, None, 0)], NOW, limit) == []
    assert tenants_to_remove([TenantActivity("fresh", None, None, 0, NOW - DAY)], NOW, limit) == []
    assert [t.name for t in tenants_to_remove([("stale", None, None, 0, NOW - limit)], NOW, limit)] == ["stale"]


def test_dry_run_report_lists_what_would_go_and_serializes():
    report = RetentionReport.compute(
        [job("j1", "completed", 31 * DAY, "/logs/j1.log"), job("j2", "completed", DAY)],
        [("alice", NOW - 200 * DAY, None, 0), ("bob", NOW - DAY, None, 0)],
        NOW, KEEP, 180 * DAY,
    )
    text = report.render()
    assert "dry run" in text and "would remove 1" in text
    assert "j1" in text and "/logs/j1.log" in text and "31.0d ago" in text
    assert "alice" in text and "bob" not in text and "j2" not in text
    doc = json.loads(json.dumps(report.to_json()))
    assert [j["job_id"] for j in doc["jobs"]] == ["j1"] and [t["name"] for t in doc["tenants"]] == ["alice"]
    applied = RetentionReport.compute([], [], NOW, KEEP, 180 * DAY, dry_run=False)
    assert "removed 0" in applied.render()

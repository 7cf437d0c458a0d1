"""A member's standing (server/cluster/standing.py): in touch, or cut off since when, as
what, and what still works there; and how `mtgpu-admin nodes` and `mtgpu-setup status`
show it at 80 columns."""

from __future__ import annotations

import time

from mtgpu.cli.nodes_table import node_notes, nodes_text
from mtgpu.server.cluster.standing import Facts, Standing, clock_text, decide
from mtgpu.setup.node import role_of
from mtgpu.setup.status import standing_lines

WALL = 1_764_666_000.0  # the wall clock when `now` (monotonic 1000.0) was read
NOW = 1000.0


def facts(**kw) -> Facts:
    base = dict(node="m0", now=NOW, wall_now=WALL, leads=False, majority_heard_at=0.0, report_taken_at=0.0,
                started_at=100.0, stale_after_s=1.5, report_fresh_s=3.0)
    return Facts(**{**base, **kw})


def test_a_scheduler_that_hears_a_majority_is_in_touch_and_up():
    s = decide(facts(leads=True, majority_heard_at=NOW - 0.2))
    assert s.in_touch and s.health == "up" and s.problem is None and s.role("scheduler") == "scheduler"
    assert s.to_json()["majority_lost_at"] is None


def test_a_scheduler_still_leading_without_a_majority_says_it_lost_it_and_when():
    s = decide(facts(leads=True, majority_heard_at=NOW - 2.0))
    assert not s.in_touch and s.health == "degraded" and s.lost == "majority"
    assert s.role("scheduler") == "scheduler (no majority)"
    assert s.since_wall == WALL - 2.0 and s.to_json()["majority_lost_at"] == WALL - 2.0
    assert f"m0 was the scheduler and lost the majority of the voters at {clock_text(WALL - 2.0)} (2s ago)" \
        in s.problem
    assert s.reason == f"lost the majority at {clock_text(WALL - 2.0)} (2s ago)"


def test_a_scheduler_raft_no_longer_calls_leader_still_says_it_lost_the_majority_not_since_it_started():
    # it led since it started, so no report of it was ever taken: the moment is the majority's last answer
    s = decide(facts(leads=False, majority_heard_at=NOW - 40.0, report_taken_at=0.0))
    assert s.lost == "majority" and s.role("voter") == "scheduler (no majority)"
    assert "since it started" not in s.problem and f"at {clock_text(WALL - 40.0)} (40s ago)" in s.problem
    assert s.to_json()["majority_lost_at"] == WALL - 40.0 and s.to_json()["scheduler_reached_at"] is None


def test_a_member_cut_off_says_since_when_it_reached_no_scheduler():
    s = decide(facts(report_taken_at=NOW - 12.0))
    assert not s.in_touch and s.lost == "scheduler" and s.health == "degraded"
    assert s.role("voter") == "voter (no scheduler)"
    assert f"no scheduler reachable from m0 since {clock_text(WALL - 12.0)} (12s ago)" in s.problem
    assert s.to_json()["scheduler_reached_at"] == WALL - 12.0 and s.to_json()["majority_lost_at"] is None


def test_only_a_member_that_never_reached_a_scheduler_says_since_it_started():
    s = decide(facts(started_at=NOW - 30.0))
    assert "no scheduler reachable from m0 since it started (30s ago)" in s.problem
    assert s.since_wall is None and s.to_json()["scheduler_reached_at"] is None


def test_the_last_contact_decides_the_role_it_lost():
    # it was the scheduler, handed over, reported as a member, then was cut off: it lost the scheduler
    s = decide(facts(majority_heard_at=NOW - 60.0, report_taken_at=NOW - 10.0))
    assert s.lost == "scheduler"
    # a scheduler that just handed over is in touch until its first report as a member is taken
    assert decide(facts(majority_heard_at=NOW - 1.0, other_leader=True)).in_touch
    assert decide(facts(report_taken_at=NOW - 2.9)).in_touch


def test_a_scheduler_raft_stopped_calling_leader_a_moment_ago_is_cut_off_unless_another_leads():
    # pysyncobj drops a leader whose followers' connections broke before its fallback
    # timeout: it knows no other leader, so it is not a handover
    s = decide(facts(majority_heard_at=NOW - 2.0, other_leader=False))
    assert not s.in_touch and s.lost == "majority" and s.role("voter") == "scheduler (no majority)"


def test_what_works_says_until_when_the_jobs_here_run_and_that_they_are_then_stopped():
    s = decide(facts(leads=True, majority_heard_at=NOW - 2.0, lease_ends_at=NOW + 5.0, jobs_here=2))
    assert s.jobs_stop_wall == WALL + 5.0 and not s.jobs_stopped
    jobs = [w for w in s.works if "lease" in w]
    assert jobs == [f"its 2 running job(s) and workspace(s), until {clock_text(WALL + 5.0)} (in 5s), when their "
                    "lease ends: then they are stopped, so that none runs twice (the majority's scheduler requeues "
                    "them)"]
    assert any("logs of the jobs that ran on this member" in w for w in s.works)
    assert any("submitting, cancelling" in f for f in s.fails) and any("placing jobs" in f for f in s.fails)
    later = decide(facts(majority_heard_at=NOW - 20.0, lease_ends_at=NOW - 1.0, jobs_here=2))
    assert later.jobs_stopped and any("were stopped" in w for w in later.works)


def test_a_member_without_a_lease_says_nothing_about_its_jobs_lease():
    s = decide(facts(report_taken_at=NOW - 12.0))
    assert s.jobs_stop_wall is None and not any("lease" in w for w in s.works)


# ---------------------------------------------------------------- shown at 80 columns
def node_row(name: str, role: str, state: str, reason: str = "", standing: dict | None = None) -> dict:
    gpu = {"index": 0, "vendor": "nvidia", "model": "NVIDIA GeForce RTX 4090", "vram_total_bytes": 24 << 30,
           "vram_used_bytes": 1 << 30, "utilization_pct": 37.0, "committed_fraction": 0.5,
           "committed_vram_bytes": 12 << 30, "exclusive": False}
    row = {"name": name, "role": role, "state": state, "reason": reason, "cpus": 16.0, "cpus_committed": 4.0,
           "mem_total_bytes": 64 << 30, "mem_committed_bytes": 8 << 30, "gpus": [gpu, {**gpu, "index": 1}],
           "containers": None}
    if standing is not None:
        row["standing"] = standing
    return row


def rendered(nodes: list[dict]) -> list[str]:
    return nodes_text(nodes, 80).splitlines()


def test_the_nodes_table_of_a_cut_off_scheduler_fits_80_columns_and_says_what_works_there():
    s = decide(facts(leads=True, majority_heard_at=NOW - 2.0, lease_ends_at=NOW + 5.0, jobs_here=1))
    nodes = [node_row("m0", s.role("scheduler"), s.health, s.reason, s.to_json()),
             node_row("m1", "voter?", "unknown", s.problem), node_row("m2", "voter?", "unknown", s.problem)]
    lines = rendered(nodes)
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    text = "\n".join(lines)
    head = next(line for line in lines if line.startswith("m0"))
    assert "scheduler" in head and "degraded" in head and " up " not in head
    assert "(no majority)" in text
    assert f"m0 (degraded): lost the majority at {clock_text(WALL - 2.0)} (2s ago)" in text
    assert text.count("m1, m2 (unknown): m0 was the scheduler and lost the majority") == 1  # once for both
    assert "m0 still serves:" in text and "m0 cannot do now:" in text
    assert "lease ends" in text and "submitting, cancelling" in text


def test_the_nodes_table_of_a_healthy_cluster_has_no_notes():
    nodes = [node_row("m0", "scheduler", "up"), node_row("m1", "voter", "up")]
    assert node_notes(nodes) == []
    assert max(len(line) for line in rendered(nodes)) <= 80


def test_setup_status_names_the_cut_off_role_and_its_health_at_80_columns():
    s = decide(facts(majority_heard_at=NOW - 40.0, lease_ends_at=NOW - 1.0, jobs_here=1)).to_json()
    health = {"cluster_mode": "cluster", "raft": {"is_leader": False}, "standing": s}
    assert role_of(health) == "leader (no majority)"
    lines = standing_lines(s)
    assert lines[0].startswith("health:   degraded: m0 was the scheduler and lost the majority")
    assert max(len(line) for line in lines) <= 80, lines
    assert any(line.startswith("works:    - ") for line in lines) and any(line.startswith("fails:    - ")
                                                                          for line in lines)
    member = decide(facts(report_taken_at=NOW - 5.0)).to_json()
    assert role_of({"cluster_mode": "cluster", "raft": {"is_leader": False}, "standing": member}) == \
        "follower (no scheduler)"
    assert standing_lines(Standing(True).to_json()) == ["health:   up"]
    assert standing_lines(None) == []


def test_clock_text_is_the_local_time_of_day():
    assert clock_text(WALL) == time.strftime("%H:%M:%S", time.localtime(WALL))

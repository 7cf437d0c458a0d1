"""Opportunistic jobs yield (issue 28 point 7, docs/SCHEDULING.md "Preemption"), end to
end on a real node with one simulated GPU: a guaranteed job that fits nowhere stops the
oversubscribed job in its way (SIGTERM, SIGKILL after [PREEMPTION] grace), starts, and
the stopped job is requeued with its history saying by which job, then runs again; one
that says requeue=no is cancelled; with [PREEMPTION] enabled = false the guaranteed job
waits, as before."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.node import running_node, wait_for
from tests.support.users import can_create_users

if can_create_users():
    pytest.skip(can_create_users(), allow_module_level=True)

RTX1 = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 1}]
GRACE = {"grace": "3s"}


def opportunistic(tag: str, marks: Path, on_term: str, requeue: str = "yes") -> str:
    """An oversubscribed job that marks its starts and what it does on SIGTERM, then works
    until stopped (short sleeps, so that bash runs its trap at once)."""
    return (f"#!/bin/bash\n#MTGPU gpus=1 gpu-mode=oversubscribe name={tag} requeue={requeue}\n"
            f"echo start-{tag} >> {marks}\n"
            f"trap '{on_term}' TERM\n"
            "while true; do sleep 0.1; done\n")


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_a_guaranteed_job_preempts_an_oversubscribed_one_which_checkpoints_and_runs_again(alice, base):
    marks = base / "marks"
    marks.touch()
    os.chown(marks, alice.uid, alice.gid)
    with running_node(RTX1, PREEMPTION=GRACE) as node:
        victim = node.submit_json(alice, script=opportunistic("over", marks, f"echo term-over >> {marks}; exit 0"))
        victim = victim["job_id"]
        node.wait_state(victim, "running", timeout_s=60)
        wait_for("the oversubscribed job to start", lambda: "start-over" in lines(marks), timeout_s=30)
        guaranteed = node.submit_json(alice, script=f"#!/bin/bash\n#MTGPU gpus=1 name=exclusive\n"
                                                    f"echo ran-exclusive >> {marks}\n")["job_id"]
        node.wait_state(guaranteed, "completed", timeout_s=90)
        job = node.wait_state(victim, {"running", "queued"}, timeout_s=30)
        assert lines(marks)[:3] == ["start-over", "term-over", "ran-exclusive"], lines(marks)
        history = job["history"]
        assert len(history) == 1 and history[0]["preempted_by"] == guaranteed, history
        assert f"preempted by job {guaranteed}" in history[0]["outcome"], history
        assert "exited with status 0" in history[0]["outcome"] and history[0]["outcome"].endswith("requeued")
        assert job["preempted"] and job["attempt"] == 1
        # it runs again once the guaranteed job has its GPU no more
        wait_for("the preempted job to run again", lambda: lines(marks).count("start-over") == 2, timeout_s=60)
        ex = node.job(guaranteed)
        assert ex["started_at"] >= history[0]["ended_at"], (ex, history)  # it waited for the victim to stop


def test_one_that_ignores_sigterm_is_killed_after_the_grace_and_requeue_no_cancels_it(alice, base):
    marks = base / "marks"
    marks.touch()
    os.chown(marks, alice.uid, alice.gid)
    with running_node(RTX1, PREEMPTION=GRACE) as node:
        victim = node.submit_json(alice, script=opportunistic("stubborn", marks, f"echo term-stubborn >> {marks}",
                                                              requeue="no"))["job_id"]
        node.wait_state(victim, "running", timeout_s=60)
        wait_for("the oversubscribed job to start", lambda: "start-stubborn" in lines(marks), timeout_s=30)
        guaranteed = node.submit_json(alice, script="#!/bin/bash\n#MTGPU gpus=1\ntrue\n")["job_id"]
        job = node.wait_state(victim, "cancelled", timeout_s=90)
        assert f"preempted by job {guaranteed}" in job["reason"] and "requeue=no" in job["reason"], job
        assert "did not end within the 3s grace period: killed" in job["reason"], job
        assert "term-stubborn" in lines(marks)  # it had its SIGTERM first
        node.wait_state(guaranteed, "completed", timeout_s=60)
        assert lines(marks).count("start-stubborn") == 1


def test_with_preemption_off_the_guaranteed_job_waits(alice, base):
    marks = base / "marks"
    marks.touch()
    os.chown(marks, alice.uid, alice.gid)
    with running_node(RTX1, PREEMPTION={"enabled": False}) as node:
        victim = node.submit_json(alice, script=opportunistic("kept", marks, "exit 0"))["job_id"]
        node.wait_state(victim, "running", timeout_s=60)
        guaranteed = node.submit_json(alice, script="#!/bin/bash\n#MTGPU gpus=1\ntrue\n")["job_id"]
        wait_for("the guaranteed job's pending reason", lambda: node.job(guaranteed)["reason"], timeout_s=30)
        job = node.job(guaranteed)
        assert job["state"] == "queued" and "preempt" not in job["reason"], job
        assert node.job(victim)["state"] == "running" and "term" not in " ".join(lines(marks))

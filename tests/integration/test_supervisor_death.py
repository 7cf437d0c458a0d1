"""A job whose supervisor (its shim) is killed with the server (issue 23): its keeper still
records its own end; with the keeper killed too, it is never run a second time, since it
may have run to its end, and its record says what is known; a job killed by a restart of
its machine is requeued when it may be (requeue=, JOB_REQUEUE).

The machine's restart is simulated as the runner sees one: the job's processes are
gone, and its start was recorded in another boot (started.json's boot id)."""

from __future__ import annotations

import json

import pytest

from tests.support.node import running_node, wait_for
from tests.support.runs import (as_if_started_in_another_boot, kill_server_and_shim, kill_the_job, kill_the_keeper,
                                lines_of, running_marked_job)
from tests.support.users import can_create_users

if can_create_users():
    pytest.skip(can_create_users(), allow_module_level=True)

RTX1 = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 1}]


def test_a_job_that_outlived_its_killed_supervisor_ends_with_its_own_status_and_runs_once(alice):
    with running_node(RTX1) as node, running_marked_job(node, alice) as (jid, marker, flag):
        kill_server_and_shim(node, jid)
        node.start()
        assert "its supervisor (shim) is gone: its keeper records its end" in node.server_log()
        assert node.job(jid)["state"] == "running"
        flag.touch()  # the job ends by itself; its keeper records how
        job = node.wait_state(jid, {"completed", "failed", "lost", "queued"}, timeout_s=30)
        assert job["state"] == "completed" and job["exit_code"] == 0, job
        assert job["history"] == [] and job["attempt"] == 0
        assert lines_of(marker) == ["run"]  # once


def test_a_job_whose_supervisor_and_keeper_were_killed_fails_with_its_status_unknown_and_runs_once(alice):
    with running_node(RTX1) as node, running_marked_job(node, alice) as (jid, marker, flag):
        kill_server_and_shim(node, jid)
        kill_the_keeper(node, jid)  # the job proper runs on: nobody can learn its exit status
        node.start()
        assert node.job(jid)["state"] == "running"
        flag.touch()
        job = node.wait_state(jid, {"completed", "failed", "lost", "queued"}, timeout_s=30)
        assert job["state"] == "failed" and job["exit_code"] is None, job
        assert "its supervisor (the job's shim) was killed in this boot" in job["reason"], job["reason"]
        assert "ran on without it until" in job["reason"] and "exit status is unknown" in job["reason"]
        assert "not requeued" in job["reason"] and job["history"] == [] and job["attempt"] == 0
        r = node.mt_job(alice, "show", "--json", str(jid))
        assert r.returncode == 0 and json.loads(r.stdout)["reason"] == job["reason"]
        node.wait_state(jid, "failed")
        assert lines_of(marker) == ["run"]  # once


def test_a_job_killed_by_a_restart_of_its_machine_is_requeued_when_it_asked_to_be(alice):
    with running_node(RTX1) as node, running_marked_job(node, alice, "requeue=yes") as (jid, marker, flag):
        kill_server_and_shim(node, jid)
        kill_the_job(node, jid)
        as_if_started_in_another_boot(node, jid)
        node.start()
        job = wait_for("the job to be requeued and run again",
                       lambda: (j := node.job(jid))["attempt"] == 1 and j["state"] == "running" and j, timeout_s=30)
        [h] = job["history"]
        assert h["attempt"] == 0 and h["nodes"] == ["node-a"], h
        assert "the machine restarted while it ran" in h["outcome"] and "requeued" in h["outcome"], h
        wait_for("the second run's marker", lambda: lines_of(marker) == ["run", "run"], timeout_s=30)
        flag.touch()
        assert node.wait_state(jid, {"completed", "failed"}, timeout_s=30)["state"] == "completed"


def test_job_requeue_false_in_the_config_is_the_default_a_job_can_override(alice):
    with running_node(RTX1, JOB_REQUEUE=False) as node, running_marked_job(node, alice) as (jid, marker, flag):
        assert node.job(jid)["spec"]["requeue"] is False
        kill_server_and_shim(node, jid)
        kill_the_job(node, jid)
        as_if_started_in_another_boot(node, jid)
        node.start()
        job = node.wait_state(jid, {"lost", "failed", "completed"}, timeout_s=30)
        assert job["state"] == "lost" and "asked not to be requeued" in job["reason"], job
        assert "the machine restarted while it ran" in job["reason"] and lines_of(marker) == ["run"]
        # the job's own directive wins over the node's default
        jid2 = node.submit_json(alice, "--requeue", "yes", "--wrap", "true")["job_id"]
        assert node.wait_state(jid2, "completed")["spec"]["requeue"] is True

"""A member whose wall clock jumps (forward or back an hour, as a resumed VM or a broken
NTP does) stays in the cluster: its reports are taken, it gets work, its running job is
not cut short by its time limit, and nothing runs twice; the same when the jump is on
the scheduler. Each member's clock is moved alone (tests/support/clockjump.c), the
machine's is left alone."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path

import pytest

from tests.support import clockjump
from tests.support.cluster import member_name, running_cluster
from tests.support.node import wait_for
from tests.support.users import can_create_users

if can_create_users() or clockjump.missing():
    pytest.skip(can_create_users() or clockjump.missing(), allow_module_level=True)

HOUR = 3600.0


def _nodes(node) -> dict[str, dict]:
    r = node.admin("nodes", "--json")
    assert r.returncode == 0, r.stderr
    return {n["name"]: n for n in json.loads(r.stdout)}


def _marks(user) -> Path:
    d = Path(tempfile.mkdtemp(prefix="clockjump-marks-", dir=user.home))
    os.chown(d, user.uid, user.gid)
    return d


def _held_job(marks: Path, server: str) -> str:
    """Runs until its flag file exists; writes where (and how often) it started."""
    return (f"#!/bin/bash\n#MTGPU server={server} time=5m\n"
            f"echo \"$MTGPU_NODE\" >> {marks}/starts-$MTGPU_JOB_ID\n"
            f"while [ ! -e {marks}/go ]; do sleep 0.1; done\n")


def _quick_job_completes(node, user, server: str) -> None:
    jid = node.submit_json(user, script=f"#!/bin/bash\n#MTGPU server={server}\necho ok\n")["job_id"]
    job = node.wait_state(jid, {"completed", "failed"}, timeout_s=60)
    assert job["state"] == "completed" and job["nodes"] == [server], job


def _still_fine(sched, held: int, names: list[str], window_s: float) -> None:
    """Watched for longer than a silent member takes to be marked down: every member stays
    up, and the held job runs on in its first attempt, at every look."""
    end = time.monotonic() + window_s
    while time.monotonic() < end:
        nodes = _nodes(sched)
        for name in names:
            assert nodes[name]["state"] != "down", (name, nodes[name])
        job = sched.job(held)
        assert job["state"] == "running" and job["attempt"] == 0, job
        time.sleep(1.0)


def test_a_member_or_the_scheduler_whose_clock_jumps_stays_in_and_runs_nothing_twice(alice):
    clocks = [clockjump.ClockJump() for _ in range(3)]
    try:
        with running_cluster(3, down_after_s=6.0, prefixes=[c.prefix() for c in clocks]) as cl:
            sched = cl.scheduler()
            by_name = {member_name(m): (m, c) for m, c in zip(cl.members, clocks)}
            names = sorted(by_name)
            other = next(n for n in names if n != member_name(sched))
            marks = _marks(alice)
            held = sched.submit_json(alice, script=_held_job(marks, other))["job_id"]
            sched.wait_state(held, "running")
            settle_s = cl.down_after_s + 2

            # a member set an hour forward
            by_name[other][1].jump(HOUR)
            _still_fine(sched, held, names, settle_s)
            _quick_job_completes(sched, alice, other)
            assert "signing in its time from now on" in by_name[other][0].server_log()

            # then that member set an hour back (two from where it was) and the scheduler an
            # hour forward: every member's reports are still taken
            by_name[other][1].jump(-HOUR)
            by_name[member_name(sched)][1].jump(HOUR)
            _still_fine(sched, held, names, settle_s)
            for name in names:
                _quick_job_completes(sched, alice, name)
            assert cl.scheduler() is sched

            (marks / "go").touch()
            job = sched.wait_state(held, {"completed", "failed"}, timeout_s=60)
            assert job["state"] == "completed" and job["attempt"] == 0, job
            assert (marks / f"starts-{held}").read_text().split() == [other]
    finally:
        for c in clocks:
            with contextlib.suppress(OSError):
                c.close()

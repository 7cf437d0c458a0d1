"""A member cut off from the cluster (issue 12): it says that what it shows may be out of
date instead of showing the last committed roles as current."""

from __future__ import annotations

import json

from tests.support.cluster import member_name, running_cluster
from tests.support.node import wait_for


def test_a_member_left_alone_says_no_scheduler_is_reachable_instead_of_showing_the_dead_as_up(alice):
    with running_cluster(3) as cl:
        sched = cl.scheduler()
        alone = next(m for m in cl.members if m is not sched)
        jid = alone.submit_json(alice, "--wrap", "true")["job_id"]
        alone.wait_state(jid, {"completed", "failed"}, timeout_s=60)
        for m in cl.members:
            if m is not alone:
                m.kill9()

        def nodes():
            r = alone.admin("nodes", "--json")
            assert r.returncode == 0, r.stderr
            view = json.loads(r.stdout)
            return (view, r.stderr) if all(n["state"] == "unknown" for n in view
                                           if n["name"] != member_name(alone)) else None
        view, stderr = wait_for("the survivor to say it is cut off", nodes, timeout_s=60, interval_s=0.5)
        dead = [n for n in view if n["name"] != member_name(alone)]
        assert len(dead) == 2 and all("no scheduler reachable from" in n["reason"] for n in dead), view
        assert all(n["role"].endswith("?") for n in dead), view  # the last known role, not a current one
        assert "warning: no scheduler reachable from" in stderr
        r = alone.mt_job(alice, "list")
        assert r.returncode == 0 and "warning: no scheduler reachable from" in r.stderr, r.stderr
        r = alone.mt_job(alice, "show", str(jid))
        assert r.returncode == 0 and "maybe out of date" in r.stderr, r.stderr

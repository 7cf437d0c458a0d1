"""A cluster split across two NATed sites (issue 13): members m0 and m1 in private
network A, m2 in private network B, neither site able to reach the other; all three
connect out to a relay on the "public" network and reach each other's cluster HTTP and
Raft ports through DirectLink. The cluster forms with all three voting, places a job on
the member behind the other NAT (its reports, its job's log), and fails over when the
scheduler is killed: the two survivors are in different sites, so the new scheduler's
majority is only there because m2's vote crossed the NATs."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys

import pytest

from mtgpu.directlink.identity import cluster_key, endpoint_id
from tests.support.cluster import member_name, running_cluster
from tests.support.dllab import PORT, Proc
from tests.support.natlab import NatLab, netlab_missing
from tests.support.node import free_port, wait_for

if os.geteuid() != 0 or netlab_missing():
    pytest.skip(netlab_missing() or "network namespaces need root", allow_module_level=True)

GPU = {"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G"}
# m0 is the most capable (it becomes the scheduler, in site A); only m2 (site B) has an A100
GPUS = [[dict(GPU, count=4)], [dict(GPU, count=2)],
        [{"model": "NVIDIA A100-SXM4-80GB", "vendor": "nvidia", "vram": "80G", "count": 1}]]


class Sites:
    """running_cluster's view of the NAT lab: m0 and m1 in site A, m2 in site B."""

    def __init__(self, lab: NatLab) -> None:
        self.lab = lab
        self.sides = ["a", "a", "b"]
        self.addresses = [lab.host_ip[s] for s in self.sides]

    def prefix(self, i: int) -> list[str]:
        return self.lab.prefix(self.sides[i])


def reaches(lab: NatLab, side: str, address: str) -> bool:
    host, port = address.rsplit(":", 1)
    r = subprocess.run(lab.prefix(side) + ["timeout", "5", "bash", "-c", f"exec 3<>/dev/tcp/{host}/{port}"],
                       capture_output=True, timeout=30)
    return r.returncode == 0


def test_a_cluster_split_across_two_nats_forms_runs_jobs_and_fails_over(alice):
    secret = secrets.token_urlsafe(48)
    with NatLab() as lab:
        relay_at = f"{lab.relay_ip}:{PORT}"
        relay = Proc(lab.prefix("relay") + [sys.executable, "-m", "mtgpu.cli.relay", "--listen", relay_at,
                                            "--cluster", f"test-lab={endpoint_id(cluster_key(secret, 'test-lab'))}"])
        try:
            sites = Sites(lab)
            settings = [{"DIRECTLINK": {"relays": [relay_at]}, "SSH_LISTEN": f"127.0.0.1:{free_port()}"}
                        for _ in range(3)]
            with running_cluster(3, gpus=GPUS, settings=settings, lab=sites, secret=secret,
                                 down_after_s=6.0) as cl:
                m0, m1, m2 = cl.members
                a_api, b_api = f"{lab.host_ip['a']}:7070", f"{lab.host_ip['b']}:7070"
                assert not reaches(lab, "b", a_api) and not reaches(lab, "a", b_api)  # the sites are apart
                assert reaches(lab, "a", a_api)

                # All three vote (Raft through the relay), and the most capable, m0, schedules.
                wait_for("m0 to become the scheduler", lambda: member_name(cl.scheduler()) == "m0",
                         timeout_s=90, interval_s=1)

                def all_vote():
                    r = m0.admin("nodes", "--json")
                    assert r.returncode == 0, r.stderr
                    nodes = {n["name"]: n for n in json.loads(r.stdout)}
                    return len(nodes) == 3 and all(n["state"] == "up" for n in nodes.values()) and \
                        sorted(n["role"] for n in nodes.values()) == ["scheduler", "voter", "voter"]
                wait_for("m2 to report to the scheduler and vote", all_vote, timeout_s=60, interval_s=0.5)

                # A job that only m2 can run: placed by m0 in site A, run in site B, its log read from A.
                mark = "ran-behind-b-" + secrets.token_hex(3)
                script = f"#!/bin/bash\n#MTGPU gpus=a100:1\necho {mark} $MTGPU_NODE\n"
                first = m0.submit_json(alice, script=script)["job_id"]
                done = m0.wait_state(first, {"completed", "failed"}, timeout_s=90)
                assert done["state"] == "completed" and done.get("node") in (None, "m2"), done
                r = m0.mt_job(alice, "logs", str(first))
                assert r.returncode == 0 and r.stdout.split() == [mark, "m2"], r.stdout + r.stderr
                assert "through 127.0.0.1:" in m2.server_log(), m2.server_log()  # it used the routes

                # The scheduler dies: m1 (site A) and m2 (site B) elect a new one between them.
                m0.kill9()
                new = cl.scheduler(among=[m1, m2])
                assert member_name(new) in ("m1", "m2")
                second = new.submit_json(alice, script=script)["job_id"]
                third = new.submit_json(alice, "--gpus", "1", "--wrap", f"echo on-a-{mark}")["job_id"]
                for jid in (second, third):
                    assert new.wait_state(jid, {"completed", "failed"}, timeout_s=90)["state"] == "completed"
                r = new.mt_job(alice, "logs", str(second))
                assert r.returncode == 0 and r.stdout.split() == [mark, "m2"], r.stdout + r.stderr
                r = new.mt_job(alice, "logs", str(third))
                assert r.returncode == 0 and r.stdout.strip() == f"on-a-{mark}", r.stdout + r.stderr
                # m2 sees the same cluster and the same jobs as m1 (its replica is through the relay too)
                wait_for("m2's replica to have the last job", lambda: m2.job(third)["state"] == "completed",
                         timeout_s=60)
                assert m2.job(first)["state"] == "completed"
        finally:
            relay.stop()

"""Many clusters, one admin (issue 29 point 3), with two real clusters on loopback (each a
founding member of its own, with its own CLUSTER_ID and secret): the admin of both keeps a
book of its clusters, `mtgpu-admin clusters` shows them and their health, `tenant assign
--cluster` gives a tenant the other cluster with the same name, uid, gid and key (a job
there runs as the same uid), the tenant's `remotegpu-cli clusters` then lists exactly its
clusters (the servers file the terminal app and VS Code read), and `tenant unassign` takes
it away: that cluster refuses the tenant's requests, naming itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support.folders import traversable_folder
from tests.support.laptop import invite_and_join, remotegpu
from tests.support.node import PYTHON, free_port, running_node, wait_for
from tests.support.users import can_create_users, stop_node_and_remove_tenants

if can_create_users():
    pytest.skip(can_create_users(), allow_module_level=True)

UID_RANGE = (492000, 492999)  # its own: the accounts these nodes make never meet another test's


def admin(node, book: Path, *args: str) -> subprocess.CompletedProcess:
    """mtgpu-admin as root on `node`, with `book` as its clusters book."""
    return subprocess.run([PYTHON, "-m", "mtgpu.cli.admin", *args], capture_output=True, text=True, timeout=60,
                          env={**node.env_for("/root"), "MTGPU_CLUSTERS_BOOK": str(book), "COLUMNS": "80"})


def test_one_admin_runs_two_clusters_and_gives_a_tenant_the_second_and_takes_it_away():
    name = f"mc{os.getpid() % 10000}"
    laptop = Path(tempfile.mkdtemp(prefix="mtgpu-mc-laptop-"))
    with traversable_folder("mtgpu-mc-homes-") as homes, \
            running_node([], name="a1", CLUSTER_MODE="cluster", CLUSTER_ID="lab-a", TENANT_UID_RANGE=list(UID_RANGE),
                         TENANT_HOME_ROOT=str(homes), SSH_LISTEN=f"127.0.0.1:{free_port()}") as a, \
            running_node([], name="b1", CLUSTER_MODE="cluster", CLUSTER_ID="lab-b", TENANT_UID_RANGE=list(UID_RANGE),
                         TENANT_HOME_ROOT=str(homes), SSH_LISTEN=f"127.0.0.1:{free_port()}") as b:
        book = a.base / "clusters.json"
        try:
            # ---- the book: only a cluster that answers, signed with its own secret, under its own id
            r = admin(a, book, "clusters", "--json")
            assert r.returncode == 0, r.stderr
            assert [c["cluster_id"] for c in json.loads(r.stdout)] == ["lab-a"], r.stdout
            r = admin(a, book, "clusters", "add", "lab-b", "--server", f"127.0.0.1:{b.port}",
                      "--secret-file", str(a.state_dir / "cluster.secret"))
            assert r.returncode != 0 and "answered 401" in r.stderr and "cluster secret" in r.stderr, r.stderr
            r = admin(a, book, "clusters", "add", "lab-x", "--server", f"127.0.0.1:{b.port}",
                      "--secret-file", str(b.state_dir / "cluster.secret"))
            assert r.returncode == 2 and "serves cluster 'lab-b', not 'lab-x'" in r.stderr, r.stderr
            assert not book.exists()
            r = admin(a, book, "clusters", "add", "lab-b", "--server", f"127.0.0.1:{b.port}",
                      "--secret-file", str(b.state_dir / "cluster.secret"))
            assert r.returncode == 0 and "cluster lab-b added" in r.stdout, r.stderr
            assert oct(book.stat().st_mode & 0o777) == "0o600"
            def both_up():  # each member registered in its cluster, and its own scheduler
                listed = json.loads(admin(a, book, "clusters", "--json").stdout)
                return [(c["cluster_id"], c["state"], c.get("members_up"), c.get("members")) for c in listed] == \
                    [("lab-a", "ok", 1, 1), ("lab-b", "ok", 1, 1)] or print(listed)
            wait_for("both clusters listed, each with its member up", both_up, timeout_s=60, interval_s=0.5)
            table = admin(a, book, "clusters").stdout
            assert "lab-a" in table and "lab-b" in table and all(len(line) <= 80 for line in table.splitlines()), table

            # ---- a tenant of lab-a is given lab-b: the same ids and key there
            pw = invite_and_join(a, name, laptop)
            r = admin(a, book, "tenant", "assign", name, "--cluster", "lab-z")
            assert r.returncode == 2 and "lab-z: not this cluster (lab-a) and not in the clusters book" in r.stderr
            r = admin(a, book, "tenant", "assign", name, "--cluster", "lab-a", "--cluster", "lab-b")
            assert r.returncode == 0, r.stderr
            there = {t["name"]: t for t in json.loads(b.admin("tenant", "list", "--json").stdout)}
            here = {t["name"]: t for t in json.loads(a.admin("tenant", "list", "--json").stdout)}
            assert (there[name]["uid"], there[name]["gid"], there[name]["keys"]) == \
                (pw.pw_uid, pw.pw_gid, here[name]["keys"]), (there, here)
            assert here[name]["clusters"] == there[name]["clusters"] == ["lab-a", "lab-b"]

            # ---- the tenant's client lists exactly its clusters, and lab-b runs its job as the same uid
            r = remotegpu(laptop, "clusters", "--json")
            assert r.returncode == 0, r.stderr
            assert {(c["cluster_id"], c["state"]) for c in json.loads(r.stdout)} == {("lab-a", "ok"), ("lab-b", "added")}
            servers = json.loads((laptop / "servers.json").read_text())
            assert sorted(s["cluster_id"] for s in servers) == ["lab-a", "lab-b"], servers
            r = remotegpu(laptop, "whoami", "--server", "lab-b", "--json")
            assert r.returncode == 0 and json.loads(r.stdout)["uid"] == pw.pw_uid, r.stderr
            job_file = laptop / "whoami.sh"
            job_file.write_text("#!/bin/bash\n#MTGPU cpus=1 mem=100M\nid -u\n")
            r = remotegpu(laptop, "submit", "--server", "lab-b", "--json", str(job_file))
            assert r.returncode == 0, r.stderr + b.server_log()[-2000:]
            jid = json.loads(r.stdout)["job_id"]
            job = b.wait_state(jid, {"completed", "failed"}, timeout_s=120)
            assert job["state"] == "completed", job
            log = remotegpu(laptop, "logs", str(jid), "--server", "lab-b")
            assert log.stdout.strip() == str(pw.pw_uid), (log.stdout, log.stderr)

            # ---- lab-b is taken away: it refuses the tenant, and the client drops it
            r = admin(a, book, "tenant", "unassign", name, "--cluster", "lab-b")
            assert r.returncode == 0 and "clusters lab-a" in r.stdout, r.stderr
            r = remotegpu(laptop, "whoami", "--server", "lab-b")
            assert r.returncode != 0 and f"tenant {name!r} is not authorized for cluster 'lab-b'" in r.stderr, r.stderr
            r = remotegpu(laptop, "clusters", "--json")
            rows = {c["cluster_id"]: c["state"] for c in json.loads(r.stdout)}
            assert rows["lab-a"] == "ok" and rows["lab-b"].startswith("removed: "), rows
            servers = json.loads((laptop / "servers.json").read_text())
            assert [s["cluster_id"] for s in servers] == ["lab-a"], servers
            assert remotegpu(laptop, "whoami", "--json").returncode == 0
        finally:
            problems = stop_node_and_remove_tenants(b, [], UID_RANGE)
            problems += stop_node_and_remove_tenants(a, [name], UID_RANGE)
            shutil.rmtree(laptop, ignore_errors=True)
            assert not problems, problems

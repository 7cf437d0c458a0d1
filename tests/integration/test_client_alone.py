"""The laptop client alone (issue 27 point 8): both wheels built from the tree, the client's
(mtgpu-client) installed alone into a clean virtual environment, its dependencies from the
package index; none of the server is there to import, and that environment's `remotegpu-cli`
drives a real node: join with an invitation code, servers (the joined list and asked live),
submit a job, its log, ssh-config, and plain `ssh` through the block it wrote (its ProxyCommand
is that environment's remotegpu-cli, through the node's DirectLink relay).

The node runs from this checkout, as in every test; only the client comes from the clean
environment, run from / with no PYTHONPATH, so nothing of the checkout can stand in for it.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.laptop import isolated_client_env, join, remotegpu
from tests.support.node import free_port, running_node, wait_for
from tests.support.users import can_create_users, stop_node_and_remove_tenants
from tests.unit.test_client_distribution import tree_copy

if can_create_users():
    pytest.skip(can_create_users(), allow_module_level=True)

UID_RANGE = (540000, 544999)  # its own: the accounts this node makes never meet another test's
CLUSTER = "lab-client-alone"
# the server's dependencies (import names), none of which a client-only environment holds
SERVER_MODULES = ("fastapi", "starlette", "uvicorn", "httptools", "uvloop", "pysyncobj", "numpy", "pynvml",
                  "prometheus_client", "orjson")


@pytest.fixture(scope="module")
def client_alone(tmp_path_factory):
    """The remotegpu-cli of a clean virtual environment that holds mtgpu-client's wheel alone
    (and its dependencies); the environment and the wheels are removed after."""
    base = tmp_path_factory.mktemp("client-alone")
    try:
        src = base / "src"
        src.mkdir()
        tree_copy(src)
        wheels = base / "wheels"
        clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
        r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels),
                            "./clients/python", "."], cwd=src, env=clean, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        built = sorted(p.name for p in wheels.iterdir())
        [client_wheel] = [w for w in built if w.startswith("mtgpu_client-")]
        assert [w for w in built if w.startswith("mtgpu-")], built  # the server's builds too
        venv = base / "venv"
        r = subprocess.run([sys.executable, "-m", "venv", str(venv)], cwd=base, env=clean, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        r = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheels / client_wheel)],
                           cwd=base, env=clean, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        yield venv / "bin" / "remotegpu-cli"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def in_client_env(program: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(program.parent / "python"), "-c", code], capture_output=True, text=True, cwd="/",
                          env=isolated_client_env(program, program.parent), timeout=60)


def test_the_client_environment_holds_the_client_and_nothing_of_the_server(client_alone):
    r = in_client_env(client_alone, "import importlib.metadata as m, importlib.util as u, json, sys, mtgpu; "
                      f"print(json.dumps({{'found': [n for n in {SERVER_MODULES!r} + ('mtgpu.server', 'mtgpu.agent') "
                      "if u.find_spec(n) is not None], 'mtgpu': mtgpu.__file__, 'path': sys.path, "
                      "'dists': sorted(d.metadata['Name'] for d in m.distributions())}))")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["found"] == [], got["found"]
    venv = client_alone.parent.parent
    assert got["mtgpu"].startswith(str(venv) + "/"), got
    assert not [p for p in got["path"] if p and p.startswith(str(Path(__file__).resolve().parents[2]))], got["path"]
    assert "mtgpu-client" in got["dists"] and "mtgpu" not in got["dists"], got["dists"]


def test_the_client_alone_joins_lists_submits_reads_a_log_and_writes_ssh_config_that_ssh_uses(client_alone, tmp_path):
    name = f"ca{os.getpid() % 10000}"
    home = tmp_path / "laptop"
    relay_at = f"127.0.0.1:{free_port()}"
    with running_node([], name="node-ca", parent_dir="/var/lib", CLUSTER_MODE="cluster", CLUSTER_ID=CLUSTER,
                      SSH_LISTEN=f"127.0.0.1:{free_port()}", TENANT_UID_RANGE=list(UID_RANGE),
                      DIRECTLINK={"relays": [relay_at], "relay_listen": relay_at}) as node:
        try:
            joined = join(node, name, home, program=client_alone)
            assert joined["cluster_id"] == CLUSTER and UID_RANGE[0] <= joined["uid"] <= UID_RANGE[1], joined
            wait_for("the tenant's account and home", lambda: os.path.isdir(pwd.getpwnam(name).pw_dir), timeout_s=60)

            def cli(*args: str) -> subprocess.CompletedProcess:
                r = remotegpu(home, *args, program=client_alone)
                assert r.returncode == 0, f"remotegpu-cli {' '.join(args)}: {r.stderr}\n{node.server_log()[-2000:]}"
                return r
            [entry] = json.loads(cli("servers", "--json").stdout)
            assert (entry["cluster_id"], entry["tenant"]) == (CLUSTER, name), entry

            def live():  # asked through the node: a try slower than the live view's bound says unreachable
                [view] = json.loads(cli("servers", "--live", "--json").stdout)
                return view if [n["name"] for n in view.get("nodes") or []] == ["node-ca"] else None
            wait_for("servers --live to list the node", live, timeout_s=60, interval_s=1)
            job = home / "job.sh"
            job.write_text("#!/bin/sh\necho from-the-client-alone \"$(id -un)\"\n")
            jid = json.loads(cli("submit", str(job), "--json").stdout)["job_id"]
            assert node.wait_state(jid, {"completed", "failed"}, timeout_s=60)["state"] == "completed"
            assert cli("logs", str(jid)).stdout.strip() == f"from-the-client-alone {name}"
            ssh_config = home / "ssh_config"

            def written():  # the node's host key reaches the cluster's state a moment after it starts
                hosts = json.loads(cli("ssh-config", "--file", str(ssh_config), "--json").stdout)["hosts"]
                known = home / "known_hosts.directlink"
                return hosts == [f"node-ca.{CLUSTER}"] and known.is_file() and \
                    known.read_text().startswith(f"node-ca.{CLUSTER} ssh-ed25519 ")
            wait_for("ssh-config to write the node with its host key", written, timeout_s=60, interval_s=1)
            block = ssh_config.read_text()
            assert f"ProxyCommand {client_alone} --home {home} proxy --cluster {CLUSTER} node-ca" in block, block
            r = subprocess.run(["ssh", "-F", str(ssh_config), "-o", "BatchMode=yes", f"node-ca.{CLUSTER}", "id -un"],
                               capture_output=True, text=True, cwd="/", timeout=90,
                               env={**isolated_client_env(client_alone, home), "HOME": str(home)})
            assert r.returncode == 0 and r.stdout.strip() == name, r.stderr + node.server_log()[-2000:]
            assert f"through the relay {relay_at}" in r.stderr or "remotegpu: path " in r.stderr, r.stderr
        finally:
            problems = stop_node_and_remove_tenants(node, [name], UID_RANGE)
            assert not problems, problems

"""A real member behind NAT reached through DirectLink (issue 13): the member in private
network A connects out to a relay on the "public" network; a tenant's computer in
private network B, which cannot reach A, runs plain `ssh` with the block
`remotegpu-cli ssh-config` wrote, and a command runs on the node through `remotegpu-cli
proxy` (pinned host key, the tenant's own account), and `remotegpu-cli` commands reach
the tenant API through the same relay. An endpoint the member does not know
is refused, and the relay itself refuses one with no credential of the cluster."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from mtgpu.client.remote import RemoteClient
from mtgpu.client.signing import generate_key_pair, load_private_key
from mtgpu.directlink.identity import cluster_key, endpoint_id, issue
from tests.support.dlmember import CLUSTER, client_env, member_behind_nat, member_behind_nat_missing, remotegpu
from tests.support.images import busybox_image, podman_missing
from tests.support.natlab import NatLab
from tests.support.node import free_port, running_node, wait_for
from tests.support.users import remove_tenant_accounts

if member_behind_nat_missing():
    pytest.skip(member_behind_nat_missing(), allow_module_level=True)

UID_RANGE = (360000, 369999)  # its own range: the accounts this node makes never meet another test's


def stranger(lab: NatLab, home: Path, entry: dict, info: dict) -> subprocess.CompletedProcess:
    home.mkdir(exist_ok=True)
    (home / "servers.json").write_text(json.dumps([dict(entry, directlink=info)]))
    return remotegpu(lab, "b", home, "proxy", "--cluster", CLUSTER, "gpu-a", timeout_s=60)


def test_ssh_from_behind_another_nat_reaches_a_member_through_the_relay(tmp_path):
    with NatLab() as lab, member_behind_nat(lab, tmp_path, UID_RANGE) as site:
        node, name, home, api_port = site.node, site.name, site.home, site.api_port
        block = site.ssh_config.read_text()
        assert f"ProxyCommand {sys.executable}" in block and "StrictHostKeyChecking yes" in block
        # ... and is then in site B, which cannot reach A at all:
        reach = subprocess.run(lab.prefix("b") + ["bash", "-c", f"exec 3<>/dev/tcp/{lab.host_ip['a']}/"
                                                  f"{api_port}"], capture_output=True, timeout=30)
        assert reach.returncode != 0
        mark = "ran-on-" + secrets.token_hex(4)
        ssh = site.ssh("b")
        r = subprocess.run(ssh + [f"echo {mark} $(id -un) $(hostname -I 2>/dev/null || true)"],
                           capture_output=True, text=True, env=client_env(home), timeout=90)
        assert r.returncode == 0, r.stderr + node.server_log()
        words = r.stdout.split()
        assert words[:2] == [mark, name], r.stdout
        assert lab.host_ip["a"] in words[2:], r.stdout  # it ran in site A
        assert "remotegpu: gpu-a through the relay" in r.stderr and "remotegpu: path " in r.stderr
        # The tenant API goes the same way: whoami, a job submitted and its log read.
        r = remotegpu(lab, "b", home, "whoami", "--json", timeout_s=90)
        assert r.returncode == 0 and json.loads(r.stdout)["name"] == name, r.stderr
        assert "through DirectLink to gpu-a" in r.stderr, r.stderr
        # The servers view (its scriptable twin) labels the cluster's path: not direct.
        r = remotegpu(lab, "b", home, "servers", "--live", "--json", timeout_s=90)
        assert r.returncode == 0, r.stderr
        [view] = json.loads(r.stdout)
        assert view["path"] in ("p2p", "relayed") and [n["name"] for n in view["nodes"]] == ["gpu-a"], view
        job = home / "job.sh"
        job.write_text(f"#!/bin/bash\necho job-{mark}\n")
        r = remotegpu(lab, "b", home, "submit", str(job), "--json", timeout_s=90)
        assert r.returncode == 0, r.stderr
        jid = json.loads(r.stdout)["job_id"]
        assert node.wait_state(jid, {"completed", "failed"}, timeout_s=60)["state"] == "completed"
        r = remotegpu(lab, "b", home, "logs", str(jid), timeout_s=90)
        assert r.returncode == 0 and r.stdout.strip() == f"job-{mark}", r.stderr
        # The node pins its host key: a changed one is refused, not accepted.
        known = home / "known_hosts.directlink"
        good = known.read_text()
        known.write_text(f"gpu-a.{CLUSTER} ssh-ed25519 "
                         "AAAAC3NzaC1lZDI1NTE5AAAAIBNhBhDxhnlnSg3xtGsGSW8wfbmOUZbzXCJKsCN2EfPA\n")
        r = subprocess.run(ssh + ["true"], capture_output=True, text=True, env=client_env(home), timeout=90)
        assert r.returncode != 0 and "HOST IDENTIFICATION HAS CHANGED" in r.stderr.upper(), r.stderr
        known.write_text(good)
        # An endpoint with a forged credential is refused by the relay; one with a real
        # credential but a key that joined no tenant is refused by the member.
        entry = json.loads((home / "servers.json").read_text())[0]
        forged = dict(entry["directlink"])
        forged["credential"] = dict(forged["credential"], sig=forged["credential"]["sig"][::-1])
        r = stranger(lab, tmp_path / "forger", entry, forged)
        assert r.returncode != 0 and "refused this endpoint" in r.stderr, r.stderr
        key_path = tmp_path / "mallory" / "id_ed25519"
        generate_key_pair(key_path)
        mallory = endpoint_id(load_private_key(key_path))
        cred = issue(cluster_key(site.secret.read_text().strip(), CLUSTER), CLUSTER, mallory, "tenant",
                     "mallory", 600)
        r = stranger(lab, tmp_path / "mallory", dict(entry, key=str(key_path)),
                     dict(entry["directlink"], credential=cred.to_dict()))
        assert r.returncode != 0 and "is no tenant of dl-lab" in r.stderr, r.stderr


WEB = "mkdir -p /tmp/www && echo inside-the-workspace > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www"
FETCH = ("import sys, urllib.request\n"
         "print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode().strip())\n")


@pytest.mark.skipif(bool(podman_missing()), reason=str(podman_missing()))
def test_forward_from_behind_another_nat_brings_a_workspace_port_through_the_relay(tmp_path):
    """`remotegpu-cli forward WS PORT` in site B: the workspace's web port on the member in
    site A answers on B's localhost, through the same DirectLink path as ssh."""
    with busybox_image() as image, NatLab() as lab, \
            member_behind_nat(lab, tmp_path, (380000, 389999), CONTAINERS={
                "enabled": True, "templates": {"web": {"image": image, "ports": [8080], "command": WEB}}}) as site:
        pw = wait_for("the tenant's account", lambda: pwd.getpwnam(site.name), timeout_s=60)
        user = SimpleNamespace(uid=pw.pw_uid, gid=pw.pw_gid, home=pw.pw_dir, name=site.name)
        r = site.node.run_cli("mtgpu.cli.container", user, "create", "--template", "web", "--name", "web", "--json",
                              timeout_s=180)
        assert r.returncode == 0, (r.stderr, site.node.server_log()[-3000:])
        local = free_port()
        fwd = subprocess.Popen(lab.prefix("b") + [sys.executable, "-m", "mtgpu.cli.remotegpu", "--home",
                                                  str(site.home), "forward", "web", "8080", "--local-port", str(local)],
                               env=client_env(site.home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
        try:
            def page():
                r = subprocess.run(lab.prefix("b") + [sys.executable, "-c", FETCH, f"http://127.0.0.1:{local}/"],
                                   capture_output=True, text=True, timeout=30)
                return r.returncode == 0 and r.stdout.strip()
            got = wait_for("the forwarded page in site B", page, timeout_s=90, interval_s=0.5)
        except AssertionError as e:
            os.killpg(fwd.pid, signal.SIGTERM)
            raise AssertionError(f"{e}; the forward said: {fwd.communicate(timeout=30)[1][-2000:]}; the member's "
                                 f"log: {site.node.server_log()[-3000:]}") from None
        finally:
            if fwd.returncode is None:
                os.killpg(fwd.pid, signal.SIGTERM)
        _, err = fwd.communicate(timeout=30)
        assert got == "inside-the-workspace"
        assert "through DirectLink to gpu-a" in err and "forwarding http://localhost:" in err, err


def test_a_member_serves_the_relay_itself_with_relay_listen(tmp_path):
    """No separate relay: a member with a public address serves it (`relay_listen`) and
    connects to it like any other member; ssh goes through it."""
    name = f"dm{os.getpid() % 10000}{time.monotonic_ns() % 1000}"
    home = tmp_path / "laptop"
    relay_at = f"127.0.0.1:{free_port()}"
    with running_node([], name="gpu-r", parent_dir="/var/lib", CLUSTER_MODE="cluster", CLUSTER_ID=CLUSTER,
                      SSH_LISTEN=f"127.0.0.1:{free_port()}", TENANT_UID_RANGE=list(UID_RANGE),
                      DIRECTLINK={"relays": [relay_at], "relay_listen": relay_at}) as node:
        try:
            r = node.admin("tenant", "invite", name, "--json")
            assert r.returncode == 0, r.stderr + node.server_log()[-3000:]  # the member's log: why no leader yet
            env = client_env(home)
            cli = [sys.executable, "-m", "mtgpu.cli.remotegpu", "--home", str(home)]
            r = subprocess.run(cli + ["join", json.loads(r.stdout)["code"], "--server", f"127.0.0.1:{node.port}"],
                               capture_output=True, text=True, env=env, timeout=60)
            assert r.returncode == 0, r.stderr
            ssh_config = home / "ssh_config"

            def written():
                r = subprocess.run(cli + ["ssh-config", "--file", str(ssh_config)], capture_output=True, text=True,
                                   env=env, timeout=60)
                assert r.returncode == 0, r.stderr
                return (home / "known_hosts.directlink").read_text().startswith(f"gpu-r.{CLUSTER} ssh-ed25519 ")
            wait_for("the node's host key in the cluster's state", written, timeout_s=60, interval_s=1)
            r = subprocess.run(["ssh", "-F", str(ssh_config), "-o", "BatchMode=yes", f"gpu-r.{CLUSTER}", "id -un"],
                               capture_output=True, text=True, env=env, timeout=90)
            assert r.returncode == 0 and r.stdout.strip() == name, r.stderr + node.server_log()
            assert f"through the relay {relay_at}" in r.stderr, r.stderr
            assert "serving as a relay for dl-lab" in node.server_log()
            # `remotegpu-cli tunnel`: a loopback port to the node's API through the same relay,
            # for clients that sign their own requests (the VS Code extension).
            t = subprocess.Popen(cli + ["tunnel"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env)
            try:
                opened = json.loads(t.stdout.readline() or "{}")
                assert opened.get("node") == "gpu-r" and opened["path"] in ("direct", "relayed"), \
                    (opened, t.stderr.read() if t.poll() is not None else "")
                entry = json.loads((home / "servers.json").read_text())[0]
                with RemoteClient(opened["address"], entry["tenant"], Path(entry["key"])) as c:
                    assert c.me()["name"] == name
            finally:
                t.stdin.close()
                assert t.wait(timeout=30) == 0
            with node.client() as c:
                dl = c.health()["directlink"]
            assert dl["relay"] == relay_at and dl["problem"] == "", dl
        finally:
            node.terminate()
            problems = remove_tenant_accounts([name], UID_RANGE)
            assert not problems, problems

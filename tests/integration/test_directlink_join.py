"""Joining from behind NAT through the relay alone (issue 26): a member in private network
A, a laptop in private network B that cannot reach the member's LISTEN at all. The
invitation `mtgpu-admin tenant invite` prints names the node, its relay, its DirectLink id
and a credential for the invitation's own key; `remotegpu-cli join INVITATION` in B goes
through the relay, and the laptop then runs commands there: the API (`whoami`, which says
the path in use: p2p once the direct path is up, as the NAT lab's easy NAT allows) and
`remotegpu-cli ssh gpu-a id -un` (everything after the node is the remote command)."""

from __future__ import annotations

import json
import os
import pwd
import subprocess

import pytest

from tests.support.dlmember import member_behind_nat, member_behind_nat_missing, remotegpu
from tests.support.natlab import NatLab
from tests.support.node import wait_for
from tests.support.users import remove_tenant_accounts

if member_behind_nat_missing():
    pytest.skip(member_behind_nat_missing(), allow_module_level=True)

UID_RANGE = (425000, 429999)  # its own range: the accounts this node makes never meet another test's
NOISE = ("Traceback", "Task was destroyed", "never retrieved", "Exception ignored")


def test_an_invitation_joins_from_behind_nat_through_the_relay_and_then_runs_commands(tmp_path):
    newcomer = f"dj{os.getpid() % 10000}"
    try:
        with NatLab() as lab, member_behind_nat(lab, tmp_path, UID_RANGE) as site:
            node = site.node
            reach = subprocess.run(lab.prefix("b") + ["bash", "-c", f"exec 3<>/dev/tcp/{lab.host_ip['a']}/"
                                                      f"{site.api_port}"], capture_output=True, timeout=30)
            assert reach.returncode != 0, "site B must not reach the member's LISTEN"
            r = node.admin("tenant", "invite", newcomer, "--json")
            assert r.returncode == 0, r.stderr
            invitation = json.loads(r.stdout)["invitation"]
            home = tmp_path / "laptop-b"
            r = remotegpu(lab, "b", home, "join", invitation, "--json", timeout_s=120)
            assert r.returncode == 0, r.stderr + node.server_log()[-3000:]
            assert json.loads(r.stdout)["name"] == newcomer, r.stdout
            assert "joining through DirectLink to gpu-a" in r.stderr, r.stderr
            assert not [w for w in NOISE if w in r.stderr], r.stderr
            # The code is used: the same invitation is refused now (and its key no longer admitted).
            r = remotegpu(lab, "b", tmp_path / "laptop-again", "join", invitation, timeout_s=120)
            assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
            said = []

            def whoami_p2p() -> bool:
                r = remotegpu(lab, "b", home, "whoami", "--json", timeout_s=120)
                assert r.returncode == 0 and json.loads(r.stdout)["name"] == newcomer, r.stderr
                assert not [w for w in NOISE if w in r.stderr], r.stderr
                said.append(r.stderr.strip())
                return "through DirectLink to gpu-a (p2p)" in r.stderr
            try:
                wait_for("whoami through the direct path", whoami_p2p, timeout_s=120, interval_s=1)
            except AssertionError:
                log = "\n".join(p.read_text(errors="replace") for p in node.log_files if p.exists())
                lines = [line for line in log.splitlines() if "directlink" in line.lower()]
                raise AssertionError(f"never p2p; whoami said: {said[-5:]}; the member's DirectLink lines: "
                                     + "\n".join(lines[-30:])) from None
            wait_for("the newcomer's account", lambda: pwd.getpwnam(newcomer), timeout_s=60)
            r = remotegpu(lab, "b", home, "ssh", "gpu-a", "id", "-un", timeout_s=120)
            assert r.returncode == 0 and r.stdout.strip() == newcomer, r.stderr + node.server_log()[-3000:]
    finally:
        problems = remove_tenant_accounts([newcomer], UID_RANGE)
        assert not problems, problems

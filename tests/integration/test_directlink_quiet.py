"""No asyncio noise reaches a user or a member's log when UDP between the sites is dropped
(issue 26): a member in private network A, a laptop in B. Sessions go direct, then UDP
between the two routers is dropped while an ssh session runs and new ones open (they
fall back to the relay; their direct tries fail). The ssh session ends well, and neither
the client's stderr nor the member's log holds a traceback, "Task was destroyed but it
is pending!", "Task exception was never retrieved" or "Exception ignored"."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support.dlmember import client_env, member_behind_nat, member_behind_nat_missing, remotegpu
from tests.support.natlab import NatLab
from tests.support.node import wait_for

if member_behind_nat_missing():
    pytest.skip(member_behind_nat_missing(), allow_module_level=True)

UID_RANGE = (430000, 434999)  # its own range: the accounts this node makes never meet another test's
NOISE = ("Traceback", "Task was destroyed", "never retrieved", "Exception ignored")


def noise_in(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(w in line for w in NOISE)]


def test_dropping_udp_between_the_sites_puts_no_asyncio_noise_on_the_terminal_or_in_the_log(tmp_path):
    with NatLab() as lab, member_behind_nat(lab, tmp_path, UID_RANGE) as site:
        node, home = site.node, site.home
        said: list[str] = []

        def whoami(direct: bool) -> bool:
            r = remotegpu(lab, "b", home, "whoami", "--json", timeout_s=120)
            assert r.returncode == 0 and json.loads(r.stdout)["name"] == site.name, r.stderr
            said.append(r.stderr)
            return not direct or "(p2p)" in r.stderr
        wait_for("a command on the direct path", lambda: whoami(True), timeout_s=120, interval_s=1)
        ssh = subprocess.Popen(site.ssh("b", "sleep 15; echo still-here $(id -un)"), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=client_env(home))
        try:
            wait_for("the ssh session's direct path", lambda: ssh.poll() is not None or
                     node.server_log().count("opened ssh") >= 1, timeout_s=60, interval_s=0.5)
            lab.cut_direct()  # UDP between the sites dropped: probes and keep-alives die
            for _ in range(3):  # new sessions: their direct tries fail, the relay carries them
                whoami(False)
            out, err = ssh.communicate(timeout=120)
        finally:
            if ssh.poll() is None:
                ssh.kill()
                ssh.wait(timeout=10)
        assert ssh.returncode == 0 and out.split() == ["still-here", site.name], err
        for text in said + [err]:
            assert not noise_in(text), text
        log = node.server_log()
        assert not noise_in(log), "\n".join(noise_in(log)[:20]) + "\n...\n" + log[-4000:]

"""A working day on DirectLink (issue 26): a real member behind NAT A, a laptop behind
NAT B that reaches it with plain `ssh` through the block `remotegpu-cli ssh-config`
wrote (tests/support/dlmember.py). An open terminal (`ssh -T HOST cat`) keeps echoing
while a second ssh runs beside it, while the relay is killed under its direct path (a
new session works once the relay is back), and while the laptop changes its address."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.support.dlmember import Terminal, client_env, member_behind_nat, member_behind_nat_missing
from tests.support.natlab import NatLab
from tests.support.node import wait_for

if member_behind_nat_missing():
    pytest.skip(member_behind_nat_missing(), allow_module_level=True)

UID_RANGE = (520000, 529999)  # its own range: the accounts this node makes never meet another test's


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    with NatLab() as lab, member_behind_nat(lab, tmp_path_factory.mktemp("dlsessions"), UID_RANGE) as site:
        yield site


def ssh_id(site) -> subprocess.CompletedProcess:
    return subprocess.run(site.ssh("b", "id", "-un"), capture_output=True, text=True, env=client_env(site.home),
                          timeout=120)


def test_a_second_ssh_from_the_same_laptop_leaves_the_first_session_working(site):
    term = Terminal(site)
    try:
        term.echo("first")
        for i in range(2):  # a second ssh, and a third: each its own session under the same key
            r = ssh_id(site)
            assert r.returncode == 0 and r.stdout.strip() == site.name, r.stderr + site.node.server_log()[-3000:]
            term.echo(f"still-{i}")
        assert "dialled again" not in site.node.server_log()
    finally:
        term.close()


def test_a_direct_session_outlives_the_relay_and_new_sessions_work_once_it_is_back(site):
    term = Terminal(site)
    try:
        term.echo("before")
        term.wait_direct()
        site.stop_relay()
        for i in range(5):  # over several seconds: the member saw its relay go and kept the session
            term.echo(f"relay-gone-{i}")
            time.sleep(1)
        assert term.p.poll() is None
        site.start_relay()
        r = wait_for("a new ssh session once the relay is back", lambda: (r := ssh_id(site)).returncode == 0 and r,
                     timeout_s=120, interval_s=2)
        assert r.stdout.strip() == site.name
        term.echo("after")
        assert "session(s) on the direct path go on" in site.node.server_log()
    finally:
        term.close()
        if site.relay[0].p.poll() is not None:  # failed with it killed: the next test needs it
            site.start_relay()


def test_a_laptop_that_changes_its_address_keeps_its_ssh_session(site):
    term = Terminal(site)
    try:
        term.echo("before-the-move")
        term.wait_direct()
        site.lab.move_host("b")
        stall = term.echo("after-the-move", timeout_s=90)
        print(f"the first line after the address change came back after {stall:.2f} s")
        for i in range(3):
            term.echo(f"moved-{i}")
        assert term.p.poll() is None
    finally:
        term.close()

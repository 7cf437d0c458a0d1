"""A working day on DirectLink (issue 26): a real member behind NAT A, a laptop behind
NAT B that reaches it with plain `ssh` through the block `remotegpu-cli ssh-config`
wrote (tests/support/dlmember.py). An open terminal (`ssh -T HOST cat`) keeps echoing
while a second ssh runs beside it, while the relay is killed under its direct path (a
new ssh started meanwhile waits for the relay, saying so, and gets in once it is back),
and while the laptop changes its address."""

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


def test_a_direct_session_outlives_the_relay_and_new_sessions_work_once_it_is_back(site, tmp_path):
    term = Terminal(site)
    try:
        term.echo("before")
        term.wait_direct()
        site.stop_relay()
        for i in range(5):  # over several seconds: the member saw its relay go and kept the session
            term.echo(f"relay-gone-{i}")
            time.sleep(1)
        assert term.p.poll() is None
        # A new ssh while the relay is down waits for it, saying so, and gets in once it is back
        # (its ConnectTimeout covers the wait: ssh's banner wait counts it).
        err = tmp_path / "waiting-ssh.err"
        argv = site.lab.prefix("b") + ["ssh", "-F", str(site.ssh_config), "-o", "BatchMode=yes",
                                       "-o", "ConnectTimeout=150", site.host, "id", "-un"]
        with open(err, "wb") as stderr:
            waiting = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, env=client_env(site.home),
                                       start_new_session=True)
        try:
            wait_for("the new ssh to say it waits for the relay",
                     lambda: "not answering; waiting for it" in err.read_text(errors="replace") or
                     waiting.poll() is not None, timeout_s=60, interval_s=0.5)
            assert waiting.poll() is None, err.read_text(errors="replace")
            term.echo("relay-gone-a-new-ssh-waits")
            site.start_relay()
            out, _ = waiting.communicate(timeout=180)
        finally:
            if waiting.poll() is None:
                waiting.kill()  # its own process group: this test's
                waiting.wait(timeout=30)
        said = err.read_text(errors="replace")
        assert waiting.returncode == 0 and out.decode().strip() == site.name, said + site.node.server_log()[-3000:]
        relay_at = site.relay[1][site.relay[1].index("--listen") + 1]
        assert said.count(f"remotegpu: the relay {relay_at} is not answering; waiting for it (up to ") == 1, said
        r = ssh_id(site)  # and the next one goes at once
        assert r.returncode == 0 and r.stdout.strip() == site.name, r.stderr
        assert "not answering" not in r.stderr, r.stderr
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

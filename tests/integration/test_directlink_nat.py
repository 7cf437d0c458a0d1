"""DirectLink in a NAT lab (tests/support/natlab.py): two hosts behind MASQUERADE routers
and a relay on the "public" network between them, every part a real process in its own
network namespace. Easy NAT goes direct; --random-fully on both sides stays relayed and
works; UDP blocked works over the relay's TCP; the direct path cut mid-session falls back
to the relay within seconds and the session lives; a marker sent end to end never
appears in the bytes the relay's network carried, nor do the endpoints' hellos (the
relay's port is TLS)."""

from __future__ import annotations

import os
import secrets
import time

import pytest

from tests.support.dllab import make_keys, run_lab
from tests.support.natlab import NatLab, netlab_missing

MARKER = "MARKER-e2e-" + secrets.token_hex(8)

if os.geteuid() != 0 or netlab_missing():
    pytest.skip(netlab_missing() or "network namespaces need root", allow_module_level=True)

@pytest.fixture()
def keys(tmp_path):
    return make_keys(tmp_path)


def test_easy_nat_goes_direct_a_cut_falls_back_to_the_relay_and_the_relay_sees_only_ciphertext(keys, tmp_path):
    capture = tmp_path / "relay.pcap"
    with NatLab() as lab:
        procs, dialer = run_lab(lab, keys, capture_to=capture, marker=MARKER)
        try:
            up = dialer.event("up")
            assert up["direct_possible"] and up["public"].startswith(lab.router_ip["a"] + ":"), up
            first = dialer.event("first_byte")
            if first["path"] != "direct":
                went = dialer.event("path", timeout_s=20)
                assert went["path"] == "direct", went
            dialer.tell("send 3000000")
            sent = dialer.event("echoed", timeout_s=60)
            assert sent["path"] == "direct", sent
            lab.cut_direct()
            back = dialer.event("path", timeout_s=15)
            assert back["path"] == "relay", back
            dialer.tell("send 500000")
            again = dialer.event("echoed", timeout_s=60)
            assert again["path"] == "relay", again  # the same session, now through the relay
        finally:
            for p in procs:
                p.stop()
    carried = capture.read_bytes()
    assert len(carried) > 500_000  # the relay's network carried the relayed half ...
    assert MARKER.encode() not in carried  # ... as ciphertext only
    assert b'"credential"' not in carried and b'"proof"' not in carried  # the hellos too (TLS to the relay)


@pytest.mark.parametrize("nat", ["random-fully", "udp-blocked"])
def test_hard_nat_and_blocked_udp_stay_on_the_relay_and_work(keys, nat):
    with NatLab(random_fully=nat == "random-fully", block_udp=nat == "udp-blocked") as lab:
        procs, dialer = run_lab(lab, keys)
        try:
            up = dialer.event("up")
            if nat == "udp-blocked":
                assert not up["direct_possible"], up
            first = dialer.event("first_byte")
            assert first["path"] == "relay"
            if nat == "random-fully":  # (with UDP blocked there is no punching to outlast)
                time.sleep(6)  # longer than the punching lasts
            dialer.tell("send 1000000")
            sent = dialer.event("echoed", timeout_s=60)
            assert sent["path"] == "relay", sent
        finally:
            for p in procs:
                p.stop()


def test_the_relay_killed_after_the_direct_path_is_up_leaves_the_session_working(keys):
    with NatLab() as lab:
        procs, dialer = run_lab(lab, keys)
        relay = procs[0]
        try:
            first = dialer.event("first_byte")
            if first["path"] != "direct":
                assert dialer.event("path", timeout_s=20)["path"] == "direct"
            relay.stop()  # SIGKILL: its TCP connections drop at once
            assert relay.p.returncode is not None
            time.sleep(4)  # past the time a silent path is given up (3 s): the direct one keeps answering
            dialer.tell("send 1000000")
            sent = dialer.event("echoed", timeout_s=60)
            assert sent["path"] == "direct", sent
        finally:
            for p in procs:
                p.stop()

"""DirectLink in a NAT lab (tests/support/natlab.py): two hosts behind MASQUERADE routers
and a relay on the "public" network between them, every part a real process in its own
network namespace. Easy NAT goes direct; --random-fully on both sides stays relayed and
works; UDP blocked works over the relay's TCP; the direct path cut mid-session falls back
to the relay within seconds and the session lives; a marker sent end to end never
appears in the bytes the relay's network carried."""

from __future__ import annotations

import json
import os
import queue
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives import serialization

from mtgpu.directlink.identity import cluster_key, endpoint_id
from tests.support.natlab import NatLab, netlab_missing

if os.geteuid() != 0 or netlab_missing():
    pytest.skip(netlab_missing() or "network namespaces need root", allow_module_level=True)

PY = sys.executable
ROOT = str(Path(__file__).resolve().parents[2])
PORT = 7443
MARKER = "MARKER-e2e-" + secrets.token_hex(8)
CAPTURE = r"""
import socket, sys, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.settimeout(0.2)
end = time.monotonic() + float(sys.argv[2])
with open(sys.argv[1], "wb") as f:
    print("capturing", flush=True)
    while time.monotonic() < end:
        try:
            f.write(s.recv(65535))
        except socket.timeout:
            pass
"""


class Proc:
    """A process in a namespace whose stdout lines are JSON events."""

    def __init__(self, argv: list[str], stdin: bool = False) -> None:
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                  stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                  env={**os.environ, "PYTHONPATH": ROOT})
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.p.stdout:
            self.lines.put(line)

    def event(self, name: str, timeout_s: float = 30.0) -> dict:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=max(0.05, end - time.monotonic()))
            except queue.Empty:
                break
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") == name or e.get("event") == "error":
                assert e.get("event") != "error", e
                return e
        raise AssertionError(f"no {name!r} event in {timeout_s:g}s; exit {self.p.poll()}; stderr:\n"
                             f"{self.stderr_now()}")

    def stderr_now(self) -> str:
        if self.p.poll() is None:
            return "(still running)"
        return self.p.stderr.read()[-3000:]

    def tell(self, line: str) -> None:
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(timeout=10)


@pytest.fixture()
def keys(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text(secrets.token_urlsafe(48))
    out = {"secret": secret, "cluster_pub": endpoint_id(cluster_key(secret.read_text().strip(), "lab"))}
    for side in ("a", "b"):
        k = Ed25519PrivateKey.generate()
        path = tmp_path / f"{side}.key"
        path.write_bytes(k.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                         serialization.NoEncryption()))
        out[side], out[f"{side}_id"] = path, endpoint_id(k)
    return out


def run_lab(lab: NatLab, keys, capture_to: Path | None = None):
    procs: list[Proc] = []
    relay = Proc(lab.prefix("relay") + [PY, "-m", "mtgpu.cli.relay", "--listen", f"{lab.relay_ip}:{PORT}",
                                        "--cluster", f"lab={keys['cluster_pub']}"])
    procs.append(relay)
    if capture_to is not None:
        cap = Proc(lab.prefix("relay") + [PY, "-c", CAPTURE, str(capture_to), "60"])
        procs.append(cap)
    time.sleep(1.0)  # the relay binds; a peer that comes too early retries below
    common = ["--relay", f"{lab.relay_ip}:{PORT}", "--secret-file", str(keys["secret"]), "--marker", MARKER]
    server = Proc(lab.prefix("b") + [PY, "-m", "tests.support.dlpeer", *common, "--key-file", str(keys["b"]),
                                     "serve"])
    procs.append(server)
    server.event("up")
    dialer = Proc(lab.prefix("a") + [PY, "-m", "tests.support.dlpeer", *common, "--key-file", str(keys["a"]),
                                     "dial", keys["b_id"]], stdin=True)
    procs.append(dialer)
    return procs, dialer


def test_easy_nat_goes_direct_a_cut_falls_back_to_the_relay_and_the_relay_sees_only_ciphertext(keys, tmp_path):
    capture = tmp_path / "relay.pcap"
    with NatLab() as lab:
        procs, dialer = run_lab(lab, keys, capture_to=capture)
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
            time.sleep(6)  # longer than the punching lasts
            dialer.tell("send 1000000")
            sent = dialer.event("echoed", timeout_s=60)
            assert sent["path"] == "relay", sent
        finally:
            for p in procs:
                p.stop()

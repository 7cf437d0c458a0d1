"""Running DirectLink peers in a NAT lab (tests/support/natlab.py) as real processes:
the relay, a serving peer in B and a dialling peer in A (tests/support/dlpeer.py), and a
raw capture on the relay's link. Shared by tests/integration/test_directlink_nat.py and
bench/directlink.py."""

from __future__ import annotations

import json
import os
import queue
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mtgpu.directlink.identity import cluster_key, endpoint_id

from .natlab import NatLab

PY = sys.executable
ROOT = str(Path(__file__).resolve().parents[2])
PORT = 7443
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
        # stderr to a file: what each process logged can be read while it still runs
        self._err = tempfile.TemporaryFile()
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._err, text=True, cwd=ROOT,
                                  stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                  env={**os.environ, "PYTHONPATH": ROOT})
        self.name = next((n for key, n in (("mtgpu.cli.relay", "relay"), ("serve", "serve"), ("dial", "dialer"))
                          if key in argv), "capture")
        self.others: list[Proc] = []  # the lab's other processes, whose logs a failure shows too
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
                assert e.get("event") != "error", f"{e}; {self.logs()}"
                return e
        raise AssertionError(f"no {name!r} event in {timeout_s:g}s; exit {self.p.poll()}; {self.logs()}")

    def stderr_now(self) -> str:
        self._err.seek(0)
        return self._err.read()[-3000:].decode("utf-8", "replace")

    def logs(self) -> str:
        """This process's stderr and the lab's other processes' (for a failure's message)."""
        return "\n".join(f"--- {p.name} (exit {p.p.poll()}), stderr:\n{p.stderr_now()}" for p in [self, *self.others])

    def tell(self, line: str) -> None:
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(timeout=10)


def make_keys(tmp_path: Path) -> dict:
    """The cluster secret and the two peers' keys, as files the peer processes read."""
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


def run_lab(lab: NatLab, keys: dict, capture_to: Path | None = None, marker: str = "") -> tuple[list, "Proc"]:
    procs: list[Proc] = []
    relay = Proc(lab.prefix("relay") + [PY, "-m", "mtgpu.cli.relay", "--listen", f"{lab.relay_ip}:{PORT}",
                                        "--cluster", f"lab={keys['cluster_pub']}"])
    procs.append(relay)
    if capture_to is not None:
        cap = Proc(lab.prefix("relay") + [PY, "-c", CAPTURE, str(capture_to), "60"])
        procs.append(cap)
    time.sleep(1.0)  # the relay binds; a peer that comes too early retries below
    common = ["--relay", f"{lab.relay_ip}:{PORT}", "--secret-file", str(keys["secret"]), "--marker", marker]
    server = Proc(lab.prefix("b") + [PY, "-m", "tests.support.dlpeer", *common, "--key-file", str(keys["b"]),
                                     "serve"])
    procs.append(server)
    server.event("up")
    dialer = Proc(lab.prefix("a") + [PY, "-m", "tests.support.dlpeer", *common, "--key-file", str(keys["a"]),
                                     "dial", keys["b_id"]], stdin=True)
    procs.append(dialer)
    for p in procs:
        p.others = [q for q in procs if q is not p]
    return procs, dialer

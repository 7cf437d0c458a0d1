"""A real member behind NAT with a laptop that joined it (issue 13), for
tests/integration/test_directlink_member.py and bench/directlink.py:

    with NatLab() as lab, member_behind_nat(lab, tmp_path, uid_range) as site:
        site.node, site.name, site.home, site.ssh_config, site.host  # gpu-a.dl-lab

The relay runs on the lab's public network; the member (cluster of one) in private
network A connects out to it; a tenant is invited, joins from site A (where the node is
reachable once) and writes its ssh-config block. Everything is stopped and the
tenant's account removed at the end, also on failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import secrets
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from mtgpu.directlink.identity import cluster_key, endpoint_id

from .dllab import PORT, Proc
from .natlab import NatLab, netlab_missing
from .node import REPO_ROOT, Node, free_port, running_node, wait_for
from .users import can_create_users, stop_node_and_remove_tenants

CLUSTER = "dl-lab"


def member_behind_nat_missing() -> str | None:
    """Why member_behind_nat() cannot run here (None: it can), for a module's skip: root
    for the network namespaces, tenant accounts to create, OpenSSH's sshd and ssh."""
    if os.geteuid() != 0 or netlab_missing():
        return netlab_missing() or "network namespaces need root"
    if can_create_users():
        return can_create_users()
    if not (shutil.which("sshd") or os.path.exists("/usr/sbin/sshd")) or not shutil.which("ssh"):
        return "needs OpenSSH's sshd and ssh"
    return None


def client_env(home: Path) -> dict:
    # No /usr/local/bin on PATH: ssh-config then writes `python -m mtgpu.cli.remotegpu` of
    # this checkout (PYTHONPATH) into ProxyCommand, not an installed copy.
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": REPO_ROOT, "LANG": "C.UTF-8"}


def remotegpu(lab: NatLab, side: str, home: Path, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(lab.prefix(side) + [sys.executable, "-m", "mtgpu.cli.remotegpu", "--home", str(home), *args],
                          capture_output=True, text=True, env=client_env(home), timeout=timeout_s)


@dataclass
class Site:
    lab: NatLab
    node: Node
    secret: Path
    name: str          # the tenant
    home: Path         # the laptop's remotegpu home
    ssh_config: Path
    api_port: int
    ssh_port: int
    host: str = f"gpu-a.{CLUSTER}"
    relay: list | None = None  # [the relay's Proc, its argv]: stop_relay() / start_relay()

    def stop_relay(self) -> None:
        """The relay process killed (SIGKILL): its connections end without a goodbye."""
        self.relay[0].stop()

    def start_relay(self) -> None:
        self.relay[0] = Proc(self.relay[1])

    def ssh(self, side: str, *args: str) -> list[str]:
        """An ssh command line through the written block (ProxyCommand remotegpu-cli proxy)."""
        return self.lab.prefix(side) + ["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes",
                                        "-o", "ConnectTimeout=30", self.host, *args]


@contextlib.contextmanager
def member_behind_nat(lab: NatLab, tmp: Path, uid_range: tuple[int, int], **settings) -> Iterator[Site]:
    """`settings`: more of the member's config (e.g. CONTAINERS)."""
    name = f"dl{os.getpid() % 10000}{time.monotonic_ns() % 1000}"
    secret = tmp / "cluster.secret"
    secret.write_text(secrets.token_urlsafe(48) + "\n")
    os.chmod(secret, 0o600)
    cluster_pub = endpoint_id(cluster_key(secret.read_text().strip(), CLUSTER))
    home = tmp / "laptop"
    relay_at = f"{lab.relay_ip}:{PORT}"
    relay_argv = lab.prefix("relay") + [sys.executable, "-m", "mtgpu.cli.relay", "--listen", relay_at,
                                        "--cluster", f"{CLUSTER}={cluster_pub}"]
    relay = [Proc(relay_argv), relay_argv]
    try:
        api_port, ssh_port = free_port(), free_port()
        with running_node([], name="gpu-a", start=False, parent_dir="/var/lib", CLUSTER_MODE="cluster",
                          CLUSTER_ID=CLUSTER, CLUSTER_SECRET_FILE=str(secret),
                          LISTEN=f"{lab.host_ip['a']}:{api_port}", SSH_LISTEN=f"127.0.0.1:{ssh_port}",
                          TENANT_UID_RANGE=list(uid_range), DIRECTLINK={"relays": [relay_at]}, **settings) as node:
            try:
                node.prefix = lab.prefix("a")
                node.start(timeout_s=60)
                r = node.admin("tenant", "invite", name, "--json")
                assert r.returncode == 0, r.stderr
                code = json.loads(r.stdout)["code"]
                # The laptop joins where the node is reachable (site A) ...
                r = remotegpu(lab, "a", home, "join", code, "--server", f"{lab.host_ip['a']}:{api_port}", "--json")
                assert r.returncode == 0, r.stderr + node.server_log()
                site = Site(lab, node, secret, name, home, home / "ssh_config", api_port, ssh_port, relay=relay)

                def written():
                    r = remotegpu(lab, "a", home, "ssh-config", "--file", str(site.ssh_config), "--json")
                    assert r.returncode == 0, r.stderr
                    known = (home / "known_hosts.directlink").read_text()
                    return known.startswith(f"{site.host} ssh-ed25519 ") and json.loads(r.stdout)
                hosts = wait_for("the node's host key in the cluster's state", written, timeout_s=60,
                                 interval_s=1)["hosts"]
                assert hosts == [site.host]
                yield site
            finally:
                problems = stop_node_and_remove_tenants(node, [name], uid_range)
                assert not problems, problems
    finally:
        relay[0].stop()


class Terminal:
    """`ssh -T HOST cat` from site B: lines written come back, stderr is kept."""

    def __init__(self, site) -> None:
        self.site = site
        argv = site.lab.prefix("b") + ["ssh", "-F", str(site.ssh_config), "-o", "BatchMode=yes",
                                       "-o", "ConnectTimeout=30", "-T", site.host, "cat"]
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env=client_env(site.home), start_new_session=True)
        self.lines: queue.Queue[bytes] = queue.Queue()
        self.err: list[str] = []
        threading.Thread(target=self._pump, args=(self.p.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.p.stderr, lambda b: self.err.append(b.decode(errors="replace"))),
                         daemon=True).start()

    @staticmethod
    def _pump(f, put) -> None:
        for line in iter(f.readline, b""):
            put(line)

    def echo(self, text: str, timeout_s: float = 60) -> float:
        """Write a line; the seconds until it came back (AssertionError when it did not)."""
        t0 = time.monotonic()
        self.p.stdin.write(text.encode() + b"\n")
        self.p.stdin.flush()
        try:
            got = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"{text!r} did not come back in {timeout_s:g}s; ssh exit {self.p.poll()}; "
                                 f"its stderr: {''.join(self.err)[-2000:]}; the member's log: "
                                 f"{self.site.node.server_log()[-3000:]}") from None
        assert got == text.encode() + b"\n", (got, text)
        return time.monotonic() - t0

    def wait_direct(self) -> None:
        """Wait until the session's proxy says it took the direct path (not the relay)."""
        try:
            wait_for("the terminal's direct path", lambda: "remotegpu: path direct\n" in self.err, timeout_s=60,
                     interval_s=0.5)
        except AssertionError as e:
            log = "\n".join(p.read_text(errors="replace") for p in self.site.node.log_files if p.exists())
            said = [line for line in log.splitlines() if "directlink" in line.lower()]
            raise AssertionError(f"{e}; the proxy said: {''.join(self.err)[-1500:]}; the member's DirectLink "
                                 f"lines: {chr(10).join(said[-30:])}\n{self.site.lab.udp_state()}") from None

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()  # the ssh process group only: it is this test's
        self.p.wait(timeout=30)

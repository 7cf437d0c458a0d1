"""Workspace ports are their tenant's: published on 127.0.0.1 (never on the network),
and a firewall rule per port lets only the workspace's tenant (and root) connect to it.

A member keeps one iptables chain, `MTGPU-WS-<key>` (key: its STATE_DIR's), jumped to
from OUTPUT for TCP on the loopback. For each published port it holds: accept the
tenant's uid, accept root, reset anyone else. Connections on the loopback are made by
local processes, so the owner match sees the connecting user: a tenant's SSH forward
(`remotegpu-cli forward`, made by its own sshd session process) passes, another
tenant's process does not. The chain is rewritten whole and atomically
(`iptables-restore --noflush`) before a workspace's port is published and after it is
gone; the rules stay while the server is down (its workspaces keep running), and the
chain goes when the member stops with no workspace port left.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading

log = logging.getLogger(__name__)

IPTABLES = shutil.which("iptables") or "/usr/sbin/iptables"
IPTABLES_RESTORE = shutil.which("iptables-restore") or "/usr/sbin/iptables-restore"


class PortGuardError(RuntimeError):
    """The rules that keep a port private could not be written; the port is not published."""


def chain_name(key: str) -> str:
    return f"MTGPU-WS-{key}"[:28]


def rules(chain: str, allowed: dict[int, int]) -> str:
    """The iptables-restore input for `allowed` (host port -> tenant uid)."""
    lines = ["*filter", f":{chain} - [0:0]"]
    for port, uid in sorted(allowed.items()):
        match = f"-A {chain} -p tcp -d 127.0.0.1 --dport {port}"
        lines += [f"{match} -m owner --uid-owner {uid} -j RETURN",
                  f"{match} -m owner --uid-owner 0 -j RETURN",
                  f"{match} -j REJECT --reject-with tcp-reset"]
    lines += ["COMMIT", ""]
    return "\n".join(lines)


class PortGuard:
    def __init__(self, key: str) -> None:
        self.chain = chain_name(key)
        self._ports: dict[int, dict[int, int]] = {}  # job id -> {host port: uid}
        self._lock = threading.Lock()
        self._ready = False

    def _iptables(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([IPTABLES, "-w", "5", *args], capture_output=True, text=True, timeout=30)

    def _setup(self) -> None:
        if self._ready:
            return
        if self._iptables("-n", "-L", self.chain).returncode != 0:
            r = self._iptables("-N", self.chain)
            if r.returncode != 0:
                raise PortGuardError(f"iptables could not make the chain {self.chain}: {r.stderr.strip()}")
        jump = ("OUTPUT", "-o", "lo", "-p", "tcp", "-j", self.chain)
        if self._iptables("-C", *jump).returncode != 0:
            r = self._iptables("-I", *jump)
            if r.returncode != 0:
                raise PortGuardError(f"iptables could not add the jump to {self.chain}: {r.stderr.strip()}")
        self._ready = True

    def _write(self) -> None:
        allowed = {p: uid for ports in self._ports.values() for p, uid in ports.items()}
        r = subprocess.run([IPTABLES_RESTORE, "-w", "5", "--noflush"], input=rules(self.chain, allowed),
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise PortGuardError(f"iptables-restore failed for {self.chain}: {r.stderr.strip()}")

    def allow(self, job_id: int, uid: int, host_ports: list[int]) -> None:
        """Before the ports are published: only `uid` (and root) may connect to them."""
        try:
            with self._lock:
                self._setup()
                self._ports[job_id] = {int(p): uid for p in host_ports}
                self._write()
        except (OSError, subprocess.TimeoutExpired) as e:
            raise PortGuardError(f"the firewall rules for workspace ports could not be written: {e}") from e

    def drop(self, job_id: int) -> None:
        """After the workspace's ports are gone."""
        with self._lock:
            if self._ports.pop(job_id, None) is None or not self._ready:
                return
            try:
                self._write()
            except (PortGuardError, OSError, subprocess.TimeoutExpired) as e:
                log.warning("could not remove the rules of job %d's ports: %s", job_id, e)

    def close(self) -> None:
        """The member stops: with no workspace port left, the chain goes too."""
        with self._lock:
            if self._ports or not self._ready:
                return
            remove_chain(self.chain)
            self._ready = False


def remove_chain(chain: str) -> None:
    """Take the chain out of OUTPUT and delete it (nothing when it is not there)."""
    for args in (("-D", "OUTPUT", "-o", "lo", "-p", "tcp", "-j", chain), ("-F", chain), ("-X", chain)):
        subprocess.run([IPTABLES, "-w", "5", *args], capture_output=True, timeout=30)

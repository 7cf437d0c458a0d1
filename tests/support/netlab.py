"""Network namespaces a test makes for partitions (TESTING.md, "Several hosts on one machine").

    with NetLab(3) as lab:         # lab.addresses[i]: member i's address, lab.prefix(i): run in its namespace
        ...
        lab.cut([0], [1, 2])       # drop everything between the two sides, both ways
        lab.heal()

A "switch" namespace holds a bridge; each member namespace has one veth into it and an
address 10.200.K.(i+1)/24 (K picked at random per lab). Processes enter a member's
namespace with `nsenter --net` (only the network namespace: cgroups, /sys and the
filesystem stay the machine's). No traffic ever leaves these namespaces; everything is
deleted at the end, also when the test fails.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess


def netlab_missing() -> str | None:
    for tool in ("ip", "nsenter", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2, util-linux, iptables)"
    return None


def _run(*args: str) -> None:
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")


class NetLab:
    def __init__(self, members: int) -> None:
        tag = secrets.token_hex(3)
        self.k = 1 + secrets.randbelow(250)
        self.switch = f"mtsw-{tag}"
        self.names = [f"mtn{i}-{tag}" for i in range(members)]
        self.addresses = [f"10.200.{self.k}.{i + 1}" for i in range(members)]
        self._made: list[str] = []

    def __enter__(self) -> "NetLab":
        try:
            _run("ip", "netns", "add", self.switch)
            self._made.append(self.switch)
            _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.switch, "link", "set", "br0", "up")
            for i, (ns, addr) in enumerate(zip(self.names, self.addresses)):
                _run("ip", "netns", "add", ns)
                self._made.append(ns)
                _run("ip", "-n", ns, "link", "set", "lo", "up")
                _run("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}", "netns",
                     self.switch)
                _run("ip", "-n", self.switch, "link", "set", f"p{i}", "master", "br0", "up")
                _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
                _run("ip", "-n", ns, "link", "set", "eth0", "up")
        except Exception:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def prefix(self, i: int) -> list[str]:
        """What runs a command in member i's network namespace (and nothing else's)."""
        return ["nsenter", f"--net=/var/run/netns/{self.names[i]}", "--"]

    def _iptables(self, i: int, *args: str) -> None:
        _run("ip", "netns", "exec", self.names[i], "iptables", "-w", "5", *args)

    def cut(self, side_a: list[int], side_b: list[int]) -> None:
        """Drop every packet between the two sides, both ways (each member filters its own)."""
        for a in side_a:
            for b in side_b:
                for me, other in ((a, b), (b, a)):
                    self._iptables(me, "-A", "INPUT", "-s", self.addresses[other], "-j", "DROP")
                    self._iptables(me, "-A", "OUTPUT", "-d", self.addresses[other], "-j", "DROP")

    def heal(self) -> None:
        for i in range(len(self.names)):
            self._iptables(i, "-F", "INPUT")
            self._iptables(i, "-F", "OUTPUT")

    def close(self) -> None:
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self._made = []

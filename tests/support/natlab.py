"""A NAT lab in network namespaces (TESTING.md, "NAT lab"): a "public" router with the
relay behind it, and two private networks behind routers that MASQUERADE (optionally
--random-fully, or dropping UDP):

    host A 10.202.K.2 -- router A (10.202.K.1 | 10.210.K.2) --+
                                                              +-- wan router -- relay 10.212.K.10
    host B 10.203.K.2 -- router B (10.203.K.1 | 10.211.K.2) --+

The wan is a router, not a bridge, as the Internet is: a TTL-2 opener from a host dies
there, before the peer's router (which would otherwise record it). Every address is
inside namespaces made here; everything is deleted at the end, also when the test fails.
`prefix(name)` runs a command in a namespace ("a", "b", "relay").
"""

from __future__ import annotations

import secrets
import subprocess

from .netlab import _run, netlab_missing  # noqa: F401 - netlab_missing: for the tests' skip


class NatLab:
    def __init__(self, random_fully: bool = False, block_udp: bool = False) -> None:
        tag = secrets.token_hex(3)
        self.k = 1 + secrets.randbelow(250)
        self.ns = {n: f"mtnat{n}-{tag}" for n in ("wan", "relay", "ra", "rb", "a", "b")}
        self.relay_ip = f"10.212.{self.k}.10"
        self.router_ip = {"a": f"10.210.{self.k}.2", "b": f"10.211.{self.k}.2"}
        self.host_ip = {"a": f"10.202.{self.k}.2", "b": f"10.203.{self.k}.2"}
        self.random_fully, self.block_udp = random_fully, block_udp
        self._made: list[str] = []

    def _ip(self, ns: str, *args: str) -> None:
        _run("ip", "-n", self.ns[ns], *args)

    def _exec(self, ns: str, *args: str) -> None:
        _run("ip", "netns", "exec", self.ns[ns], *args)

    def __enter__(self) -> "NatLab":
        try:
            for name in self.ns.values():
                _run("ip", "netns", "add", name)
                self._made.append(name)
                _run("ip", "-n", name, "link", "set", "lo", "up")
            self._exec("wan", "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
            self._wan_leg("relay", "eth0", 212, self.relay_ip)
            for side, net in (("a", 202), ("b", 203)):
                router = f"r{side}"
                self._wan_leg(router, "wan0", 210 if side == "a" else 211, self.router_ip[side])
                self._ip(side, "link", "add", "eth0", "type", "veth", "peer", "name", "lan0", "netns",
                         self.ns[router])
                self._ip(side, "addr", "add", f"{self.host_ip[side]}/24", "dev", "eth0")
                self._ip(side, "link", "set", "eth0", "up")
                self._ip(router, "addr", "add", f"10.{net}.{self.k}.1/24", "dev", "lan0")
                self._ip(router, "link", "set", "lan0", "up")
                self._ip(side, "route", "add", "default", "via", f"10.{net}.{self.k}.1")
                self._exec(router, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
                masq = ["iptables", "-w", "5", "-t", "nat", "-A", "POSTROUTING", "-o", "wan0", "-j", "MASQUERADE"]
                self._exec(router, *(masq + (["--random-fully"] if self.random_fully else [])))
                if self.block_udp:
                    self._exec(router, "iptables", "-w", "5", "-A", "FORWARD", "-p", "udp", "-j", "DROP")
        except Exception:
            self.close()
            raise
        return self

    def _wan_leg(self, ns: str, dev: str, net: int, address: str) -> None:
        """A link from the wan router (10.NET.K.1) to `ns` (`address`, default route via the wan)."""
        port = f"w{net}"
        self._ip(ns, "link", "add", dev, "type", "veth", "peer", "name", port, "netns", self.ns["wan"])
        self._ip("wan", "addr", "add", f"10.{net}.{self.k}.1/24", "dev", port)
        self._ip("wan", "link", "set", port, "up")
        self._ip(ns, "addr", "add", f"{address}/24", "dev", dev)
        self._ip(ns, "link", "set", dev, "up")
        self._ip(ns, "route", "add", "default", "via", f"10.{net}.{self.k}.1")

    def prefix(self, name: str) -> list[str]:
        return ["nsenter", f"--net=/var/run/netns/{self.ns[name]}", "--"]

    def cut_direct(self) -> None:
        """Drop UDP between the two routers' public addresses (the relay still reaches both)."""
        for side, other in (("a", "b"), ("b", "a")):
            self._exec(f"r{side}", "iptables", "-w", "5", "-I", "FORWARD", "-p", "udp", "-d",
                       self.router_ip[other], "-j", "DROP")
            self._exec(f"r{side}", "iptables", "-w", "5", "-I", "FORWARD", "-p", "udp", "-s",
                       self.router_ip[other], "-j", "DROP")

    def move_host(self, side: str) -> str:
        """Host `side` changes its address (a laptop from Wi-Fi to a cable): a new one in
        the same network, the old one removed, so its connections from the old address
        lose their way (their replies go to an address nobody has) and what it sends from
        now on leaves from the new one, through a new NAT mapping. Returns the new address."""
        old = self.host_ip[side]
        last = int(old.rsplit(".", 1)[1])
        new = f"{old.rsplit('.', 1)[0]}.{last + 1 if last < 250 else 2}"
        net = 202 if side == "a" else 203
        self._exec(side, "sysctl", "-q", "-w", "net.ipv4.conf.eth0.promote_secondaries=1")
        self._ip(side, "addr", "add", f"{new}/24", "dev", "eth0")
        self._ip(side, "addr", "del", f"{old}/24", "dev", "eth0")
        self._ip(side, "route", "replace", "default", "via", f"10.{net}.{self.k}.1", "src", new)
        self.host_ip[side] = new
        return new

    def udp_state(self) -> str:
        """What the two routers' NATs hold for UDP now (their conntrack entries), for a
        failure's message: whether a side's probes made a mapping, and to where."""
        out = []
        for router in ("ra", "rb"):
            r = subprocess.run(["ip", "netns", "exec", self.ns[router], "cat", "/proc/net/nf_conntrack"],
                               capture_output=True, text=True, timeout=10)
            udp = [" ".join(line.split()[2:]) for line in r.stdout.splitlines() if " udp " in line]
            out.append(f"router {router[1]}'s UDP conntrack entries ({len(udp)}{'' if r.returncode == 0 else ', ' + r.stderr.strip()}):\n"
                       + "\n".join(udp[-12:]))
        return "\n".join(out)

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self._made = []

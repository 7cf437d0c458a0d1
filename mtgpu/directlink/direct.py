"""The direct UDP path of a session (docs/DIRECTLINK.md, "The direct path").

One UDP socket per endpoint. Its public address comes from the relay's UDP answer; both
sides send their candidates (local addresses and the public one) and a random token over
the session's control stream. Then each sends a low-TTL opener to the other's
candidates (it opens its own NAT mapping and dies before the peer's router), says so
over the control stream ("open"), and probes every PROBE_EVERY_S for PUNCH_FOR_S once
the peer said the same, or a probe of the peer's came in. (A full probe that reached
the peer's NAT before the peer's own opener would leave an unreplied entry there that
moves the peer's mapping off the port it offered, for as long as the probes go on: a
peer that was slow to handle the offer, on a busy machine, never went direct. A peer
of a version without "open" is probed at once, as before.) A probe carries the receiver's token, so only the
session's peer can make a path; the first answer to a probe makes the path up at the
address it came from (another takes over only once that one went silent). While up, keep-alive probes every KEEPALIVE_S hold the NAT mappings, and
DOWN_AFTER_S with nothing heard puts the session back on the relay; it tries again
every RETRY_EVERY_S. An endpoint whose public address the relay has not told (its
answer was lost) asks again every PUBLIC_RETRY_S and offers it once known.

UDP datagrams: PROBE or ACK + 16-byte token, or a session tag (endpoint.py) + a QUIC
datagram (sent to the address the path is up at, taken from any of the peer's: endpoint.py).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from dataclasses import dataclass, field

from . import frames as F

PROBE, ACK = b"\x10", b"\x11"
PROBE_EVERY_S = 0.05
PUNCH_FOR_S = 5.0
KEEPALIVE_S = 1.0
DOWN_AFTER_S = 3.0
RETRY_EVERY_S = 10.0
PUBLIC_RETRY_S = 5.0  # the relay did not tell our public UDP address: asked again this often
OPENER_TTL = 2
SOCKET_BUFFER = 4 * 1024 * 1024


@dataclass
class DirectState:
    """One session's direct path."""

    my_token: bytes = field(default_factory=lambda: os.urandom(16))
    peer_token: bytes | None = None
    peer_candidates: list[tuple[str, int]] = field(default_factory=list)
    addr: tuple[str, int] | None = None  # where the path is up, else None
    heard: float = 0.0                   # monotonic: the last datagram from addr
    up_since: float | None = None
    punching: asyncio.Task | None = None
    retry_at: float = 0.0
    peer_waits: bool = False  # the peer says "open" and probes only after ours: we wait for its
    peer_open: bool = False   # the peer's openers to our candidates are out


class UdpSocket(asyncio.DatagramProtocol):
    """The endpoint's UDP socket; `on_datagram(data, addr)` is the endpoint's."""

    def __init__(self, on_datagram) -> None:
        self.on_datagram = on_datagram
        self.transport: asyncio.DatagramTransport | None = None
        self._reflect: dict[bytes, asyncio.Future] = {}

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):  # a burst of QUIC packets must not overflow it
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
            except OSError:
                pass

    def datagram_received(self, data: bytes, addr) -> None:
        if data.startswith(F.REFLECT_ANSWER):
            fut = self._reflect.pop(data[5:21], None)
            if fut is not None and not fut.done():
                fut.set_result(data[21:].decode("ascii", "replace"))
            return
        self.on_datagram(data, addr)

    def connection_lost(self, exc) -> None:
        self.transport = None  # closed: what is still sent (a probe, a keep-alive) goes nowhere

    def sendto(self, data: bytes, addr, ttl: int | None = None) -> None:
        """Send one datagram; a socket that is closed or closing, or a send the network
        refuses (ICMP unreachable, a dropped route), loses it: UDP may, QUIC resends."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        sock = transport.get_extra_info("socket")
        try:
            if ttl is not None:
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
            try:
                transport.sendto(data, addr)
            finally:
                if ttl is not None:
                    sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 64)
        except (OSError, AttributeError, ValueError):
            pass

    async def public_address(self, relay: tuple[str, int], timeout_s: float = 2.0) -> str | None:
        """The address the relay sees this socket at ("host:port"), or None (UDP blocked)."""
        token = os.urandom(16)
        fut = asyncio.get_running_loop().create_future()
        self._reflect[token] = fut
        ask = (F.REFLECT_ASK + token).ljust(F.REFLECT_ASK_SIZE, b"\0")
        try:
            for _ in range(int(timeout_s / 0.25)):
                self.sendto(ask, relay)
                try:
                    return await asyncio.wait_for(asyncio.shield(fut), 0.25)
                except asyncio.TimeoutError:
                    continue
            return None
        finally:
            self._reflect.pop(token, None)

    def local_port(self) -> int:
        return self.transport.get_extra_info("sockname")[1]


def local_addresses() -> list[str]:
    """This host's IPv4 addresses other than loopback (candidates on the same network)."""
    out = []
    try:
        import psutil
        for addrs in psutil.net_if_addrs().values():
            for a in addrs:
                if a.family == socket.AF_INET and not a.address.startswith("127."):
                    out.append(a.address)
    except Exception:  # noqa: BLE001 - candidates are a best effort
        pass
    return sorted(set(out))


def parse_candidates(values) -> list[tuple[str, int]]:
    out = []
    for v in values if isinstance(values, list) else []:
        host, sep, port = str(v).rpartition(":")
        if sep and port.isdigit() and 0 < int(port) < 65536:
            try:
                socket.inet_aton(host)
            except OSError:
                continue
            out.append((host, int(port)))
    return out[:16]


async def punch(udp: UdpSocket, state: DirectState, deadline_s: float = PUNCH_FOR_S,
                opened=None) -> None:
    """Openers to the peer's candidates, `opened()` (tell the peer), then, once the peer's
    openers are out too, probes until the path is up or time is out."""
    if state.peer_token is None or not state.peer_candidates:
        return
    for addr in state.peer_candidates:
        udp.sendto(PROBE + state.peer_token, addr, ttl=OPENER_TTL)
    if opened is not None:
        opened()
    await asyncio.sleep(PROBE_EVERY_S)
    end = time.monotonic() + deadline_s
    if state.peer_waits:
        while not state.peer_open and state.addr is None and time.monotonic() < end and udp.transport is not None:
            await asyncio.sleep(PROBE_EVERY_S)
        if not state.peer_open:
            return  # no word from the peer this round: tried again later, openers first
        end = time.monotonic() + deadline_s
    while state.addr is None and time.monotonic() < end and udp.transport is not None:
        for addr in state.peer_candidates:
            udp.sendto(PROBE + state.peer_token, addr)
        await asyncio.sleep(PROBE_EVERY_S)

"""An endpoint: its identity, its relay connection, its UDP socket and its sessions
(docs/DIRECTLINK.md).

Each relay frame or direct UDP datagram between two endpoints carries one QUIC datagram
after a byte that says which side's connection it is for (so two endpoints may dial each
other at once): TO_RESPONDER for the session the sender dialled, TO_DIALER for the one it
answers. A datagram goes direct while the session's direct path is up (direct.py), else
through the relay.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from . import direct as D
from .relay_client import RelayConnection
from .session import Session, SessionError, Stream
from .tlsbind import TlsIdentity

log = logging.getLogger(__name__)
TO_RESPONDER, TO_DIALER = b"\x00", b"\x01"


def is_new_dial(session: Session, datagram: bytes) -> bool:
    """Whether `datagram` opens another connection than `session`'s: a QUIC Initial
    packet to a destination id the session did not start with. (A set-up session never
    gets Initials of its own: the dialer drops its Initial keys during the handshake.)"""
    if len(datagram) < 7 or datagram[0] & 0xF0 != 0xC0:  # long header, fixed bit, type Initial
        return False
    length = datagram[5]
    dcid = datagram[6:6 + length]
    return dcid != session.original_dcid


class Endpoint:
    def __init__(self, key: Ed25519PrivateKey, relay: RelayConnection,
                 on_stream: Callable[[Session, Stream], Awaitable[None]] | None = None,
                 admit: Callable[[str, dict], str | None] | None = None, claims: dict | None = None) -> None:
        self.tls = TlsIdentity(key)
        self.id = self.tls.id
        self.relay = relay
        self.on_stream, self.admit, self.claims = on_stream, admit, claims
        self.dialled: dict[str, Session] = {}
        self.answered: dict[str, Session] = {}
        self.udp: D.UdpSocket | None = None
        self.public: str | None = None  # this endpoint's UDP address as the relay sees it
        self.candidates: list[str] = []
        self._pump = asyncio.ensure_future(self._receive())
        self._keeper: asyncio.Task | None = None

    async def enable_direct(self, relay_udp: tuple[str, int], bind: str = "0.0.0.0",
                            local_candidates: bool = True) -> bool:
        """Open the UDP socket and learn its public address from the relay: sessions then
        try a direct path. False (relay only) when the relay does not answer over UDP.
        `local_candidates`: also offer this host's own addresses (peers on its network)."""
        loop = asyncio.get_running_loop()
        _t, self.udp = await loop.create_datagram_endpoint(lambda: D.UdpSocket(self._udp_datagram),
                                                           local_addr=(bind, 0))
        self.public = await self.udp.public_address(relay_udp)
        port = self.udp.local_port()
        mine = [f"{a}:{port}" for a in D.local_addresses()] if local_candidates else []
        self.candidates = ([self.public] if self.public else []) + [c for c in mine if c != self.public]
        self._keeper = asyncio.ensure_future(self._keep_paths())
        if self.public is None:
            log.info("directlink: the relay does not answer over UDP: sessions stay on the relay")
        return self.public is not None

    # ------------------------------------------------------------ sessions
    async def dial(self, peer_id: str, timeout_s: float = 15.0) -> Session:
        """A session with `peer_id`, set up and checked both ways (raises SessionError)."""
        s = self.dialled.get(peer_id)
        if s is None or s.closed.is_set():
            s = self.dialled[peer_id] = Session.dial(self.tls, peer_id, lambda d: None, self.claims)
            s.send = self._sender(s, peer_id, TO_RESPONDER)
            self._watch(s)
        await s.wait_ready(timeout_s)
        return s

    def _sender(self, session: Session, peer_id: str, tag: bytes) -> Callable[[bytes], None]:
        def send(datagram: bytes) -> None:
            st = getattr(session, "direct", None)
            if st is not None and st.addr is not None and self.udp is not None:
                self.udp.sendto(tag + datagram, st.addr)
            else:
                self.relay.send(peer_id, tag + datagram)
        return send

    def _watch(self, s: Session) -> None:
        """Once the session is set up, offer the direct path (when this endpoint has one)."""
        s.direct = D.DirectState()
        s.on_control = self._control

        async def offer() -> None:
            await s.ready.wait()
            if self.udp is not None and self.candidates:
                s.send_control({"direct": {"token": s.direct.my_token.hex(), "candidates": self.candidates}})
        asyncio.ensure_future(offer())

    def _control(self, s: Session, message: dict) -> None:
        offer = message.get("direct")
        if not isinstance(offer, dict) or self.udp is None:
            return
        try:
            token = bytes.fromhex(str(offer.get("token")))
        except ValueError:
            return
        if len(token) != 16:
            return
        st = s.direct
        st.peer_token, st.peer_candidates = token, D.parse_candidates(offer.get("candidates"))
        log.debug("directlink: %s... offers a direct path at %s", s.peer_id[:16], st.peer_candidates)
        self._punch(s)

    def _punch(self, s: Session) -> None:
        st = s.direct
        if st.addr is None and (st.punching is None or st.punching.done()):
            st.punching = asyncio.ensure_future(D.punch(self.udp, st))

    def _udp_datagram(self, data: bytes, addr) -> None:
        kind, body = data[:1], data[1:]
        now = time.monotonic()
        if kind in (D.PROBE, D.ACK):
            log.debug("directlink: %s from %s:%d", "probe" if kind == D.PROBE else "answer", *addr)
        sessions = [s for s in list(self.dialled.values()) + list(self.answered.values())
                    if getattr(s, "direct", None) is not None and not s.closed.is_set()]
        if kind == D.PROBE:
            for s in sessions:
                if body == s.direct.my_token and s.direct.peer_token is not None:
                    self.udp.sendto(D.ACK + s.direct.peer_token, addr)
            return
        if kind == D.ACK:
            for s in sessions:
                if body == s.direct.my_token:
                    if s.direct.addr != addr:
                        log.info("directlink: session with %s... is direct at %s:%d", s.peer_id[:16], *addr)
                        s.direct.up_since = now
                    s.direct.addr, s.direct.heard, s.path = addr, now, "direct"
            return
        table = self.answered if kind == TO_RESPONDER else self.dialled if kind == TO_DIALER else None
        for s in sessions:
            if s.direct.addr == addr and table is not None and table.get(s.peer_id) is s:
                s.direct.heard = now
                s.feed(body)
                return

    async def _keep_paths(self) -> None:
        while True:
            await asyncio.sleep(D.KEEPALIVE_S)
            now = time.monotonic()
            for s in list(self.dialled.values()) + list(self.answered.values()):
                st = getattr(s, "direct", None)
                if st is None or s.closed.is_set():
                    continue
                if st.addr is not None:
                    if now - st.heard > D.DOWN_AFTER_S:
                        log.info("directlink: the direct path to %s... stopped answering: back on the relay",
                                 s.peer_id[:16])
                        st.addr, st.up_since, s.path = None, None, "relay"
                        st.retry_at = now + 0.5
                    else:
                        self.udp.sendto(D.PROBE + st.peer_token, st.addr)
                elif st.peer_token is not None and now >= getattr(st, "retry_at", 0.0) and (
                        st.punching is None or st.punching.done()):
                    st.retry_at = now + D.RETRY_EVERY_S
                    self._punch(s)

    async def _receive(self) -> None:
        while True:
            src, payload = await self.relay.incoming.get()
            tag, datagram = payload[:1], payload[1:]
            try:
                if tag == TO_DIALER:
                    s = self.dialled.get(src)
                    if s is not None and not s.closed.is_set():
                        s.feed(datagram)
                elif tag == TO_RESPONDER:
                    s = self.answered.get(src)
                    if s is not None and not s.closed.is_set() and s.ready.is_set() and is_new_dial(s, datagram):
                        s.close("the peer dialled again")  # it restarted: its old session is gone
                    if s is None or s.closed.is_set():
                        s = self.answered[src] = Session.answer(self.tls, src, datagram, lambda d: None,
                                                                self._stream_for(src), self.admit)
                        s.send = self._sender(s, src, TO_DIALER)
                        self._watch(s)
                    s.feed(datagram)
            except (ValueError, SessionError) as e:  # a datagram that is not QUIC, or not for us
                log.debug("directlink: dropped a datagram from %s...: %s", src[:16], e)
            except Exception:  # noqa: BLE001 - one bad datagram must not stop every session
                log.warning("directlink: a datagram from %s... could not be handled", src[:16], exc_info=True)

    def _stream_for(self, src: str):
        async def handle(stream: Stream) -> None:
            if self.on_stream is not None:
                await self.on_stream(self.answered[src], stream)
        return handle

    async def close(self) -> None:
        for s in list(self.dialled.values()) + list(self.answered.values()):
            s.close("the endpoint closes")
        await asyncio.sleep(0)
        self._pump.cancel()
        if self._keeper is not None:
            self._keeper.cancel()
        if self.udp is not None and self.udp.transport is not None:
            self.udp.transport.close()
        await self.relay.close()

"""An endpoint: its identity, its relay connection, its UDP socket and its sessions
(docs/DIRECTLINK.md).

Each relay frame or direct UDP datagram between two endpoints carries one QUIC datagram
after a byte that says which side's connection it is for (so two endpoints may dial each
other at once): TO_RESPONDER for the session the sender dialled, TO_DIALER for the one it
answers. A datagram goes direct while the session's direct path is up (direct.py), else
through the relay; while the direct path is silent (SUSPECT_AFTER_S) it goes both ways.

A peer may hold many sessions with an endpoint at once (two ssh terminals, scp beside
them, API calls): the answering side tells them apart by the QUIC destination connection
id of each datagram, never ends one because another starts, and takes at most
MAX_SESSIONS_PER_PEER from one peer (the next is refused, saying so). The relay
connection is kept: when it drops, sessions on the direct path go on, new ones wait
until it is back (with `reconnect`, the endpoint connects again itself).
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
MAX_SESSIONS_PER_PEER = 32
SUSPECT_AFTER_S = 0.6   # the direct path silent this long: datagrams go the relay's way too
PATH_KEEPALIVE_S = 0.2  # a probe on an up path this often (its answer shows the path works both ways)
TICK_S = 0.1
RECONNECT_S = (0.5, 1.0, 2.0, 5.0, 10.0)
CID_LENGTH = 8  # qh3's connection_id_length: the length of a short header's destination id


def destination_cid(datagram: bytes) -> bytes | None:
    """The destination connection id of a QUIC packet (None: not one)."""
    if not datagram:
        return None
    if datagram[0] & 0x80:  # long header: flags, version (4), id length, id
        if len(datagram) < 7 or datagram[5] > 20 or len(datagram) < 6 + datagram[5]:
            return None
        return bytes(datagram[6:6 + datagram[5]])
    return bytes(datagram[1:1 + CID_LENGTH]) if len(datagram) > CID_LENGTH else None


def is_initial(datagram: bytes) -> bool:
    return len(datagram) >= 7 and datagram[0] & 0xF0 == 0xC0  # long header, fixed bit, type Initial


class Endpoint:
    def __init__(self, key: Ed25519PrivateKey, relay: RelayConnection,
                 on_stream: Callable[[Session, Stream], Awaitable[None]] | None = None,
                 admit: Callable[[str, dict], str | None] | None = None, claims: dict | None = None,
                 reconnect: Callable[[], Awaitable[RelayConnection]] | None | bool = True) -> None:
        """`reconnect`: how to connect to a relay again when the connection drops (True:
        the same relay, with the same credential; None or False: the owner calls
        use_relay itself)."""
        self.tls = TlsIdentity(key)
        self.id = self.tls.id
        self.relay = relay
        self.on_stream, self.admit, self.claims = on_stream, admit, claims
        self.dialled: dict[str, Session] = {}
        self.answered: dict[str, list[Session]] = {}  # peer id -> its sessions that are not closed
        self._routes: dict[bytes, Session] = {}       # destination connection id -> answered session
        self.udp: D.UdpSocket | None = None
        self.relay_udp: tuple[str, int] | None = None
        self.public: str | None = None  # this endpoint's UDP address as the relay sees it
        self.candidates: list[str] = []
        self._local_candidates = True
        self._pump = asyncio.ensure_future(self._receive(relay))
        self._keeper: asyncio.Task | None = None
        self._closing = False
        self._reconnect = (relay.reopen if reconnect is True else reconnect) or None
        self._relay_keeper = asyncio.ensure_future(self._keep_relay()) if self._reconnect else None

    def sessions(self) -> list[Session]:
        """Every session not closed, dialled and answered."""
        out = [s for s in self.dialled.values() if not s.closed.is_set()]
        for group in self.answered.values():
            out += [s for s in group if not s.closed.is_set()]
        return out

    async def enable_direct(self, relay_udp: tuple[str, int], bind: str = "0.0.0.0",
                            local_candidates: bool = True) -> bool:
        """Open the UDP socket and learn its public address from the relay: sessions then
        try a direct path. False (relay only) when the relay does not answer over UDP.
        `local_candidates`: also offer this host's own addresses (peers on its network)."""
        loop = asyncio.get_running_loop()
        _t, self.udp = await loop.create_datagram_endpoint(lambda: D.UdpSocket(self._udp_datagram),
                                                           local_addr=(bind, 0))
        self.relay_udp, self._local_candidates, self._bind = relay_udp, local_candidates, bind
        self._local_ips = D.local_addresses()
        await self._learn_public()
        self._keeper = asyncio.ensure_future(self._keep_paths())
        if self.public is None:
            log.info("directlink: the relay does not answer over UDP (asked again every %g s): sessions stay on "
                     "the relay until it does", D.PUBLIC_RETRY_S)
        return self.public is not None

    async def _learn_public(self) -> bool:
        """Ask the relay where it sees the UDP socket; True when that changed."""
        before = self.public
        self.public = await self.udp.public_address(self.relay_udp)
        port = self.udp.local_port()
        mine = [f"{a}:{port}" for a in D.local_addresses()] if self._local_candidates else []
        self.candidates = ([self.public] if self.public else []) + [c for c in mine if c != self.public]
        return self.public != before

    # ------------------------------------------------------------ the relay
    def use_relay(self, relay: RelayConnection, relay_udp: tuple[str, int] | None = None) -> None:
        """Go on with another relay connection (the old one dropped): sessions are kept;
        the public UDP address is asked again (a new relay, or a new network)."""
        old, self.relay = self.relay, relay
        relay.claim([cid for s in self.sessions() for cid in s.cids])  # the relay may hold our old connection too
        self._ping_all()  # what was lost meanwhile is resent as soon as the peer's answer comes this way
        self._pump.cancel()
        self._pump = asyncio.ensure_future(self._receive(relay))
        if old is not relay:
            asyncio.ensure_future(old.close())
        if relay_udp is not None:
            self.relay_udp = relay_udp
        if self.udp is not None and self.relay_udp is not None:
            asyncio.ensure_future(self._moved())

    def _ping_all(self) -> None:
        for s in self.sessions():
            if s.ready.is_set():
                s.conn.send_ping(int(time.monotonic() * 1000) & 0xFFFFFFFF)
                s.flush()

    async def _keep_relay(self) -> None:
        while not self._closing:
            await self.relay.closed.wait()
            if self._closing:
                return
            where = self.relay.where
            direct = sum(1 for s in self.sessions() if s.path == "direct")
            log.warning("directlink: the relay %s closed the connection; %d session(s) on the direct path go on, "
                        "new sessions wait until it is back (connecting again)", where, direct)
            for attempt in range(1 << 30):
                await asyncio.sleep(RECONNECT_S[min(attempt, len(RECONNECT_S) - 1)] if attempt else 0)
                if self._closing:
                    return
                try:
                    relay = await self._reconnect()
                except Exception as e:  # noqa: BLE001 - any failure: try again later, said once per try
                    log.info("directlink: the relay %s: %s; trying again", where, e or type(e).__name__)
                    continue
                self.use_relay(relay)
                log.info("directlink: connected to the relay %s again", where)
                break

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
                if time.monotonic() - st.heard > SUSPECT_AFTER_S:
                    self.relay.send(peer_id, tag + datagram)  # QUIC drops the copy that comes second
            else:
                self.relay.send(peer_id, tag + datagram)
        return send

    def _watch(self, s: Session) -> None:
        """Once the session is set up, offer the direct path (when this endpoint has one)."""
        s.direct = D.DirectState()
        s.on_control = self._control

        async def offer() -> None:
            await s.ready.wait()
            self._offer(s)
        asyncio.ensure_future(offer())

    def _offer(self, s: Session, moved: bool = False, opened: bool = False) -> None:
        """Our token and candidates; `opened`: our openers to the peer's candidates are out
        (the key itself tells the peer we speak "open": direct.py)."""
        if self.udp is not None and self.candidates and s.ready.is_set():
            offer = {"token": s.direct.my_token.hex(), "candidates": self.candidates, "open": opened}
            s.send_control({"direct": dict(offer, moved=True) if moved else offer})

    def _answer(self, src: str, datagram: bytes) -> Session | None:
        """A new session for a dialer's first Initial (None: dropped, too many half-open)."""
        group = self.answered.setdefault(src, [])
        group[:] = [s for s in group if not s.closed.is_set()]
        if len(group) >= MAX_SESSIONS_PER_PEER + 8:  # refused ones still closing; more is a flood
            log.debug("directlink: dropped a dial from %s...: %d sessions open", src[:16], len(group))
            return None
        s = Session.answer(self.tls, src, datagram, lambda d: None, None, self._admit_for(src))
        s.on_stream = self._stream_for(s)
        s.send = self._sender(s, src, TO_DIALER)
        s.on_cid = self._cid
        group.append(s)
        for cid in (s.original_dcid, s.conn.host_cid):
            self._routes[cid] = s
        self._watch(s)
        asyncio.ensure_future(self._forget(s))
        return s

    def _admit_for(self, src: str) -> Callable[[str, dict], str | None]:
        def admit(ident: str, claims: dict) -> str | None:
            ready = [s for s in self.answered.get(src, []) if s.ready.is_set() and not s.closed.is_set()]
            if len(ready) >= MAX_SESSIONS_PER_PEER:
                return (f"{src[:16]}... has {len(ready)} sessions open with this node, the most one key may hold "
                        f"(MAX_SESSIONS_PER_PEER = {MAX_SESSIONS_PER_PEER}): close one and try again")
            return self.admit(ident, claims) if self.admit is not None else None
        return admit

    def _cid(self, s: Session, cid: bytes, issued: bool) -> None:
        if issued and not s.closed.is_set():
            self._routes[cid] = s
        elif self._routes.get(cid) is s:
            del self._routes[cid]

    async def _forget(self, s: Session) -> None:
        await s.closed.wait()
        for cid in [c for c, x in self._routes.items() if x is s]:
            del self._routes[cid]
        group = self.answered.get(s.peer_id)
        if group is not None and s in group:
            group.remove(s)
            if not group:
                del self.answered[s.peer_id]

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
        candidates = D.parse_candidates(offer.get("candidates"))
        moved = st.peer_candidates and candidates != st.peer_candidates
        st.peer_token, st.peer_candidates = token, candidates
        st.peer_waits = "open" in offer
        st.peer_open = (st.peer_open and not moved) or offer.get("open") is True
        log.debug("directlink: %s... offers a direct path at %s", s.peer_id[:16], st.peer_candidates)
        if moved:  # the peer moved: a ping now, whose answer shows what of ours was lost on the way
            s.conn.send_ping(int(time.monotonic() * 1000) & 0xFFFFFFFF)
            s.flush()
            if st.addr is not None and (offer.get("moved") is True or time.monotonic() - st.heard > SUSPECT_AFTER_S):
                self._down(s, "the peer moved")
        self._punch(s)

    def _punch(self, s: Session) -> None:
        st = s.direct
        if st.addr is None and (st.punching is None or st.punching.done()):
            st.punching = asyncio.ensure_future(D.punch(self.udp, st, opened=lambda: self._offer(s, opened=True)))

    def _down(self, s: Session, why: str) -> None:
        log.info("directlink: the direct path to %s... %s: back on the relay", s.peer_id[:16], why)
        st = s.direct
        st.addr, st.up_since, s.path = None, None, "relay"
        st.retry_at = time.monotonic() + 0.5

    def _udp_datagram(self, data: bytes, addr) -> None:
        kind, body = data[:1], data[1:]
        now = time.monotonic()
        if kind in (D.PROBE, D.ACK):
            log.debug("directlink: %s from %s:%d", "probe" if kind == D.PROBE else "answer", *addr)
            for s in self.sessions():
                st = getattr(s, "direct", None)
                if st is None or body != st.my_token:
                    continue
                if kind == D.PROBE and st.peer_token is not None:
                    st.peer_open = True  # its probe came through: its mapping to us is open
                    self.udp.sendto(D.ACK + st.peer_token, addr)
                    if st.addr != addr and (st.addr is None or now - st.heard > SUSPECT_AFTER_S):
                        self.udp.sendto(D.PROBE + st.peer_token, addr)  # the peer moved here: its answer moves us
                elif kind == D.ACK:
                    if st.addr == addr:
                        st.heard = now
                    elif st.addr is None or now - st.heard > SUSPECT_AFTER_S:
                        # the first answer makes the path (probes to every candidate answer from
                        # each of the peer's addresses: a path that flipped between them with
                        # each answer left the two sides at different addresses); another
                        # address takes over only once the one in use went silent
                        log.info("directlink: session with %s... is direct at %s:%d", s.peer_id[:16], *addr)
                        st.addr, st.heard, st.up_since = addr, now, now
                    s.path = "direct" if st.addr is not None else s.path
            return
        # A session's datagram, routed by its connection id and accepted from whichever of
        # the peer's addresses it came (each side keeps the address its own probes were
        # answered from, and a host with several may send from another): QUIC checks every
        # packet, so one from elsewhere is dropped there. Only the path's own address
        # counts as hearing it.
        s = None
        cid = destination_cid(body) or b""
        if kind == TO_RESPONDER:
            s = self._routes.get(cid)
        elif kind == TO_DIALER:
            s = next((x for x in self.dialled.values() if cid in x.cids), None) or next(
                (x for x in self.dialled.values() if getattr(x, "direct", None) is not None and x.direct.addr == addr),
                None)
        if s is not None and not s.closed.is_set() and getattr(s, "direct", None) is not None:
            if s.direct.addr == addr:
                s.direct.heard = now
            s.feed(body)

    async def _keep_paths(self) -> None:
        public_retry_at = time.monotonic() + D.PUBLIC_RETRY_S
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            moved = suspect = False
            if self.public is None and now >= public_retry_at:
                # the relay's UDP answer was lost (a busy relay, a relay that started after
                # us): without our public address no peer behind a NAT can reach us, for as
                # long as the endpoint lives (a member's: for days). Ask again.
                public_retry_at = now + D.PUBLIC_RETRY_S
                moved = True
            for s in self.sessions():
                st = getattr(s, "direct", None)
                if st is None:
                    continue
                if st.addr is not None:
                    silent = now - st.heard
                    if silent > D.DOWN_AFTER_S:
                        self._down(s, "stopped answering")
                        moved = True
                    elif silent > SUSPECT_AFTER_S and not getattr(st, "suspect", False):
                        st.suspect = True  # a ping both ways: its answer through the relay resends what was lost
                        s.conn.send_ping(int(now * 1000) & 0xFFFFFFFF)
                        s.flush()
                        self.udp.sendto(D.PROBE + st.peer_token, st.addr)
                        suspect = True
                    elif now - getattr(st, "probed", 0.0) >= PATH_KEEPALIVE_S:
                        st.probed = now
                        self.udp.sendto(D.PROBE + st.peer_token, st.addr)
                    if silent <= SUSPECT_AFTER_S:
                        st.suspect = False
                elif st.peer_token is not None and now >= getattr(st, "retry_at", 0.0) and (
                        st.punching is None or st.punching.done()):
                    st.retry_at = now + D.RETRY_EVERY_S
                    self._punch(s)
            if suspect and self._reconnect is not None and not getattr(self, "_checking", False):
                asyncio.ensure_future(self._check_relay())  # this side may have moved: is the relay still there?
            if moved:
                asyncio.ensure_future(self._moved())

    async def _check_relay(self) -> None:
        """The direct path went silent: when this host's addresses changed (a laptop from
        Wi-Fi to a cable), the relay connection left from an address it no longer has:
        connect again at once; else ask the relay whether it is still there."""
        self._checking = True
        try:
            ips = await asyncio.get_running_loop().run_in_executor(None, D.local_addresses)
            if ips != getattr(self, "_local_ips", ips):
                self._local_ips = ips
                log.info("directlink: this host's addresses changed (now %s): connecting to the relay again",
                         ", ".join(ips) or "none")
                self.relay.abandon()
                await self._new_socket()
                self._open_after_move()
                await self._moved(force=True)
            elif not await self.relay.check(1.0):
                log.info("directlink: the relay %s stopped answering (this endpoint moved?)", self.relay.where)
                await self._moved()
        finally:
            self._checking = False

    async def _new_socket(self) -> None:
        """A fresh UDP socket after a move: its NAT mappings are new to every destination
        alike (the old socket's, still held by the NAT, would push the new ones off their
        port, so the address the relay reports would not be the one the peer sees)."""
        old = self.udp
        loop = asyncio.get_running_loop()
        try:
            _t, self.udp = await loop.create_datagram_endpoint(lambda: D.UdpSocket(self._udp_datagram),
                                                               local_addr=(self._bind, 0))
        except OSError as e:
            log.info("directlink: no new UDP socket after the move (%s): the old one goes on", e)
            return
        if old is not None and old.transport is not None:
            old.transport.close()

    def _open_after_move(self) -> None:
        """After a move every session goes through the relay, and this side sends only
        low-TTL openers to its peers (NAT mappings of its own, nothing that reaches the
        peer's NAT): the peer, told by the offer, opens its side and probes first, and
        its probe is answered (a full probe from here first would leave an unreplied
        entry in the peer's NAT that moves the peer's mapping off its port)."""
        now = time.monotonic()
        for s in self.sessions():
            st = getattr(s, "direct", None)
            if st is None or st.peer_token is None:
                continue
            st.addr, st.up_since, s.path = None, None, "relay"
            st.peer_open = False  # the peer's openers went to our old address
            st.retry_at = now + 3.0  # then this side punches too, when the peer's probes did not come
            for addr in st.peer_candidates:
                self.udp.sendto(D.PROBE + st.peer_token, addr, ttl=D.OPENER_TTL)

    async def _moved(self, force: bool = False) -> None:
        """A path went down, or the relay changed: ask the public address again, and
        offer the new one to every session when it changed (a NAT rebinding, a new
        network; `force`: this host moved, offered in any case and said so)."""
        if self.udp is None or self.relay_udp is None or getattr(self, "_asking", False):
            return
        self._asking = True
        try:
            if await self._learn_public() or force:
                log.info("directlink: this endpoint's public UDP address is now %s", self.public)
                for s in self.sessions():
                    st = getattr(s, "direct", None)
                    # forced: _open_after_move sent the openers to every peer that offered
                    self._offer(s, moved=force, opened=force and st is not None and st.peer_token is not None)
                    if not force and st is not None and st.addr is None and st.peer_token is not None:
                        self._punch(s)  # our openers now, while the peer punches on our offer
        finally:
            self._asking = False

    async def _receive(self, relay: RelayConnection) -> None:
        while True:
            src, payload = await relay.incoming.get()
            tag, datagram = payload[:1], payload[1:]
            try:
                if tag == TO_DIALER:
                    s = self.dialled.get(src)
                    if s is not None and not s.closed.is_set():
                        s.feed(datagram)
                elif tag == TO_RESPONDER:
                    s = self._routes.get(destination_cid(datagram) or b"")
                    if s is not None and (s.peer_id != src or s.closed.is_set()):
                        s = None  # another peer's id, or a session that ended: not this one's
                    if s is None and is_initial(datagram):
                        s = self._answer(src, datagram)
                    if s is not None:
                        s.feed(datagram)
            except (ValueError, SessionError) as e:  # a datagram that is not QUIC, or not for us
                log.debug("directlink: dropped a datagram from %s...: %s", src[:16], e)
            except Exception:  # noqa: BLE001 - one bad datagram must not stop every session
                log.warning("directlink: a datagram from %s... could not be handled", src[:16], exc_info=True)

    def _stream_for(self, session: Session):
        async def handle(stream: Stream) -> None:
            if self.on_stream is not None:
                await self.on_stream(session, stream)
        return handle

    async def close(self) -> None:
        self._closing = True
        for s in self.sessions():
            s.close("the endpoint closes")
        await asyncio.sleep(0)
        self._pump.cancel()
        for task in (self._keeper, self._relay_keeper):
            if task is not None:
                task.cancel()
        if self.udp is not None and self.udp.transport is not None:
            self.udp.transport.close()
        await self.relay.close()

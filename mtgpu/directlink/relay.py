"""The relay (`mtgpu-relay`, docs/DIRECTLINK.md): on TLS 1.3 (relaytls.py), admits
endpoints that show a credential of a cluster it serves and prove they hold their id's
key, then forwards frames between
endpoints of one cluster by destination id. It holds no session key and keeps nothing
but the table of who is connected; it also answers UDP "what address do you see me
from" asks on its port, which endpoints need for the direct path."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from . import frames as F
from .identity import Credential, CredentialError, check, check_challenge
from .relaytls import HANDSHAKE_TIMEOUT_S, RelayTls

log = logging.getLogger(__name__)
HELLO_TIMEOUT_S = 10.0
QUEUE_FRAMES = 512  # frames waiting for a slow receiver before the sender waits
CONNECTIONS_PER_ID = 64  # one endpoint id's connections at once (a laptop's terminals); the oldest goes beyond
CIDS_PER_CONNECTION = 64


def source_cid(datagram: bytes) -> bytes | None:
    """The source connection id of a QUIC long-header packet (None: a short header, or not QUIC)."""
    if len(datagram) < 7 or not datagram[0] & 0x80:
        return None
    at = 6 + datagram[5]
    if len(datagram) <= at or len(datagram) < at + 1 + datagram[at]:
        return None
    return bytes(datagram[at + 1:at + 1 + datagram[at]])


def destination_cid(datagram: bytes) -> bytes | None:
    if len(datagram) < 7 or not datagram[0] & 0x80:
        return bytes(datagram[1:9]) if len(datagram) > 9 else None
    return bytes(datagram[6:6 + datagram[5]])


@dataclass
class _Endpoint:
    cred: Credential
    writer: asyncio.StreamWriter
    queue: asyncio.Queue = field(default_factory=lambda: asyncio.Queue(QUEUE_FRAMES))
    cids: dict = field(default_factory=dict)  # QUIC connection ids its packets named as theirs (ordered)


class Relay:
    def __init__(self, trusted: dict[str, Ed25519PublicKey], clock=time.time) -> None:
        self.trusted = trusted
        self.clock = clock
        # (cluster, raw id) -> its connections, newest last: one id may be connected several
        # times at once (a laptop's ssh terminals, each its own process and session); a frame
        # for it goes to the connection whose QUIC connection id it names, else the newest.
        self._endpoints: dict[tuple[str, bytes], list[_Endpoint]] = {}
        self.forwarded_frames = 0
        self.forwarded_bytes = 0
        self.refusals: list[str] = []
        self.tap: Callable[[bytes], None] | None = None  # sees every forwarded payload (tests: "only ciphertext")
        self.tls = RelayTls()

    # ------------------------------------------------------------ TCP
    async def serve(self, host: str, port: int) -> tuple[asyncio.AbstractServer, asyncio.DatagramTransport]:
        server = await asyncio.start_server(self._connection, host, port, ssl=self.tls.context,
                                            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
        bound = server.sockets[0].getsockname()
        loop = asyncio.get_running_loop()
        udp, _ = await loop.create_datagram_endpoint(lambda: _Reflector(), local_addr=(bound[0], bound[1]))
        return server, udp

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        me = None
        try:
            me = await asyncio.wait_for(self._admit(reader, writer, peer), HELLO_TIMEOUT_S)
            if me is None:
                return
            sender = asyncio.create_task(self._send_loop(me))
            try:
                await self._receive_loop(reader, me)
            finally:
                sender.cancel()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError, F.FrameError) as e:
            log.debug("relay: %s: %s", peer, e)
        finally:
            if me is not None:
                key = (me.cred.cluster, bytes.fromhex(me.cred.id))
                group = self._endpoints.get(key, [])
                if me in group:
                    group.remove(me)
                    if not group:
                        del self._endpoints[key]
                    log.info("relay: %s %s (%s) left", me.cred.role, me.cred.name, me.cred.id[:12])
            writer.close()

    async def _admit(self, reader, writer, peer) -> _Endpoint | None:
        nonce = os.urandom(32)
        writer.write(F.pack(F.CHALLENGE, nonce))
        kind, payload = await F.read_frame(reader)
        why = None
        cred = None
        if kind != F.HELLO:
            why = f"the first frame must be a hello (type {F.HELLO}), not type {kind}"
        else:
            try:
                hello = json.loads(payload)
                cred = Credential.from_dict(hello["credential"])
                why = check(cred, self.trusted, self.clock()) or check_challenge(cred.id, nonce, str(hello["proof"]),
                                                                             self.tls.fingerprint)
            except (ValueError, KeyError, TypeError, CredentialError) as e:
                why = f"the hello cannot be read: {e}"
        if why:
            self.refusals.append(why)
            log.warning("relay: refused %s: %s", peer, why)
            writer.write(F.pack(F.REFUSED, why.encode()))
            await writer.drain()
            return None
        me = _Endpoint(cred, writer)
        key = (cred.cluster, bytes.fromhex(cred.id))
        group = self._endpoints.setdefault(key, [])
        group.append(me)
        while len(group) > CONNECTIONS_PER_ID:  # a restarted endpoint's dead connections go first
            group.pop(0).writer.close()
        observed = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else ""
        welcome = {"id": cred.id, "observed": observed, "claims": True}  # CLAIM understood
        writer.write(F.pack(F.WELCOME, json.dumps(welcome).encode()))
        log.info("relay: admitted %s %s of %s (%s) from %s", cred.role, cred.name, cred.cluster, cred.id[:12], observed)
        return me

    async def _receive_loop(self, reader, me: _Endpoint) -> None:
        cluster = me.cred.cluster
        src = bytes.fromhex(me.cred.id)
        while True:
            kind, payload = await F.read_frame(reader)
            if kind == F.SEND and len(payload) >= 32:
                scid = source_cid(payload[33:])
                if scid and scid not in me.cids:
                    me.cids[scid] = None
                    if len(me.cids) > CIDS_PER_CONNECTION:
                        del me.cids[next(iter(me.cids))]
                dst = self._pick(self._endpoints.get((cluster, payload[:32])), payload[33:])
                if dst is None:
                    me.queue.put_nowait(F.pack(F.UNREACHABLE, payload[:32])) if not me.queue.full() else None
                    continue
                if self.tap is not None:
                    self.tap(payload[32:])
                await dst.queue.put(F.pack(F.RECV, src + payload[32:]))
                self.forwarded_frames += 1
                self.forwarded_bytes += len(payload) - 32
            elif kind == F.CLAIM:  # an endpoint that connected again names its sessions' ids
                group = self._endpoints.get((cluster, src), [])
                at = 0
                while at < len(payload) and len(me.cids) < CIDS_PER_CONNECTION * 2:
                    cid = bytes(payload[at + 1:at + 1 + payload[at]])
                    at += 1 + payload[at]
                    for other in group:
                        other.cids.pop(cid, None)
                    me.cids[cid] = None
            elif kind == F.PING:
                if not me.queue.full():
                    me.queue.put_nowait(F.pack(F.PONG, payload[:64]))
            else:
                raise F.FrameError(f"an endpoint sent a frame of type {kind}")

    @staticmethod
    def _pick(group: list[_Endpoint] | None, datagram: bytes) -> _Endpoint | None:
        if not group:
            return None
        if len(group) > 1:
            dcid = destination_cid(datagram)
            for e in reversed(group):
                if dcid in e.cids:
                    return e
        return group[-1]

    @staticmethod
    async def _send_loop(me: _Endpoint) -> None:
        while True:
            frame = await me.queue.get()
            me.writer.write(frame)
            while not me.queue.empty() and me.writer.transport.get_write_buffer_size() < (1 << 20):
                me.writer.write(me.queue.get_nowait())
            await me.writer.drain()

    def connected(self) -> list[tuple[str, str, str]]:
        return sorted((e.cred.cluster, e.cred.role, e.cred.name) for g in self._endpoints.values() for e in g)


class _Reflector(asyncio.DatagramProtocol):
    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        if data.startswith(F.REFLECT_ASK) and len(data) >= F.REFLECT_ASK_SIZE:
            token = data[len(F.REFLECT_ASK):len(F.REFLECT_ASK) + 16]
            self.transport.sendto(F.REFLECT_ANSWER + token + f"{addr[0]}:{addr[1]}".encode(), addr)

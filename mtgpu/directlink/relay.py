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


@dataclass
class _Endpoint:
    cred: Credential
    writer: asyncio.StreamWriter
    queue: asyncio.Queue = field(default_factory=lambda: asyncio.Queue(QUEUE_FRAMES))


class Relay:
    def __init__(self, trusted: dict[str, Ed25519PublicKey], clock=time.time) -> None:
        self.trusted = trusted
        self.clock = clock
        self._endpoints: dict[tuple[str, bytes], _Endpoint] = {}  # (cluster, raw id) -> endpoint
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
                if self._endpoints.get(key) is me:
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
        old = self._endpoints.get(key)
        self._endpoints[key] = me  # a reconnect replaces the old connection
        if old is not None:
            old.writer.close()
        observed = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else ""
        writer.write(F.pack(F.WELCOME, json.dumps({"id": cred.id, "observed": observed}).encode()))
        log.info("relay: admitted %s %s of %s (%s) from %s", cred.role, cred.name, cred.cluster, cred.id[:12], observed)
        return me

    async def _receive_loop(self, reader, me: _Endpoint) -> None:
        cluster = me.cred.cluster
        src = bytes.fromhex(me.cred.id)
        while True:
            kind, payload = await F.read_frame(reader)
            if kind == F.SEND and len(payload) >= 32:
                dst = self._endpoints.get((cluster, payload[:32]))
                if dst is None:
                    me.queue.put_nowait(F.pack(F.UNREACHABLE, payload[:32])) if not me.queue.full() else None
                    continue
                if self.tap is not None:
                    self.tap(payload[32:])
                await dst.queue.put(F.pack(F.RECV, src + payload[32:]))
                self.forwarded_frames += 1
                self.forwarded_bytes += len(payload) - 32
            elif kind == F.PING:
                if not me.queue.full():
                    me.queue.put_nowait(F.pack(F.PONG, payload[:64]))
            else:
                raise F.FrameError(f"an endpoint sent a frame of type {kind}")

    @staticmethod
    async def _send_loop(me: _Endpoint) -> None:
        while True:
            frame = await me.queue.get()
            me.writer.write(frame)
            while not me.queue.empty() and me.writer.transport.get_write_buffer_size() < (1 << 20):
                me.writer.write(me.queue.get_nowait())
            await me.writer.drain()

    def connected(self) -> list[tuple[str, str, str]]:
        return sorted((e.cred.cluster, e.cred.role, e.cred.name) for e in self._endpoints.values())


class _Reflector(asyncio.DatagramProtocol):
    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        if data.startswith(F.REFLECT_ASK) and len(data) >= F.REFLECT_ASK_SIZE:
            token = data[len(F.REFLECT_ASK):len(F.REFLECT_ASK) + 16]
            self.transport.sendto(F.REFLECT_ANSWER + token + f"{addr[0]}:{addr[1]}".encode(), addr)

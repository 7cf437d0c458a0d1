"""An endpoint's connection to a relay, on TLS (relaytls.py): admitted with its credential
and a signed challenge bound to that TLS connection, then frames to and from other endpoints of its cluster by id."""

from __future__ import annotations

import asyncio
import json
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from . import frames as F
from .identity import Credential, sign_challenge
from .relaytls import HANDSHAKE_TIMEOUT_S, client_context, peer_fingerprint


PING_EVERY_S = 2.0   # a ping to the relay this often ...
DEAD_AFTER_S = 8.0   # ... and a connection that brought nothing back this long is dead (a laptop that moved)


class RelayRefused(Exception):
    """The relay did not admit this endpoint; the message is the relay's reason."""


class RelayConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, welcome: dict) -> None:
        self.reader, self.writer = reader, writer
        self.observed: str = welcome.get("observed", "")
        self.claims = welcome.get("claims") is True  # the relay understands CLAIM frames
        self.incoming: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue(4096)
        self.unreachable: asyncio.Queue[str] = asyncio.Queue(64)
        self.closed = asyncio.Event()
        self.where = ""  # "host:port"
        self._again: tuple | None = None  # what open() was given: reopen() uses it
        self._heard = time.monotonic()
        self._reader_task = asyncio.create_task(self._read())
        self._pinger = asyncio.create_task(self._ping())

    @classmethod
    async def open(cls, host: str, port: int, key: Ed25519PrivateKey, credential: Credential,
                   timeout_s: float = 10.0) -> "RelayConnection":
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=client_context(), ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S),
            timeout_s)
        try:
            kind, nonce = await asyncio.wait_for(F.read_frame(reader), timeout_s)
            if kind != F.CHALLENGE or len(nonce) != 32:
                raise F.FrameError(f"{host}:{port} does not speak the relay protocol (first frame type {kind})")
            hello = {"credential": credential.to_dict(), "proof": sign_challenge(key, nonce, peer_fingerprint(writer))}
            writer.write(F.pack(F.HELLO, json.dumps(hello).encode()))
            kind, payload = await asyncio.wait_for(F.read_frame(reader), timeout_s)
            if kind == F.REFUSED:
                raise RelayRefused(f"the relay {host}:{port} refused this endpoint: {payload.decode('utf-8', 'replace')}")
            if kind != F.WELCOME:
                raise F.FrameError(f"{host}:{port} answered the hello with a frame of type {kind}")
            relay = cls(reader, writer, json.loads(payload))
            relay.where, relay._again = f"{host}:{port}", (host, port, key, credential, timeout_s)
            return relay
        except BaseException:
            writer.close()
            raise

    async def reopen(self) -> "RelayConnection":
        """A new connection to the same relay with the same credential."""
        if self._again is None:
            raise RelayRefused("this relay connection was not made by RelayConnection.open")
        return await RelayConnection.open(*self._again)

    async def _ping(self) -> None:
        """A TCP connection whose path went away (the laptop moved) can stay silent for
        many minutes: the relay's answers to pings show it lives, their absence ends it."""
        while not self.closed.is_set():
            await asyncio.sleep(PING_EVERY_S)
            if time.monotonic() - self._heard > DEAD_AFTER_S:
                self.closed.set()
                self.writer.close()
                return
            self.send_frame(F.PING, b"")

    def claim(self, cids) -> None:
        """Frames for these QUIC connection ids come here (an endpoint that connected again)."""
        if self.claims:
            body = b"".join(bytes([len(c)]) + c for c in cids if 0 < len(c) < 21)
            if body:
                self.send_frame(F.CLAIM, body)

    async def check(self, within_s: float = 1.5) -> bool:
        """A ping now: False (and the connection closed) when nothing comes back within
        `within_s` (the network under it changed)."""
        if self.closed.is_set():
            return False
        asked = time.monotonic()
        self.send_frame(F.PING, b"")
        while time.monotonic() - asked < within_s:
            await asyncio.sleep(0.05)
            if self._heard > asked:
                return True
            if self.closed.is_set():
                return False
        self.abandon()
        return False

    def abandon(self) -> None:
        """Closed without a goodbye (its path is gone)."""
        self.closed.set()
        self.writer.close()

    async def _read(self) -> None:
        try:
            while True:
                kind, payload = await F.read_frame(self.reader)
                self._heard = time.monotonic()
                if kind == F.RECV and len(payload) >= 32:
                    await self.incoming.put((payload[:32].hex(), payload[32:]))
                elif kind == F.UNREACHABLE and not self.unreachable.full():
                    self.unreachable.put_nowait(payload[:32].hex())
        except (asyncio.IncompleteReadError, ConnectionError, F.FrameError):
            pass
        finally:
            self.closed.set()

    def send(self, dst: str, payload: bytes) -> None:
        self.send_frame(F.SEND, bytes.fromhex(dst) + payload)

    def send_frame(self, kind: int, payload: bytes) -> None:
        """Written unless the connection is gone (what was sent then is lost, as a datagram may be)."""
        if not self.closed.is_set() and not self.writer.is_closing():
            self.writer.write(F.pack(kind, payload))

    async def drain(self) -> None:
        await self.writer.drain()

    async def close(self) -> None:
        self.closed.set()
        self._pinger.cancel()
        self._reader_task.cancel()
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass

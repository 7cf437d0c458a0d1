"""An endpoint's connection to a relay, on TLS (relaytls.py): admitted with its credential
and a signed challenge bound to that TLS connection, then frames to and from other endpoints of its cluster by id."""

from __future__ import annotations

import asyncio
import json

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from . import frames as F
from .identity import Credential, sign_challenge
from .relaytls import HANDSHAKE_TIMEOUT_S, client_context, peer_fingerprint


class RelayRefused(Exception):
    """The relay did not admit this endpoint; the message is the relay's reason."""


class RelayConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, welcome: dict) -> None:
        self.reader, self.writer = reader, writer
        self.observed: str = welcome.get("observed", "")
        self.incoming: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue(4096)
        self.unreachable: asyncio.Queue[str] = asyncio.Queue(64)
        self.closed = asyncio.Event()
        self._reader_task = asyncio.create_task(self._read())

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
            return cls(reader, writer, json.loads(payload))
        except BaseException:
            writer.close()
            raise

    async def _read(self) -> None:
        try:
            while True:
                kind, payload = await F.read_frame(self.reader)
                if kind == F.RECV and len(payload) >= 32:
                    await self.incoming.put((payload[:32].hex(), payload[32:]))
                elif kind == F.UNREACHABLE and not self.unreachable.full():
                    self.unreachable.put_nowait(payload[:32].hex())
        except (asyncio.IncompleteReadError, ConnectionError, F.FrameError):
            pass
        finally:
            self.closed.set()

    def send(self, dst: str, payload: bytes) -> None:
        self.writer.write(F.pack(F.SEND, bytes.fromhex(dst) + payload))

    async def drain(self) -> None:
        await self.writer.drain()

    async def close(self) -> None:
        self._reader_task.cancel()
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass

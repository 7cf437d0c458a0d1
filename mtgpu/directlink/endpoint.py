"""An endpoint: its identity, its relay connection and its sessions (docs/DIRECTLINK.md).

Each relay frame between two endpoints carries one QUIC datagram after a byte that says
which side's connection it is for (so two endpoints may dial each other at once):
TO_RESPONDER for the session the sender dialled, TO_DIALER for the one it answers.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .relay_client import RelayConnection
from .session import Session, SessionError, Stream
from .tlsbind import TlsIdentity

log = logging.getLogger(__name__)
TO_RESPONDER, TO_DIALER = b"\x00", b"\x01"


class Endpoint:
    def __init__(self, key: Ed25519PrivateKey, relay: RelayConnection,
                 on_stream: Callable[[Session, Stream], Awaitable[None]] | None = None,
                 admit: Callable[[str], str | None] | None = None) -> None:
        self.tls = TlsIdentity(key)
        self.id = self.tls.id
        self.relay = relay
        self.on_stream, self.admit = on_stream, admit
        self.dialled: dict[str, Session] = {}
        self.answered: dict[str, Session] = {}
        self._pump = asyncio.ensure_future(self._receive())

    # ------------------------------------------------------------ sessions
    async def dial(self, peer_id: str, timeout_s: float = 15.0) -> Session:
        """A session with `peer_id`, set up and checked both ways (raises SessionError)."""
        s = self.dialled.get(peer_id)
        if s is None or s.closed.is_set():
            s = self.dialled[peer_id] = Session.dial(self.tls, peer_id, self._sender(peer_id, TO_RESPONDER))
        await s.wait_ready(timeout_s)
        return s

    def _sender(self, peer_id: str, tag: bytes) -> Callable[[bytes], None]:
        def send(datagram: bytes) -> None:
            self.relay.send(peer_id, tag + datagram)
        return send

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
                    if s is None or s.closed.is_set():
                        s = self.answered[src] = Session.answer(self.tls, src, datagram,
                                                                self._sender(src, TO_DIALER), self._stream_for(src),
                                                                self.admit)
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
        await self.relay.close()

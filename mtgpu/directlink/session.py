"""One QUIC connection between two endpoints over a virtual path (docs/DIRECTLINK.md).

The connection is sans-IO (qh3): datagrams in through `feed`, out through the `send`
function the endpoint gives, which puts each on the path that is up (the relay, or the
direct UDP path). The QUIC connection sees one constant peer address and never knows
which path carried a packet. On top: the identity checks (the dialer pins the
responder's certificate to the id it dials; the dialer proves its own id on the first
stream), then byte streams (`Stream`) opened by either side.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from typing import Awaitable, Callable

from qh3.quic import events as ev
from qh3.quic.configuration import QuicConfiguration
from qh3.quic.connection import QuicConnection

from .identity import CredentialError
from .tlsbind import TlsIdentity, bound_id, check_dialer

log = logging.getLogger(__name__)
ALPN = "mtgpu-directlink-1"
VIRTUAL_PEER = ("203.0.113.1", 1)  # what the QUIC connection believes its peer is (TEST-NET-3, never used)
SEND_BUFFER_LIMIT = 2 * 1024 * 1024
MAX_DATAGRAM = 1350  # relay frames and direct UDP alike; under the 1500-byte MTU with headers


class SessionError(Exception):
    """A session that could not be set up or was refused; the message says why."""


def configuration(tls: TlsIdentity, dialer: bool) -> QuicConfiguration:
    cfg = QuicConfiguration(is_client=dialer, alpn_protocols=[ALPN], idle_timeout=60.0,
                            max_datagram_size=MAX_DATAGRAM)
    if dialer:
        cfg.verify_mode = ssl.CERT_NONE  # the certificate is self-signed: it is pinned to the id instead
        cfg.verify_hostname = False
    else:
        cfg.load_cert_chain(tls.cert_pem, tls.key_pem)
    return cfg


class Stream:
    """A QUIC byte stream: read() until b"" (the peer ended it), write() then drain()."""

    def __init__(self, session: "Session", stream_id: int) -> None:
        self.session, self.id = session, stream_id
        self._chunks: asyncio.Queue[bytes] = asyncio.Queue()
        self._buffer = b""
        self._eof = False
        self.ended = False

    async def read(self, n: int = 65536) -> bytes:
        while not self._buffer and not self._eof:
            chunk = await self._chunks.get()
            if chunk == b"":
                self._eof = True
            self._buffer += chunk
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out

    async def readline(self) -> bytes:
        while b"\n" not in self._buffer and not self._eof:
            chunk = await self._chunks.get()
            if chunk == b"":
                self._eof = True
            self._buffer += chunk
        line, sep, rest = self._buffer.partition(b"\n")
        self._buffer = rest
        return line + sep

    def write(self, data: bytes, end: bool = False) -> None:
        if self.session.closed.is_set():
            raise SessionError(f"the session with {self.session.peer_id[:16]}... is closed: {self.session.why}")
        self.session.conn.send_stream_data(self.id, data, end_stream=end)
        self.ended = self.ended or end
        self.session.flush()

    async def drain(self) -> None:
        while (self.session.conn.get_send_buffer_size(self.id) > SEND_BUFFER_LIMIT
               and not self.session.closed.is_set()):
            await self.session.wrote.wait()
            self.session.wrote.clear()

    def end(self) -> None:
        if not self.ended:
            self.write(b"", end=True)

    def _data(self, data: bytes, end: bool) -> None:
        if data:
            self._chunks.put_nowait(data)
        if end:
            self._chunks.put_nowait(b"")


class Session:
    """See the module's docstring. `peer_id`: whom the dialer dials (checked), or who the
    responder's relay frames came from (the dialer's proof must name it)."""

    def __init__(self, tls: TlsIdentity, peer_id: str, dialer: bool, send: Callable[[bytes], None],
                 conn: QuicConnection, on_stream: Callable[["Stream"], Awaitable[None]] | None = None,
                 admit: Callable[[str, dict], str | None] | None = None, claims: dict | None = None) -> None:
        self.tls, self.peer_id, self.dialer, self.send, self.conn = tls, peer_id, dialer, send, conn
        self.claims = claims or {}  # the dialer's: what it says it is, beside its id (e.g. {"member": address})
        self.peer_claims: dict = {}  # the responder's: what the dialer said (checked by `admit`)
        self.on_stream, self.admit = on_stream, admit
        self.loop = asyncio.get_running_loop()
        self.streams: dict[int, Stream] = {}
        self.ready = asyncio.Event()   # identities checked both ways
        self.closed = asyncio.Event()
        self.wrote = asyncio.Event()   # datagrams went out (send buffers may have room)
        self.why = ""
        self._timer: asyncio.TimerHandle | None = None
        self._control: Stream | None = None
        self._tasks: set[asyncio.Task] = set()
        self.on_control: Callable[["Session", dict], None] | None = None
        self.path = "relay"  # or "direct": which path carries the datagrams now (set by the endpoint)
        self.original_dcid = b""  # the responder's: the destination id the dialer's first packet had
        self.on_cid: Callable[["Session", bytes, bool], None] | None = None  # (cid, issued): the endpoint routes by it
        self.cids: set[bytes] = {conn.host_cid}  # this side's connection ids (what the peer's packets name)

    # ------------------------------------------------------------ set-up
    @classmethod
    def dial(cls, tls: TlsIdentity, peer_id: str, send: Callable[[bytes], None],
             claims: dict | None = None) -> "Session":
        conn = QuicConnection(configuration=configuration(tls, dialer=True))
        s = cls(tls, peer_id, True, send, conn, claims=claims)
        conn.connect(VIRTUAL_PEER, now=s.loop.time())
        s.flush()
        return s

    @classmethod
    def answer(cls, tls: TlsIdentity, peer_id: str, first_datagram: bytes, send: Callable[[bytes], None],
               on_stream, admit) -> "Session":
        from qh3.quic.packet import Buffer, pull_quic_header
        header = pull_quic_header(Buffer(data=first_datagram), host_cid_length=8)
        conn = QuicConnection(configuration=configuration(tls, dialer=False),
                              original_destination_connection_id=header.destination_cid)
        s = cls(tls, peer_id, False, send, conn, on_stream, admit)
        s.original_dcid = header.destination_cid
        return s

    async def wait_ready(self, timeout_s: float = 15.0) -> None:
        done = asyncio.ensure_future(self.ready.wait())
        gone = asyncio.ensure_future(self.closed.wait())
        try:
            await asyncio.wait({done, gone}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            done.cancel()
            gone.cancel()
        if not self.ready.is_set():
            raise SessionError(self.why or f"no session with {self.peer_id[:16]}... within {timeout_s:g}s "
                                           "(the peer is not connected to the relay, or does not answer)")

    # ------------------------------------------------------------ datagrams
    def feed(self, datagram: bytes) -> None:
        self.conn.receive_datagram(datagram, VIRTUAL_PEER, now=self.loop.time())
        self._events()
        self.flush()

    def flush(self) -> None:
        for data, _addr in self.conn.datagrams_to_send(now=self.loop.time()):
            self.send(data)
        self.wrote.set()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        at = self.conn.get_timer()
        if at is not None and not self.closed.is_set():
            self._timer = self.loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.conn.handle_timer(now=self.loop.time())
        self._events()
        self.flush()

    # ------------------------------------------------------------ events
    def _events(self) -> None:
        while (e := self.conn.next_event()) is not None:
            if isinstance(e, ev.HandshakeCompleted) and self.dialer:
                self._dialer_handshake()
            elif isinstance(e, ev.StreamDataReceived):
                self._stream_data(e)
            elif isinstance(e, (ev.ConnectionIdIssued, ev.ConnectionIdRetired)):
                (self.cids.add if isinstance(e, ev.ConnectionIdIssued) else self.cids.discard)(e.connection_id)
                if self.on_cid is not None:
                    self.on_cid(self, e.connection_id, isinstance(e, ev.ConnectionIdIssued))
            elif isinstance(e, ev.ConnectionTerminated):
                self._closed(e.reason_phrase or f"closed (error {e.error_code})")

    def _dialer_handshake(self) -> None:
        try:
            cert = self.conn.get_peercert()
            der = cert.public_bytes() if cert is not None else b""
            ident = bound_id(der)
        except CredentialError as e:
            return self.close(f"refused {self.peer_id[:16]}...: {e}")
        if ident != self.peer_id:
            return self.close(f"the peer answered as {ident[:16]}..., not as {self.peer_id[:16]}... that was dialled")
        import hashlib
        sid = self.conn.get_next_available_stream_id()
        self._control = self.streams[sid] = Stream(self, sid)
        hello = {"id": self.tls.id, "proof": self.tls.dialer_proof(hashlib.sha256(der).digest()), "claims": self.claims}
        self._control.write(json.dumps(hello).encode() + b"\n")
        self._spawn(self._dialer_wait_ok())

    async def _dialer_wait_ok(self) -> None:
        line = await self._control.readline()
        if line.strip() == b"ok":
            self._ready()
        else:
            self.close(f"{self.peer_id[:16]}... refused this session: {line.decode('utf-8', 'replace').strip()}")

    def _stream_data(self, e: ev.StreamDataReceived) -> None:
        stream = self.streams.get(e.stream_id)
        if stream is None:
            stream = self.streams[e.stream_id] = Stream(self, e.stream_id)
            if not self.dialer and self._control is None:
                self._control = stream
                self._spawn(self._responder_hello())
            elif self.ready.is_set() and self.on_stream is not None:
                self._spawn(self.on_stream(stream))
            else:
                self.conn.reset_stream(e.stream_id, 1)
                return
        stream._data(e.data, e.end_stream)

    async def _responder_hello(self) -> None:
        line = await self._control.readline()
        try:
            hello = json.loads(line)
            ident, proof = str(hello["id"]), str(hello["proof"])
            claims = hello.get("claims") or {}
            if not isinstance(claims, dict):
                raise TypeError("claims")
        except (ValueError, KeyError, TypeError, AttributeError):
            return self.close("the dialer's hello cannot be read")
        why = check_dialer(ident, proof, self.tls.fingerprint)
        if why is None and ident != self.peer_id:
            why = f"the dialer proved {ident[:16]}... but its packets came from {self.peer_id[:16]}..."
        if why is None and self.admit is not None:
            why = self.admit(ident, claims)
        self.peer_claims = claims
        if why:
            self._control.write(f"refused: {why}\n".encode(), end=True)
            self._spawn(self._close_soon(why))
            return
        self._control.write(b"ok\n")
        self._ready()

    # ------------------------------------------------------------ control messages
    def _ready(self) -> None:
        self.ready.set()
        self._spawn(self._control_loop())

    async def _control_loop(self) -> None:
        """After the hellos, the first stream carries JSON lines between the two endpoints
        (the direct path's candidates and tokens): given to `on_control`."""
        while line := await self._control.readline():
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if self.on_control is not None and isinstance(message, dict):
                try:
                    self.on_control(self, message)
                except Exception:  # noqa: BLE001 - a bad message must not end the session
                    log.warning("directlink: a control message could not be handled", exc_info=True)

    def send_control(self, message: dict) -> None:
        if self._control is not None and not self.closed.is_set():
            self._control.write(json.dumps(message).encode() + b"\n")

    async def _close_soon(self, why: str) -> None:
        await asyncio.sleep(0.2)  # let the refusal reach the dialer first
        self.close(why)

    # ------------------------------------------------------------ streams and end
    def open_stream(self) -> Stream:
        if not self.ready.is_set():
            raise SessionError("the session is not set up yet")
        sid = self.conn.get_next_available_stream_id()
        s = self.streams[sid] = Stream(self, sid)
        return s

    def close(self, why: str = "closed") -> None:
        if not self.closed.is_set():
            self.conn.close(error_code=0, reason_phrase=why[:200])
            self.flush()
            self._closed(why)

    def _closed(self, why: str) -> None:
        if self.closed.is_set():
            return
        self.why = why
        self.closed.set()
        self.wrote.set()
        if self._timer is not None:
            self._timer.cancel()
        for s in self.streams.values():
            s._data(b"", True)
        log.info("directlink: session with %s... ended: %s", self.peer_id[:16], why)

    def _spawn(self, coro) -> None:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

"""What runs over a session: a stream asks for a service of the node by one JSON line
({"svc": "ssh"} or {"svc": "api"}), the node answers one line ({"ok": true} or {"ok":
false, "error": why}) and the stream then carries the bytes of a TCP connection to that
service on the node's loopback (its tenant sshd, its network API). The caller is
already known by its key (the session checked it); the service itself still
authenticates it as it would anyone (sshd by the tenant's key, the API by signatures),
so DirectLink adds a path, never a way around a check."""

from __future__ import annotations

import asyncio
import json
import logging

from .session import Session, Stream

log = logging.getLogger(__name__)
SERVICES = ("ssh", "api")
HEADER_MAX = 4096


class ServiceRefused(Exception):
    """The node did not open the service; the message is its reason."""


async def pipe(stream: Stream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy both ways until both directions ended (or either side failed). A side that
    went away (the TCP peer, the session: closed, or its network dropped) ends the other;
    every failure is retrieved here, none is left for asyncio to report."""

    async def up() -> None:  # stream -> TCP
        try:
            while data := await stream.read():
                writer.write(data)
                await writer.drain()
        finally:
            if writer.can_write_eof():
                try:
                    writer.write_eof()
                except (OSError, RuntimeError):
                    pass

    async def down() -> None:  # TCP -> stream
        try:
            while data := await reader.read(65536):
                stream.write(data)
                await stream.drain()
        finally:
            try:
                stream.end()
            except Exception:  # noqa: BLE001 - the session is closed already (QUIC says so its own way)
                pass

    tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            if not t.cancelled() and t.exception() is not None:
                log.debug("directlink: a piped stream ended: %s", t.exception() or type(t.exception()).__name__)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # retrieved: nothing reported later
        writer.close()
        stream.session.streams.pop(stream.id, None)


async def serve_stream(session: Session, stream: Stream, targets: dict[str, tuple[str, int]]) -> None:
    """The node's side: read the request line, connect to the service, pipe."""
    try:
        line = await asyncio.wait_for(stream.readline(), 15)
        request = json.loads(line[:HEADER_MAX]) if line.endswith(b"\n") else None
        svc = request.get("svc") if isinstance(request, dict) else None
    except (asyncio.TimeoutError, ValueError):
        svc = None
    if svc not in targets:
        why = (f"no service {svc!r} here (services: {', '.join(sorted(targets))})" if svc
               else "a stream must start with one JSON line naming its service")
        stream.write(json.dumps({"ok": False, "error": why}).encode() + b"\n", end=True)
        return
    host, port = targets[svc]
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
    except (OSError, asyncio.TimeoutError) as e:
        stream.write(json.dumps({"ok": False, "error": f"the node's {svc} service at {host}:{port} does not answer "
                                                      f"({e or type(e).__name__})"}).encode() + b"\n", end=True)
        return
    log.info("directlink: %s... opened %s", session.peer_id[:16], svc)
    stream.write(json.dumps({"ok": True, "path": session.path}).encode() + b"\n")
    await pipe(stream, reader, writer)


async def open_service(session: Session, svc: str, timeout_s: float = 15.0) -> Stream:
    """The client's side: a stream connected to the node's `svc` (raises ServiceRefused)."""
    stream = session.open_stream()
    stream.write(json.dumps({"svc": svc}).encode() + b"\n")
    try:
        line = await asyncio.wait_for(stream.readline(), timeout_s)
        answer = json.loads(line)
    except asyncio.TimeoutError:
        raise ServiceRefused(f"the node did not answer for {svc} within {timeout_s:g}s") from None
    except ValueError:
        raise ServiceRefused(f"the node answered {svc} with something that is not JSON") from None
    if not answer.get("ok"):
        raise ServiceRefused(str(answer.get("error") or "refused"))
    return stream

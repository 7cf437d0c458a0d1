"""The relay's wire format: over one TCP connection, frames of
[4-byte length, big-endian][1-byte type][payload]; ids travel as their 32 raw bytes."""

from __future__ import annotations

import asyncio
import struct

MAX_FRAME = 256 * 1024
CHALLENGE, HELLO, WELCOME, REFUSED = 0x01, 0x02, 0x03, 0x04
SEND, RECV, UNREACHABLE = 0x10, 0x11, 0x12
PING, PONG = 0x20, 0x21
CLAIM = 0x30  # an endpoint's QUIC connection ids (each: 1-byte length, id): frames naming one come to this connection
REFLECT_ASK, REFLECT_ANSWER = b"MTRL?", b"MTRL!"  # UDP, on the relay's port: "what address do you see?"
REFLECT_ASK_SIZE = 96  # an ask is padded to at least its answer's size: no amplification


class FrameError(Exception):
    """A peer that does not speak the relay's format."""


def pack(kind: int, payload: bytes = b"") -> bytes:
    if len(payload) + 1 > MAX_FRAME:
        raise FrameError(f"a frame of {len(payload) + 1} bytes, more than {MAX_FRAME}")
    return struct.pack(">IB", len(payload) + 1, kind) + payload


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readexactly(5)
    size, kind = struct.unpack(">IB", head)
    if not 1 <= size <= MAX_FRAME:
        raise FrameError(f"a frame of {size} bytes (at most {MAX_FRAME})")
    return kind, await reader.readexactly(size - 1)

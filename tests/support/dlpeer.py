"""A DirectLink endpoint as a process, for the NAT lab (run inside a namespace):

    python -m tests.support.dlpeer --relay H:P --secret-file F --cluster ID --key-file K serve
    python -m tests.support.dlpeer ... dial PEER_ID --bytes N --marker TEXT

It prints one JSON line per event: {"event": "up", "id": ...}, {"event": "path", "path":
"direct"|"relay", "after_ms": ...}, {"event": "echoed", "bytes": N, "ms": ...}; `dial` then
waits for commands on stdin: "send N" (an echo round trip of N bytes), "sink N" (N bytes
one way, counted by the peer), "quit".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mtgpu.directlink.endpoint import Endpoint
from mtgpu.directlink.identity import cluster_key, endpoint_id, issue
from mtgpu.directlink.relay_client import RelayConnection


def say(**event) -> None:
    print(json.dumps(event), flush=True)


async def echo(session, stream) -> None:
    """Echo the stream; one that starts with b"S" is a sink: counted, answered with the count."""
    first = await stream.read(1)
    if first == b"S":
        count = 0
        while data := await stream.read():
            count += len(data)
        stream.write(str(count).encode(), end=True)
        return
    data = first
    while data:
        stream.write(data)
        await stream.drain()
        data = await stream.read()
    stream.end()


async def one_way(session, size: int) -> float:
    """Seconds to send `size` bytes that the peer counted (its answer ends the clock)."""
    t0 = time.monotonic()
    stream = session.open_stream()
    block = os.urandom(65536)
    stream.write(b"S")
    sent = 0
    while sent < size:
        chunk = block[: size - sent]
        stream.write(chunk, end=sent + len(chunk) >= size)
        sent += len(chunk)
        await stream.drain()
    answer = await stream.read()
    assert int(answer) == size, (answer, size)
    return time.monotonic() - t0


async def round_trip(session, size: int, marker: bytes) -> float:
    t0 = time.monotonic()
    stream = session.open_stream()
    block = (marker + os.urandom(1000)) if marker else os.urandom(1000)
    payload = (block * (size // len(block) + 1))[:size]
    if payload[:1] == b"S":  # random bytes began one stream in 256 with the sink's mark: echoed as a count
        payload = b"E" + payload[1:]
    sent = 0

    async def reader() -> int:
        got = 0
        while data := await stream.read():
            got += len(data)
        return got
    task = asyncio.ensure_future(reader())
    while sent < size:
        chunk = payload[sent:sent + 65536]
        stream.write(chunk, end=sent + len(chunk) >= size)
        sent += len(chunk)
        await stream.drain()
    got = await task
    assert got == size, (got, size)
    return time.monotonic() - t0


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--relay", required=True)
    ap.add_argument("--secret-file", required=True)
    ap.add_argument("--cluster", default="lab")
    ap.add_argument("--key-file", required=True)
    ap.add_argument("--marker", default="")
    ap.add_argument("mode", choices=["serve", "dial"])
    ap.add_argument("peer", nargs="?")
    args = ap.parse_args()
    import logging
    logging.basicConfig(level=logging.DEBUG if os.environ.get("DLPEER_DEBUG") else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s: %(message)s")
    host, _, port = args.relay.rpartition(":")
    key = Ed25519PrivateKey.from_private_bytes(Path(args.key_file).read_bytes())
    ck = cluster_key(Path(args.secret_file).read_text().strip(), args.cluster)
    cred = issue(ck, args.cluster, endpoint_id(key), "member", args.mode, 600)
    t0 = time.monotonic()
    relay = await RelayConnection.open(host, int(port), key, cred)
    ep = Endpoint(key, relay, on_stream=echo)
    direct = await ep.enable_direct((host, int(port)))
    say(event="up", id=ep.id, public=ep.public, direct_possible=direct)
    if args.mode == "serve":
        await asyncio.Event().wait()
    t_dial = time.monotonic()
    session = await ep.dial(args.peer)
    say(event="session", after_ms=round((time.monotonic() - t0) * 1000, 1))
    first = session.open_stream()
    first.write(b"x", end=True)
    await first.read(1)
    say(event="first_byte", after_ms=round((time.monotonic() - t0) * 1000, 1), path=session.path,
        since_dial_ms=round((time.monotonic() - t_dial) * 1000, 1))
    last = session.path

    async def watch() -> None:
        nonlocal last
        while True:
            if session.path != last:
                last = session.path
                say(event="path", path=last, after_ms=round((time.monotonic() - t0) * 1000, 1),
                    since_dial_ms=round((time.monotonic() - t_dial) * 1000, 1))
            await asyncio.sleep(0.01)
    asyncio.ensure_future(watch())
    loop = asyncio.get_running_loop()
    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
        if not line or line == "quit":
            break
        if line.startswith("send "):
            size = int(line.split()[1])
            try:
                dt = await asyncio.wait_for(round_trip(session, size, args.marker.encode()), 120)
                say(event="echoed", bytes=size, ms=round(dt * 1000, 1), path=session.path,
                    mbit_s=round(size * 8 / dt / 1e6, 1))
            except Exception as e:  # noqa: BLE001 - said to the test
                say(event="error", what=f"{type(e).__name__}: {e}")
        elif line.startswith("sink "):
            size = int(line.split()[1])
            try:
                dt = await asyncio.wait_for(one_way(session, size), 120)
                say(event="sunk", bytes=size, ms=round(dt * 1000, 1), path=session.path,
                    mbit_s=round(size * 8 / dt / 1e6, 1))
            except Exception as e:  # noqa: BLE001 - said to the test
                say(event="error", what=f"{type(e).__name__}: {e}")
        elif line == "path":
            say(event="path_now", path=session.path)
    await ep.close()


if __name__ == "__main__":
    asyncio.run(main())

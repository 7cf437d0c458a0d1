"""The direct path on loopback (directlink/direct.py, endpoint.py): a session moves off the
relay onto UDP, carries data there, goes back to the relay when the direct path stops
answering, and lives through it. (The NAT cases run in network namespaces:
tests/integration/test_directlink_nat.py.)"""

from __future__ import annotations

import asyncio
import os
import time

from mtgpu.directlink import direct as D
from tests.unit.directlink.test_session import endpoint, echo, run


async def until(what: str, check, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def round_trip(session, size: int) -> None:
    stream = session.open_stream()
    payload = os.urandom(size)
    stream.write(payload, end=True)
    got = bytearray()
    while data := await stream.read():
        got += data
    assert bytes(got) == payload


def test_a_session_moves_to_the_direct_path_and_back_to_the_relay_without_ending():
    async def body(relay, port, seen):
        a = await endpoint(port, "a")
        b = await endpoint(port, "b", on_stream=echo)
        for e in (a, b):
            assert await e.enable_direct(("127.0.0.1", port), bind="127.0.0.1", local_candidates=False)
            assert e.public == f"127.0.0.1:{e.udp.local_port()}"
        session = await a.dial(b.id)
        await until("the direct path", lambda: session.path == "direct" and b.answered[a.id][0].path == "direct")
        relayed = relay.forwarded_bytes
        await round_trip(session, 2_000_000)
        assert relay.forwarded_bytes - relayed < 50_000  # the 2 MB went direct

        # b stops answering on UDP (its socket drops everything): back on the relay, same session
        b_receive = b.udp.on_datagram
        b.udp.on_datagram = lambda data, addr: None
        await until("the fall back to the relay", lambda: session.path == "relay", D.DOWN_AFTER_S + 5)
        relayed = relay.forwarded_bytes
        await round_trip(session, 300_000)
        assert relay.forwarded_bytes - relayed > 300_000
        assert not session.closed.is_set()

        # b answers again: the path comes back by itself
        b.udp.on_datagram = b_receive
        await until("the direct path again", lambda: session.path == "direct", D.RETRY_EVERY_S + 10)
        await round_trip(session, 100_000)
        await a.close()
        await b.close()

    run(body)


def test_a_probe_without_the_session_token_makes_no_path():
    async def body(relay, port, seen):
        a = await endpoint(port, "a")
        b = await endpoint(port, "b", on_stream=echo)
        await a.enable_direct(("127.0.0.1", port), bind="127.0.0.1", local_candidates=False)
        await b.enable_direct(("127.0.0.1", port), bind="127.0.0.1", local_candidates=False)
        b.candidates = []  # b offers nothing: only a forged ACK could make a path
        session = await a.dial(b.id)
        a.candidates = []
        import socket
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        for _ in range(20):
            s.sendto(D.ACK + os.urandom(16), ("127.0.0.1", a.udp.local_port()))
        await asyncio.sleep(0.5)
        assert session.path == "relay" and session.direct.addr is None
        s.close()
        await a.close()
        await b.close()

    run(body)

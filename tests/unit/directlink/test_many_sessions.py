"""Many sessions from one peer (issue 26): a laptop's terminals are processes of their own,
each with its own relay connection and session under the same key. None ends another,
a bound refuses one too many with the reason, and the relay going away leaves a direct
session working while new sessions wait for it to come back."""

from __future__ import annotations

import asyncio

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mtgpu.directlink import endpoint as E
from mtgpu.directlink.relay import Relay
from mtgpu.directlink.session import SessionError
from tests.unit.directlink.test_direct_path import until
from tests.unit.directlink.test_session import LAB, echo, endpoint, run


async def echoes(session, text: bytes, stream=None) -> bytes:
    stream = stream or session.open_stream()
    stream.write(text)
    got = b""
    while len(got) < len(text):
        got += await asyncio.wait_for(stream.read(), 20)
    return got


def test_terminals_of_one_key_each_keep_their_session():
    async def body(relay, port, seen):
        node = await endpoint(port, "node", on_stream=echo)
        key = Ed25519PrivateKey.generate()
        first = await endpoint(port, "laptop", key=key)
        s1 = await first.dial(node.id)
        open1 = s1.open_stream()
        assert await echoes(s1, b"one\n", open1) == b"one\n"
        terminals = [await endpoint(port, "laptop", key=key) for _ in range(3)]
        for i, t in enumerate(terminals):
            s = await t.dial(node.id)
            assert await echoes(s, b"t%d\n" % i) == b"t%d\n" % i
        assert await echoes(s1, b"still\n", open1) == b"still\n"  # the first stream lives on
        assert not s1.closed.is_set() and len(node.answered[first.id]) == 4
        for t in [first, *terminals]:
            await t.close()
        await node.close()

    run(body)


def test_one_session_too_many_is_refused_with_the_bound():
    async def body(relay, port, seen):
        node = await endpoint(port, "node", on_stream=echo)
        key = Ed25519PrivateKey.generate()
        old, E.MAX_SESSIONS_PER_PEER = E.MAX_SESSIONS_PER_PEER, 2
        try:
            held = [await endpoint(port, "laptop", key=key) for _ in range(3)]
            await held[0].dial(node.id)
            await held[1].dial(node.id)
            try:
                await held[2].dial(node.id, timeout_s=10)
                raise AssertionError("a third session was admitted")
            except SessionError as e:
                assert "sessions open with this node" in str(e) and "MAX_SESSIONS_PER_PEER = 2" in str(e), e
        finally:
            E.MAX_SESSIONS_PER_PEER = old
        for t in held:
            await t.close()
        await node.close()

    run(body)


def test_another_peers_dials_up_to_its_bound_and_past_it_end_no_session_of_the_first():
    """A redial is no way for anyone to end another's session: a second key dials the node
    again and again, past its own bound; the first peer's open stream carries on."""
    async def body(relay, port, seen):
        node = await endpoint(port, "node", on_stream=echo)
        first = await endpoint(port, "laptop", key=Ed25519PrivateKey.generate())
        s1 = await first.dial(node.id)
        open1 = s1.open_stream()
        assert await echoes(s1, b"mine\n", open1) == b"mine\n"
        other_key = Ed25519PrivateKey.generate()
        old, E.MAX_SESSIONS_PER_PEER = E.MAX_SESSIONS_PER_PEER, 2
        others = [await endpoint(port, "laptop", key=other_key) for _ in range(4)]
        try:
            refused = 0
            for o in others:
                try:
                    await o.dial(node.id, timeout_s=10)
                except SessionError as e:
                    assert "MAX_SESSIONS_PER_PEER = 2" in str(e), e
                    refused += 1
            assert refused == 2  # its own bound, counted apart from the first peer's
        finally:
            E.MAX_SESSIONS_PER_PEER = old
        assert others[0].id != first.id
        assert await echoes(s1, b"still mine\n", open1) == b"still mine\n"
        assert not s1.closed.is_set() and len(node.answered[first.id]) == 1
        for t in [first, *others]:
            await t.close()
        await node.close()

    run(body)


def test_a_direct_session_outlives_its_relay_and_new_sessions_wait_for_it():
    async def main():
        relay = Relay({"lab": LAB.public_key()})
        server, udp = await relay.serve("127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        a = await endpoint(port, "a")
        b = await endpoint(port, "b", on_stream=echo)
        for e in (a, b):
            assert await e.enable_direct(("127.0.0.1", port), bind="127.0.0.1", local_candidates=False)
        session = await a.dial(b.id)
        await until("the direct path", lambda: session.path == "direct")
        stream = session.open_stream()
        assert await echoes(session, b"before\n", stream) == b"before\n"
        server.close()
        for group in list(relay._endpoints.values()):  # the relay process dies: its connections with it
            for c in group:
                c.writer.transport.abort()
        udp.close()
        await until("both ends see the relay gone", lambda: a.relay.closed.is_set() and b.relay.closed.is_set())
        assert await echoes(session, b"after\n", stream) == b"after\n"
        assert not session.closed.is_set()
        # a relay again on the same port: both connect again by themselves; a new session works
        relay2 = Relay({"lab": LAB.public_key()})
        server2, udp2 = await relay2.serve("127.0.0.1", port)
        await until("both connected again", lambda: not a.relay.closed.is_set() and not b.relay.closed.is_set(), 30)
        c = await endpoint(port, "c")
        s2 = await c.dial(b.id)
        assert await echoes(s2, b"new\n") == b"new\n"
        assert await echoes(session, b"old\n", stream) == b"old\n"
        for e in (a, b, c):
            await e.close()
        server2.close()
        udp2.close()

    asyncio.run(asyncio.wait_for(main(), 90))

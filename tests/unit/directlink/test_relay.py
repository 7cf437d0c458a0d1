"""The relay on loopback (directlink/relay.py): who gets in, and frames forwarded by id
within one cluster only."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mtgpu.directlink import frames as F
from mtgpu.directlink.identity import cluster_key, endpoint_id, issue
from mtgpu.directlink.relay import Relay
from mtgpu.directlink.relay_client import RelayConnection, RelayRefused
from mtgpu.directlink.relaytls import RelayTls, client_context

LAB, OTHER = cluster_key("s" * 48, "lab"), cluster_key("o" * 48, "other")


def endpoint(ck, cluster: str, name: str, role: str = "member", valid_s: float = 60):
    key = Ed25519PrivateKey.generate()
    return key, issue(ck, cluster, endpoint_id(key), role, name, valid_s)


async def with_relay(body):
    relay = Relay({"lab": LAB.public_key(), "other": OTHER.public_key()})
    server, udp = await relay.serve("127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        await asyncio.wait_for(body(relay, port), 30)
    finally:
        server.close()
        udp.close()


def test_two_endpoints_of_a_cluster_exchange_frames_and_another_cluster_cannot_reach_them():
    async def body(relay, port):
        (ka, ca), (kb, cb), (kc, cc) = endpoint(LAB, "lab", "a"), endpoint(LAB, "lab", "b", "tenant"), \
            endpoint(OTHER, "other", "c")
        a = await RelayConnection.open("127.0.0.1", port, ka, ca)
        b = await RelayConnection.open("127.0.0.1", port, kb, cb)
        c = await RelayConnection.open("127.0.0.1", port, kc, cc)
        assert a.observed.startswith("127.0.0.1:")
        big = os.urandom(200_000)
        a.send(cb.id, b"hello")
        a.send(cb.id, big)
        assert await b.incoming.get() == (ca.id, b"hello")
        assert await b.incoming.get() == (ca.id, big)
        c.send(cb.id, b"from another cluster")  # the same id, but not in c's cluster: unreachable
        assert await c.unreachable.get() == cb.id
        assert b.incoming.empty()
        assert relay.connected() == [("lab", "member", "a"), ("lab", "tenant", "b"), ("other", "member", "c")]
        for x in (a, b, c):
            await x.close()

    asyncio.run(with_relay(body))


@pytest.mark.parametrize("what, make, says", [
    ("unknown cluster", lambda: endpoint(cluster_key("z" * 48, "zeta"), "zeta", "z"), "does not serve the cluster"),
    ("forged", lambda: endpoint(cluster_key("x" * 48, "lab"), "lab", "f"), "not signed by the cluster 'lab'"),
    ("expired", lambda: endpoint(LAB, "lab", "e", valid_s=-5), "expired"),
    ("someone else's credential", lambda: (Ed25519PrivateKey.generate(), endpoint(LAB, "lab", "v")[1]),
     "did not prove"),
])
def test_an_endpoint_without_valid_credentials_is_refused_with_the_reason(what, make, says):
    async def body(relay, port):
        key, cred = make()
        with pytest.raises(RelayRefused, match=says):
            await RelayConnection.open("127.0.0.1", port, key, cred)
        assert relay.connected() == [] and says in relay.refusals[-1]

    asyncio.run(with_relay(body))


def test_a_peer_that_does_not_say_hello_is_dropped_and_the_relay_goes_on():
    async def body(relay, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context())
        kind, _ = await F.read_frame(reader)
        assert kind == F.CHALLENGE
        writer.write(F.pack(F.SEND, b"x" * 40))
        kind, why = await F.read_frame(reader)
        assert kind == F.REFUSED and b"first frame must be a hello" in why
        writer.close()
        key, cred = endpoint(LAB, "lab", "after")
        ok = await RelayConnection.open("127.0.0.1", port, key, cred)
        await ok.close()

    asyncio.run(with_relay(body))


def test_the_relay_tells_an_endpoint_its_address_over_udp_without_amplifying():
    async def body(relay, port):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        loop = asyncio.get_running_loop()
        token = os.urandom(16)
        ask = F.REFLECT_ASK + token
        s.sendto(ask, ("127.0.0.1", port))  # too short: no answer
        s.sendto(ask.ljust(F.REFLECT_ASK_SIZE, b"\0"), ("127.0.0.1", port))
        answer = await asyncio.wait_for(loop.sock_recv(s, 512), 5)
        assert answer == F.REFLECT_ANSWER + token + f"127.0.0.1:{s.getsockname()[1]}".encode()
        assert len(answer) <= F.REFLECT_ASK_SIZE
        s.close()

    asyncio.run(with_relay(body))


def test_the_relay_speaks_only_tls_and_a_plain_connection_gets_nothing():
    async def body(relay, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(F.pack(F.HELLO, b"{}"))  # not a TLS ClientHello
        got = await asyncio.wait_for(reader.read(), 10)
        assert got[4:5] != bytes([F.CHALLENGE]), got  # a TLS alert or nothing, never a challenge in the clear
        writer.close()
        key, cred = endpoint(LAB, "lab", "after")
        ok = await RelayConnection.open("127.0.0.1", port, key, cred)  # the relay goes on
        await ok.close()

    asyncio.run(with_relay(body))


def test_a_machine_in_the_middle_that_terminates_tls_cannot_log_in_as_the_endpoint():
    """It shows the endpoint its own certificate and passes every byte on to the real
    relay: the endpoint's proof names the certificate it saw, so the relay refuses it."""
    async def body(relay, port):
        mitm_tls = RelayTls()

        async def middle(reader, writer):
            r2, w2 = await asyncio.open_connection("127.0.0.1", port, ssl=client_context())

            async def copy(src, dst):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
                dst.close()
            await asyncio.gather(copy(reader, w2), copy(r2, writer), return_exceptions=True)

        server = await asyncio.start_server(middle, "127.0.0.1", 0, ssl=mitm_tls.context)
        try:
            key, cred = endpoint(LAB, "lab", "victim")
            with pytest.raises(RelayRefused, match="machine in the middle"):
                await RelayConnection.open("127.0.0.1", server.sockets[0].getsockname()[1], key, cred)
            assert relay.connected() == []
        finally:
            server.close()

    asyncio.run(with_relay(body))

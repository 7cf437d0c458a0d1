"""Sessions through the relay on loopback (directlink/session.py, endpoint.py): end to end
encrypted (the relay never sees the bytes), pinned to the dialled id, and refused by a
responder that does not admit the dialer."""

from __future__ import annotations

import asyncio
import os

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mtgpu.directlink.endpoint import Endpoint
from mtgpu.directlink.identity import cluster_key, endpoint_id, issue
from mtgpu.directlink.relay import Relay
from mtgpu.directlink.relay_client import RelayConnection
from mtgpu.directlink.session import SessionError

LAB = cluster_key("s" * 48, "lab")
MARKER = b"MARKER-7f3a9c-this-must-never-be-seen-by-the-relay"


async def echo(session, stream) -> None:
    while data := await stream.read():
        stream.write(data)
        await stream.drain()
    stream.end()


async def endpoint(port: int, name: str, key=None, **kw) -> Endpoint:
    key = key or Ed25519PrivateKey.generate()
    cred = issue(LAB, "lab", endpoint_id(key), "member", name, 60)
    return Endpoint(key, await RelayConnection.open("127.0.0.1", port, key, cred), **kw)


def run(body) -> None:
    async def main():
        relay = Relay({"lab": LAB.public_key()})
        seen = bytearray()
        relay.tap = seen.extend
        server, udp = await relay.serve("127.0.0.1", 0)
        try:
            await asyncio.wait_for(body(relay, server.sockets[0].getsockname()[1], seen), 60)
        finally:
            server.close()
            udp.close()
    asyncio.run(main())


def test_a_stream_through_the_relay_is_end_to_end_encrypted_and_carries_bytes_whole():
    async def body(relay, port, seen):
        a = await endpoint(port, "a")
        b = await endpoint(port, "b", on_stream=echo)
        session = await a.dial(b.id)
        stream = session.open_stream()
        payload = (MARKER + os.urandom(4000)) * 300  # about 1.2 MB
        stream.write(payload, end=True)
        got = bytearray()
        while data := await stream.read():
            got += data
        assert bytes(got) == payload
        assert relay.forwarded_bytes > len(payload)  # it all went through the relay ...
        assert MARKER not in seen and MARKER[:16] not in seen  # ... and the relay saw none of it
        await a.close()
        await b.close()

    run(body)


def test_the_dialer_refuses_a_peer_that_is_not_the_id_it_dialled():
    async def body(relay, port, seen):
        a = await endpoint(port, "a")
        b = await endpoint(port, "b", on_stream=echo)
        impostor_key = Ed25519PrivateKey.generate()
        # b's relay connection and id, but a TLS certificate bound to another key
        from mtgpu.directlink.tlsbind import TlsIdentity
        b.tls = TlsIdentity(impostor_key)
        with pytest.raises(SessionError, match="answered as"):
            await a.dial(b.id, timeout_s=10)
        await a.close()
        await b.close()

    run(body)


def test_a_responder_that_does_not_admit_the_dialer_refuses_it_with_the_reason():
    async def body(relay, port, seen):
        a = await endpoint(port, "a")
        said = []
        b = await endpoint(port, "b", on_stream=echo,
                           admit=lambda ident, claims: said.append(claims) or f"{ident[:8]} is not a tenant here")
        a.claims = {"member": "10.0.0.1:7070"}
        with pytest.raises(SessionError, match="is not a tenant here"):
            await a.dial(b.id, timeout_s=10)
        assert said == [{"member": "10.0.0.1:7070"}]  # the dialer's claims reach the responder's check
        await a.close()
        await b.close()

    run(body)


def test_dialling_an_endpoint_that_is_not_connected_fails_in_bounded_time():
    async def body(relay, port, seen):
        a = await endpoint(port, "a")
        with pytest.raises(SessionError, match="within 2s"):
            await a.dial(endpoint_id(Ed25519PrivateKey.generate()), timeout_s=2)
        await a.close()

    run(body)


def test_every_fresh_identity_gives_a_responder_configuration_qh3_loads():
    """qh3 failed to read about one certificate in four when the key was appended to it in
    one PEM; they are given apart."""
    from mtgpu.directlink.session import configuration
    from mtgpu.directlink.tlsbind import TlsIdentity, bound_id
    for _ in range(60):
        key = Ed25519PrivateKey.generate()
        tls = TlsIdentity(key)
        assert configuration(tls, dialer=False).certificate is not None
        assert bound_id(tls.cert_der) == endpoint_id(key)

"""A new session while the relay is down (client/directlink.py connect(), issue 26): it
waits for the relay to come back, saying so once, instead of failing at once; after the
bound it gives up with an error that names the relay and the fix. A real relay on
loopback, started late on the port the client was given."""

from __future__ import annotations

import asyncio
import socket

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mtgpu.client import directlink as C
from mtgpu.client.errors import ClientError
from mtgpu.directlink import direct as D
from mtgpu.directlink.identity import endpoint_id, issue
from mtgpu.directlink.relay import Relay
from tests.unit.directlink.test_direct_path import round_trip
from tests.unit.directlink.test_session import LAB, echo, endpoint

WAITING = "is not answering; waiting for it"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def laptop(port: int, node_id: str) -> tuple[dict, Ed25519PrivateKey]:
    """A tenant's DirectLink details (as servers.json keeps them) for the relay at `port`."""
    key = Ed25519PrivateKey.generate()
    cred = issue(LAB, "lab", endpoint_id(key), "tenant", "alice", 60)
    return {"enabled": True, "cluster_id": "lab", "relays": [f"127.0.0.1:{port}"], "credential": cred.to_dict(),
            "nodes": [{"name": "gpu-b", "id": node_id, "ssh_host_key": ""}]}, key


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """The client's UDP socket offers no address of this host's but loopback."""
    monkeypatch.setattr(D, "local_addresses", lambda: [])


def test_a_new_session_while_the_relay_is_down_waits_for_it_and_says_so_once():
    async def main():
        port = free_port()
        member_key = Ed25519PrivateKey.generate()
        info, key = laptop(port, endpoint_id(member_key))
        said: list[str] = []
        dialling = asyncio.ensure_future(C.connect(info, None, "gpu-b", said.append, key=key))
        for _ in range(600):  # the client found no relay and said it waits
            if said or dialling.done():
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(2.5)  # a few of its tries meet nothing
        assert not dialling.done(), dialling.exception() if dialling.done() else None
        relay = Relay({"lab": LAB.public_key()})
        server, udp = await relay.serve("127.0.0.1", port)  # the relay is back, on the same port
        member = await endpoint(port, "gpu-b", key=member_key, on_stream=echo)
        try:
            ep, session = await asyncio.wait_for(dialling, 60)
            await round_trip(session, 50_000)
            waits = [s for s in said if WAITING in s]
            assert len(waits) == 1 and f"the relay 127.0.0.1:{port} " in waits[0], said
            assert f"(up to {C.RELAY_WAIT_S:g} s)" in waits[0], said
            assert said[-1] == f"remotegpu: gpu-b through the relay 127.0.0.1:{port}", said
            await C.close_endpoint(ep)
        finally:
            await member.close()
            server.close()
            udp.close()
    asyncio.run(main())


def test_a_relay_that_does_not_come_back_within_the_bound_is_an_error_naming_it_and_the_fix(monkeypatch):
    monkeypatch.setattr(C, "RELAY_WAIT_S", 3.0)

    async def main():
        port = free_port()
        info, key = laptop(port, endpoint_id(Ed25519PrivateKey.generate()))
        said: list[str] = []
        with pytest.raises(ClientError) as e:
            await asyncio.wait_for(C.connect(info, None, "gpu-b", said.append, key=key), 60)
        return port, said, str(e.value)
    port, said, error = asyncio.run(main())
    assert len(said) == 1 and WAITING in said[0] and "(up to 3 s)" in said[0], said
    assert f"no relay answered within 3 s (127.0.0.1:{port}: " in error, error
    assert "ask the admin of 'lab' to start it (mtgpu-relay)" in error, error


def test_a_command_that_must_not_wait_fails_at_once_when_the_relay_is_down():
    """The API tunnel (the live view refreshes through it) asks for no wait."""
    async def main():
        port = free_port()
        info, key = laptop(port, endpoint_id(Ed25519PrivateKey.generate()))
        said: list[str] = []
        with pytest.raises(ClientError, match=f"cannot reach gpu-b through DirectLink: 127.0.0.1:{port}: "):
            await asyncio.wait_for(C.connect(info, None, "gpu-b", said.append, key=key, wait_s=0), 30)
        assert said == []
    asyncio.run(main())

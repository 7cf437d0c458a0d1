"""The path an API command shows is the one its session uses now (issue 26 point 5):
`Tunnel.label` and the client's `path` (what `servers --live` and the terminal app show)
are read from the session each time, following it relay -> direct -> relay; the command
says the path once at the start, and once more at the end when it changed meanwhile
(cli/remotegpu.py `_client`). A real relay and member endpoint on loopback, in a thread
of their own; the laptop's side is the CLI's own client and tunnel."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mtgpu.cli.remotegpu import _client
from mtgpu.directlink import direct as D
from mtgpu.directlink.identity import endpoint_id, issue
from mtgpu.directlink.relay import Relay
from tests.unit.directlink.test_session import LAB, echo, endpoint


class Member:
    """A relay and a member endpoint (direct path enabled) on loopback, served by a loop in
    a thread of its own, as a real member's would be apart from the laptop's."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-member", daemon=True)
        self.thread.start()
        self.key = Ed25519PrivateKey.generate()
        self.port, self.b, self._server, self._udp = self.call(self._start())
        self._hear = self.b.udp.on_datagram

    def call(self, coro, timeout_s: float = 60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    async def _start(self):
        server, udp = await Relay({"lab": LAB.public_key()}).serve("127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        b = await endpoint(port, "gpu-b", key=self.key, on_stream=echo)
        assert await b.enable_direct(("127.0.0.1", port), bind="127.0.0.1", local_candidates=False)
        return port, b, server, udp

    def deaf(self, deaf: bool) -> None:
        """The member's UDP socket drops all it receives (a site that dropped UDP), or hears again."""
        def set_it():
            self.b.udp.on_datagram = (lambda data, addr: None) if deaf else self._hear
        self.loop.call_soon_threadsafe(set_it)

    def close(self) -> None:
        async def stop():
            await self.b.close()
            self._server.close()
            self._udp.close()
        try:
            self.call(stop(), 20)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(20)


@pytest.fixture
def member(monkeypatch):
    monkeypatch.setattr(D, "local_addresses", lambda: [])  # the laptop's UDP offers loopback only
    m = Member()
    try:
        yield m
    finally:
        m.close()


def laptop_entry(tmp_path: Path, member: Member) -> dict:
    """servers.json's entry for a server that does not answer directly (a closed loopback
    port) whose node is reachable through the relay."""
    key = Ed25519PrivateKey.generate()
    key_path = tmp_path / "id_ed25519"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                           serialization.NoEncryption()))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    cred = issue(LAB, "lab", endpoint_id(key), "tenant", "alice", 60)
    info = {"enabled": True, "cluster_id": "lab", "relays": [f"127.0.0.1:{member.port}"],
            "credential": cred.to_dict(), "nodes": [{"name": "gpu-b", "id": member.b.id, "ssh_host_key": ""}]}
    return {"server": closed, "tenant": "alice", "key": str(key_path), "node": "gpu-b", "cluster_id": "lab",
            "directlink": info}


def until(what: str, check, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < end, f"timed out after {timeout_s:g}s waiting for {what}"
        time.sleep(0.05)


def test_the_shown_path_follows_the_session_relay_direct_relay_and_the_end_says_a_change(member, tmp_path, capsys):
    member.deaf(True)  # no direct path yet: the command starts relayed
    entry = laptop_entry(tmp_path, member)
    client = _client(entry)
    tunnel = client.tunnel
    try:
        first = capsys.readouterr().err
        assert first.splitlines() == [f"remotegpu: {entry['server']} does not answer directly; through "
                                      "DirectLink to gpu-b (relayed)"], first
        assert tunnel.path == "relay" and tunnel.label == client.path == "relayed"

        member.deaf(False)  # the direct path comes up (tried again every RETRY_EVERY_S)
        until("the direct path", lambda: tunnel.path == "direct", D.RETRY_EVERY_S + D.PUNCH_FOR_S + 30)
        assert tunnel.label == client.path == "p2p"

        member.deaf(True)  # and goes: back on the relay, the same session
        session = tunnel.session
        until("the fall back to the relay", lambda: tunnel.path == "relay", D.DOWN_AFTER_S + 30)
        assert tunnel.session is session and tunnel.label == client.path == "relayed"

        member.deaf(False)
        until("the direct path again", lambda: tunnel.path == "direct", D.RETRY_EVERY_S + D.PUNCH_FOR_S + 30)
        assert tunnel.label == client.path == "p2p"
        assert capsys.readouterr().err == ""  # said at the start and at the end, not in between
    finally:
        client.close()
    said = capsys.readouterr().err
    assert said == "remotegpu: the DirectLink path to gpu-b is now p2p\n", said


def test_a_path_that_did_not_change_is_said_once(member, tmp_path, capsys):
    member.deaf(True)
    client = _client(laptop_entry(tmp_path, member))
    try:
        assert client.path == "relayed"
    finally:
        client.close()
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and said[0].endswith("through DirectLink to gpu-b (relayed)"), said


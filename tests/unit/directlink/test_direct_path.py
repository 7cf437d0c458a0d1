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


async def carried_direct_then_closed(relay, session, a, b) -> None:
    """300 KB through `session` with next to nothing on the relay, then both endpoints closed."""
    relayed = relay.forwarded_bytes
    await round_trip(session, 300_000)
    assert relay.forwarded_bytes - relayed < 50_000
    await a.close()
    await b.close()


async def direct_session(port: int):
    """(a, b, a's session with b) on loopback, once both sides are on the direct path."""
    a = await endpoint(port, "a")
    b = await endpoint(port, "b", on_stream=echo)
    for e in (a, b):
        assert await e.enable_direct(("127.0.0.1", port), bind="127.0.0.1", local_candidates=False)
        assert e.public == f"127.0.0.1:{e.udp.local_port()}"
    session = await a.dial(b.id)
    await until("the direct path", lambda: session.path == "direct" and b.answered[a.id][0].path == "direct")
    return a, b, session


def test_a_session_moves_to_the_direct_path_and_back_to_the_relay_without_ending():
    async def body(relay, port, seen):
        a, b, session = await direct_session(port)
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


def test_a_peer_whose_data_comes_from_another_of_its_addresses_is_heard():
    """A host with several addresses (eth0, a podman bridge, loopback) answers the probes to
    each from that address, and each side keeps the address its own probes were answered
    from: the two may differ, and one side's data then comes from an address the other does
    not send to. Simulated on loopback: every data datagram b sends reaches a as from
    another address of b's, while probes and answers keep theirs. Before, a dropped them
    all while the probes kept the path "up": a session that never answered again."""
    from mtgpu.directlink.endpoint import TO_DIALER

    async def body(relay, port, seen):
        a, b, session = await direct_session(port)
        receive = a.udp.on_datagram
        other = ("192.0.2.77", b.udp.local_port())  # an address of b's that a's path is not at

        def from_elsewhere(data, addr):
            receive(data, other if data[:1] == TO_DIALER else addr)
        a.udp.on_datagram = from_elsewhere
        relayed = relay.forwarded_bytes
        await asyncio.wait_for(round_trip(session, 300_000), 20)
        assert session.path == "direct" and relay.forwarded_bytes - relayed < 50_000  # it went direct, both ways
        assert session.direct.addr == ("127.0.0.1", b.udp.local_port())  # the path stays where it was made
        await a.close()
        await b.close()

    run(body)


def test_the_first_answer_makes_the_path_and_another_address_takes_over_only_once_it_is_silent():
    async def body(relay, port, seen):
        a, b, session = await direct_session(port)
        st = session.direct
        made = st.addr
        token = st.my_token
        # the path in use was just heard from (a loaded run's event loop can leave it silent
        # longer than SUSPECT_AFTER_S by itself, and then the answer rightly moves it)
        st.heard = time.monotonic()
        a.udp.on_datagram(D.ACK + token, ("192.0.2.77", 4242))  # an answer from another address
        assert st.addr == made
        st.heard = time.monotonic() - 10  # the path in use went silent: the next answer moves it
        a.udp.on_datagram(D.ACK + token, ("192.0.2.77", 4242))
        assert st.addr == ("192.0.2.77", 4242)
        await a.close()
        await b.close()

    run(body)


def behind_a_nat_filter(e) -> None:
    """`e`'s UDP socket behind a simulated NAT's filter: a datagram comes in only from an
    address `e` has sent one to (as Linux conntrack lets replies in, and nothing else)."""
    udp, sent = e.udp, set()
    send, receive = udp.sendto, udp.on_datagram

    def sendto(data, addr, ttl=None):
        sent.add(tuple(addr))
        send(data, addr, ttl)

    def on_datagram(data, addr):
        if tuple(addr) in sent:
            receive(data, addr)
    udp.sendto, udp.on_datagram = sendto, on_datagram


def test_an_endpoint_the_relay_did_not_tell_its_public_address_asks_again_and_goes_direct(monkeypatch):
    """CI: the relay's UDP answer to a member that started beside it was lost; the member
    offered no address, so no laptop behind a NAT ever reached it directly, in any session
    (test_directlink_sessions waited 60 s for the direct path, twice). Now it asks again
    every PUBLIC_RETRY_S, offers the address once told and punches too. Both sides here
    are behind a NAT's filter: without b's address neither side's probes get in."""
    async def body(relay, port, seen):
        a = await endpoint(port, "a")
        b = await endpoint(port, "b", on_stream=echo)
        assert await a.enable_direct(("127.0.0.1", port), bind="127.0.0.1", local_candidates=False)
        ask, lost = D.UdpSocket.public_address, []

        async def lost_once(self, relay_udp, timeout_s=2.0):
            if not lost:
                lost.append(relay_udp)
                return None  # the relay's answer did not come
            return await ask(self, relay_udp, timeout_s)
        monkeypatch.setattr(D.UdpSocket, "public_address", lost_once)
        assert not await b.enable_direct(("127.0.0.1", port), bind="127.0.0.1", local_candidates=False)
        assert b.public is None and b.candidates == []
        for e in (a, b):
            behind_a_nat_filter(e)
        session = await a.dial(b.id)
        await round_trip(session, 10_000)  # on the relay meanwhile
        assert session.path == "relay"
        await until("b's address asked again and the direct path", lambda: session.path == "direct" and
                    b.answered[a.id][0].path == "direct", D.PUBLIC_RETRY_S + D.PUNCH_FOR_S + 10)
        assert b.public == f"127.0.0.1:{b.udp.local_port()}" and len(lost) == 1
        await carried_direct_then_closed(relay, session, a, b)

    run(body)


def behind_a_linux_nat(e, late: list) -> None:
    """`e`'s UDP socket behind a model of a Linux MASQUERADE router, with its hazard: a
    datagram from an address `e` has not sent to yet leaves an unreplied conntrack entry,
    and `e`'s own datagrams to that address then leave from another port, which the
    sender's NAT drops: the pair never hears each other again (the entry lives while
    the other side keeps probing). A low-TTL opener opens `e`'s mapping and dies before
    the other side's router. `late` collects the addresses that came in first."""
    udp, sent, poisoned = e.udp, set(), set()
    send, receive = udp.sendto, udp.on_datagram

    def sendto(data, addr, ttl=None):
        addr = tuple(addr)
        if addr in poisoned:
            return  # out from another port: the other side's NAT drops it
        sent.add(addr)
        if ttl is None:
            send(data, addr, ttl)

    def on_datagram(data, addr):
        addr = tuple(addr)
        if addr not in sent and addr not in poisoned:
            poisoned.add(addr)
            late.append(addr)
        if addr not in poisoned:
            receive(data, addr)
    udp.sendto, udp.on_datagram = sendto, on_datagram


def test_no_full_probe_reaches_a_slow_peer_before_its_openers_so_a_busy_side_still_goes_direct():
    """Loaded CI: a member that took a while to handle the laptop's offer got the laptop's
    full probes before it had sent its own openers; its NAT kept an unreplied entry for
    them, moved the member's mapping off its port, and the session stayed on the relay
    (test_directlink_sessions waited 60 s, twice). Now each side says when its openers
    are out, and the other probes only after that: b here handles offers a second late."""
    async def body(relay, port, seen):
        a = await endpoint(port, "a")
        b = await endpoint(port, "b", on_stream=echo)
        late = []
        for e in (a, b):
            assert await e.enable_direct(("127.0.0.1", port), bind="127.0.0.1", local_candidates=False)
            behind_a_linux_nat(e, late)
        handle = b._control

        def slowly(s, message):
            asyncio.get_running_loop().call_later(1.0, handle, s, message)
        b._control = slowly
        session = await a.dial(b.id)
        await until("the direct path", lambda: session.path == "direct" and b.answered[a.id][0].path == "direct",
                    D.PUNCH_FOR_S + 5)
        assert late == []
        await carried_direct_then_closed(relay, session, a, b)

    run(body)

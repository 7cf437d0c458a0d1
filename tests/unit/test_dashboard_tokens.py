"""The web dashboard's one-time links and sessions (server/dashboard_access.py), on an
injected clock: a link opens once and only within its minute, a session lasts its hours
and belongs to the identity the link was made for, and the tables stay bounded."""

from __future__ import annotations

import pytest

from mtgpu.cli.admin import link_host
from mtgpu.server import dashboard_access as access
from mtgpu.server.dashboard_access import DashboardAccess, Outcome, TooManyLinks


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_access(**kw) -> tuple[DashboardAccess, Clock]:
    clock = Clock()
    return DashboardAccess(clock, link_ttl_s=60.0, session_ttl_s=3600.0, **kw), clock


def test_a_link_opens_a_session_for_its_identity_once():
    a, _ = make_access()
    link = a.issue_link("alice")
    opened = a.redeem(link.token)
    assert opened.outcome is Outcome.OPENED and opened.identity == "alice" and opened.ttl_s == 3600.0
    assert a.session(opened.secret) == "alice"
    again = a.redeem(link.token)
    assert again.outcome is Outcome.USED and again.secret is None
    assert a.session(opened.secret) == "alice"  # the refused reuse leaves the first session alone


def test_a_link_expires_after_its_minute():
    a, clock = make_access()
    link = a.issue_link("alice")
    clock.now += 60.0
    assert a.redeem(link.token).outcome is Outcome.EXPIRED
    fresh = a.issue_link("alice")
    clock.now += 59.9
    assert a.redeem(fresh.token).outcome is Outcome.OPENED


def test_a_used_or_expired_link_is_forgotten_later_and_then_unknown():
    a, clock = make_access()
    used, lapsed = a.issue_link("alice"), a.issue_link("alice")
    a.redeem(used.token)
    clock.now += 60.0 + access.LINK_MEMORY_S - 1
    assert a.redeem(used.token).outcome is Outcome.USED
    assert a.redeem(lapsed.token).outcome is Outcome.EXPIRED
    clock.now += 1
    assert a.redeem(used.token).outcome is Outcome.UNKNOWN
    assert a.redeem(lapsed.token).outcome is Outcome.UNKNOWN
    assert a.counts() == (0, 1)


def test_unknown_and_malformed_tokens_open_nothing():
    a, _ = make_access()
    a.issue_link("alice")
    for token in ("x" * 43, "", "short", "../../etc", "a" * 500, "é" * 43):
        assert a.redeem(token).outcome is Outcome.UNKNOWN, token
    assert a.counts() == (1, 0)


def test_a_session_expires_and_can_be_ended():
    a, clock = make_access()
    secret = a.redeem(a.issue_link("alice").token).secret
    clock.now += 3599.0
    assert a.session(secret) == "alice" and a.expires_in_s(secret) == pytest.approx(1.0)
    clock.now += 1.0
    assert a.session(secret) is None and a.expires_in_s(secret) == 0.0
    other = a.redeem(a.issue_link("bob").token).secret
    a.end(other)
    assert a.session(other) is None
    assert a.session(None) is None and a.session("") is None and a.session("not-a-session-secret") is None


def test_each_link_and_session_is_its_own_random_value():
    a, _ = make_access()
    tokens = {a.issue_link("alice").token for _ in range(10)}
    assert len(tokens) == 10 and all(len(t) >= 40 for t in tokens)
    secrets = {a.redeem(t).secret for t in tokens}
    assert len(secrets) == 10 and not secrets & tokens


def test_one_identity_cannot_pile_up_unopened_links():
    a, clock = make_access()
    for _ in range(access.MAX_LINKS_PER_IDENTITY):
        a.issue_link("alice")
    with pytest.raises(TooManyLinks, match="alice has 20 dashboard links not opened yet"):
        a.issue_link("alice")
    a.issue_link("bob")  # another identity is not held up
    clock.now += 60.0  # once they expired, alice may ask again
    a.issue_link("alice")


def test_an_identitys_oldest_sessions_make_room_for_new_ones():
    a, clock = make_access()
    first = a.redeem(a.issue_link("alice").token).secret
    for _ in range(access.MAX_SESSIONS_PER_IDENTITY):
        clock.now += 1.0
        a.redeem(a.issue_link("alice").token)
    assert a.session(first) is None
    assert a.counts()[1] == access.MAX_SESSIONS_PER_IDENTITY


def test_the_key_of_an_identity_decides_the_limits():
    a, _ = make_access(key_of=lambda who: who["name"])
    for pid in range(access.MAX_LINKS_PER_IDENTITY):
        a.issue_link({"name": "alice", "pid": pid})  # another process of the same person counts as the same one
    with pytest.raises(TooManyLinks):
        a.issue_link({"name": "alice", "pid": 999})


def test_an_admins_link_names_loopback_for_a_wildcard_listen_or_the_host_given():
    assert link_host("0.0.0.0:7070", None) == "127.0.0.1:7070"
    assert link_host("[::]:7070", None) == "[::1]:7070"
    assert link_host("10.0.0.5:7070", None) == "10.0.0.5:7070"
    assert link_host("0.0.0.0:7070", "gpu-1.lan") == "gpu-1.lan:7070"
    assert link_host("0.0.0.0:7070", "fd00::5") == "[fd00::5]:7070"

"""Member-to-member signatures with clocks apart: the receiver's clock decides freshness,
the sender learns the receiver's time from a signed answer and signs in it."""

from __future__ import annotations

from mtgpu.client.signing import FreshOnce
from mtgpu.server.cluster.signer import SIGNATURE_MAX_AGE_S, Signer

SECRET = "s" * 48


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_sender_an_hour_ahead_is_refused_then_signs_in_the_receivers_time():
    theirs, ours = Clock(1_000_000.0), Clock(1_003_600.0)
    receiver, sender = Signer(SECRET, clock=theirs), Signer(SECRET, clock=ours)
    sent = sender.headers("POST", "/cluster/v1/report", b"{}", "m1", peer="m0:1")
    why = receiver.verify("POST", "/cluster/v1/report", b"{}", sent)
    assert why and "3600s ahead of" in why and Signer.refused_as_stale(401, why)
    answer = receiver.clock_headers(sent)
    offset = sender.learn("m0:1", sent, answer, ours(), ours() + 0.2)
    assert offset is not None and abs(offset - (-3600.1)) < 0.01
    again = sender.headers("POST", "/cluster/v1/report", b"{}", "m1", peer="m0:1")
    assert receiver.verify("POST", "/cluster/v1/report", b"{}", again) is None
    # another peer keeps the sender's own time
    assert float(sender.headers("GET", "/x", b"", "m1", peer="m2:1")["x-mtgpu-time"]) == ours()


def test_a_time_answer_counts_only_for_its_request_and_only_with_the_secret():
    theirs, ours = Clock(1_000_000.0), Clock(1_000_500.0)
    receiver, sender, intruder = Signer(SECRET, clock=theirs), Signer(SECRET, clock=ours), Signer("w" * 48)
    first = sender.headers("GET", "/cluster/v1/raft", b"", "m1", peer="p")
    second = sender.headers("GET", "/cluster/v1/nodes", b"", "m1", peer="p")
    answer_to_first = receiver.clock_headers(first)
    assert sender.learn("p", second, answer_to_first, ours(), ours()) is None  # not that request's answer
    assert sender.learn("p", first, intruder.clock_headers(first), ours(), ours()) is None  # forged
    assert sender.learn("p", first, {}, ours(), ours()) is None  # no time in the answer
    assert sender.offset("p") == 0.0
    assert receiver.clock_headers({}) == {}  # an unsigned request gets no time


def test_a_signature_is_taken_once_and_remembered_as_long_as_it_could_be_taken():
    clock = Clock(2_000_000.0)
    s = Signer(SECRET, clock=clock)
    h = s.headers("POST", "/cluster/v1/report", b"{}", "m1")
    assert s.verify("POST", "/cluster/v1/report", b"{}", h) is None
    assert "already used" in s.verify("POST", "/cluster/v1/report", b"{}", h)
    clock.t -= 3600  # the receiver's clock set back: the request is now from the future, refused
    assert "ahead of" in s.verify("POST", "/cluster/v1/report", b"{}", h)
    clock.t += 3600 + SIGNATURE_MAX_AGE_S / 2  # back where it could be taken: still remembered
    assert "already used" in s.verify("POST", "/cluster/v1/report", b"{}", h)


def test_fresh_once_forgets_only_what_it_could_no_longer_accept():
    clock = Clock(100.0)
    once = FreshOnce(30.0, limit=3, clock=clock)
    for i in range(3):
        assert once.first_use(f"old{i}", "100.0") is None
    clock.t = 200.0  # the three are now too old to be accepted: they may go
    assert once.first_use("new0", "200.0") is None
    assert once.first_use("new0", "200.0") is not None
    assert set(once._seen) == {"new0"}
    assert once.stale(once.skew("260"), "fix") and once.stale(once.skew("229"), "fix") is None
    for bad in ("nan", "inf", "x"):
        try:
            once.skew(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad} taken as a time")

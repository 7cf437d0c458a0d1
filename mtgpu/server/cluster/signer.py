"""Member-to-member request signatures, and how members agree on time for them.

A request between members is signed with a key derived from the cluster secret over
its method, path, time and body; the receiver takes it while its time is within
SIGNATURE_MAX_AGE_S of the receiver's own wall clock, and once (no replay).

A member whose clock jumps (a VM resumed, a broken NTP, someone's `date -s`) must not
fall out of the cluster for that: the receiver answers every signed request with its
own time, signed with a separate key over that time and the request's signature (so
the answer fits only that request and cannot be forged without the secret), and the
sender keeps, per peer, the offset between the peer's clock and its own. It signs with
the peer's time from then on, and a request refused as stale is sent once more with the
offset just learned. Freshness and replay are still judged on the receiver's clock
only, so this widens nothing: a signature stays acceptable for the same 2 x 30 s of the
receiver's time, and it is remembered for as long as it could be accepted.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time

from ...client.signing import FreshOnce

SIGNATURE_MAX_AGE_S = 30.0
H_NODE, H_TIME, H_SIG = "x-mtgpu-node", "x-mtgpu-time", "x-mtgpu-signature"
H_CLOCK, H_CLOCK_SIG = "x-mtgpu-clock", "x-mtgpu-clock-signature"
STALE_MARK = "this server's clock"  # in the refusal of a request whose time is too far off


class Signer:
    """Signs and verifies member-to-member requests (see the module's docstring)."""

    def __init__(self, secret: str, clock=time.time) -> None:
        self.clock = clock
        # The keyed MACs, set up once and copied for each message (every member's report is
        # checked and answered each second: the key's setup cost more than the message).
        self._mac = hmac.new(hashlib.sha256(b"mtgpu-api-v1\0" + secret.encode()).digest(), digestmod="sha256")
        self._clock_mac = hmac.new(hashlib.sha256(b"mtgpu-clock-v1\0" + secret.encode()).digest(), digestmod="sha256")
        self._once = FreshOnce(SIGNATURE_MAX_AGE_S, limit=20000, clock=clock)
        self._offsets: dict[str, float] = {}  # peer address -> its clock minus ours (seconds)
        self._lock = threading.Lock()

    # ------------------------------------------------------------ sending
    def headers(self, method: str, path: str, body: bytes, node: str, peer: str | None = None) -> dict[str, str]:
        """Signed headers for a request to `peer` (an address), in that peer's time as last learned."""
        ts = f"{self.clock() + self.offset(peer):.3f}"
        return {H_NODE: node, H_TIME: ts, H_SIG: self._sign(method, path, ts, body)}

    def offset(self, peer: str | None) -> float:
        with self._lock:
            return self._offsets.get(peer, 0.0) if peer else 0.0

    def learn(self, peer: str, sent: dict[str, str], answer_headers, sent_at: float,
              received_at: float) -> float | None:
        """Take the peer's time from its answer to the request signed with `sent`
        (our wall clock `sent_at` .. `received_at`); the new offset, or None when the
        answer carries no time signed for that request."""
        ts, sig = answer_headers.get(H_CLOCK), answer_headers.get(H_CLOCK_SIG)
        if not ts or not sig or not hmac.compare_digest(sig, self._clock_sign(ts, sent.get(H_SIG, ""))):
            return None
        try:
            theirs = float(ts)
        except ValueError:
            return None
        if theirs != theirs or abs(theirs) == float("inf"):
            return None
        offset = theirs - (sent_at + received_at) / 2
        with self._lock:
            self._offsets[peer] = offset
        return offset

    @staticmethod
    def refused_as_stale(status: int, message: str) -> bool:
        return status == 401 and STALE_MARK in message

    # ------------------------------------------------------------ receiving
    def verify(self, method: str, path: str, body: bytes, headers) -> str | None:
        """None when the request is signed with the cluster key and fresh, else why not."""
        ts, sig = headers.get(H_TIME), headers.get(H_SIG)
        if not ts or not sig:
            return "the request is not signed with the cluster secret"
        try:
            skew = self._once.skew(ts)
        except ValueError:
            return "the request's time is not a number"
        if abs(skew) > self._once.max_age_s:  # (the refusal's text made only for a refusal)
            return self._once.stale(skew, f"{headers.get(H_NODE) or 'the sender'} learns this clock from the "
                                          "answer and signs again; if this goes on, set the members' clocks right "
                                          "(NTP)")
        if not hmac.compare_digest(sig, self._sign(method, path, ts, body)):
            return "wrong signature: this machine does not hold the cluster secret"
        return self._once.first_use(sig, ts)

    def clock_headers(self, request_headers) -> dict[str, str]:
        """This member's time, for the answer to a signed request (empty when unsigned)."""
        sig = request_headers.get(H_SIG)
        if not sig:
            return {}
        ts = f"{self.clock():.3f}"
        return {H_CLOCK: ts, H_CLOCK_SIG: self._clock_sign(ts, sig)}

    # ------------------------------------------------------------ the MACs
    def _sign(self, method: str, path: str, ts: str, body: bytes) -> str:
        mac = self._mac.copy()
        mac.update(f"{method.upper()}\n{path}\n{ts}\n{hashlib.sha256(body).hexdigest()}".encode())
        return mac.hexdigest()

    def _clock_sign(self, ts: str, request_sig: str) -> str:
        mac = self._clock_mac.copy()
        mac.update(f"{ts}\n{request_sig}".encode())
        return mac.hexdigest()


def request_signed(signer: Signer, send, method: str, path: str, body: bytes, node: str, peer: str,
                   resigned=None):
    """A request signed for `peer`, signed again once in the peer's time when the peer refused
    it as stale and its answer told its clock. `send(headers)` makes the request and gives
    the (httpx) response; `resigned(before, after)`: the offsets, told when signing again.
    Returns the last response and, when that is a refusal, its error text (else None)."""
    for again in (False, True):
        headers = signer.headers(method, path, body, node, peer=peer)
        sent_at = signer.clock()
        r = send({**headers, "content-type": "application/json"})
        before = signer.offset(peer)
        after = signer.learn(peer, headers, r.headers, sent_at, signer.clock())
        if r.status_code < 400:
            return r, None
        try:
            message = str(r.json().get("error") or r.text)
        except ValueError:
            message = r.text
        if again or after is None or not signer.refused_as_stale(r.status_code, message):
            return r, message
        if resigned is not None:
            resigned(before, after)
    raise AssertionError("unreachable")

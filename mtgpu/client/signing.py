"""Tenant request signatures for the network API: ed25519 over the request.

A client off the node proves who it is with the key it registered when it joined:
it signs "mtgpu-tenant-v1", the method, the path with its query, a timestamp and the
SHA-256 of the body. The node checks the signature with the tenant's stored public
keys, refuses requests more than MAX_AGE_S old and refuses a signature it has
already seen (no replay). Keys are OpenSSH ed25519 keys, so the same key pair
serves `ssh` too.
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
import time
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

MAX_AGE_S = 60.0
HEADER_TENANT = "x-mtgpu-tenant"
HEADER_TIME = "x-mtgpu-time"
HEADER_SIGNATURE = "x-mtgpu-signature"


class BadKey(ValueError):
    """A key that cannot be used; the message says which and why."""


def _message(method: str, path: str, ts: str, body: bytes) -> bytes:
    return b"\n".join([b"mtgpu-tenant-v1", method.upper().encode(), path.encode(), ts.encode(),
                       hashlib.sha256(body).hexdigest().encode()])


# ---------------------------------------------------------------- keys
def generate_key_pair(private_path: Path) -> str:
    """Write a new OpenSSH ed25519 private key (0600) and its .pub; return the public line."""
    key = Ed25519PrivateKey.generate()
    private_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                            serialization.NoEncryption())
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public = public_line(key, comment="remotegpu")
    Path(str(private_path) + ".pub").write_text(public + "\n")
    return public


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_ssh_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError) as e:
        raise BadKey(f"cannot read the private key {path}: {e}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise BadKey(f"{path} is not an ed25519 key; create one with `ssh-keygen -t ed25519`")
    return key


def public_line(key: Ed25519PrivateKey, comment: str = "") -> str:
    raw = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return f"{raw} {comment}".strip()


def parse_public_key(line: str) -> Ed25519PublicKey:
    """An `ssh-ed25519 AAAA... [comment]` line; raises BadKey saying what is wrong."""
    parts = line.strip().split()
    if len(parts) < 2 or parts[0] != "ssh-ed25519":
        raise BadKey("the public key must be one OpenSSH ed25519 line: 'ssh-ed25519 AAAA... comment'")
    try:
        key = serialization.load_ssh_public_key(f"{parts[0]} {parts[1]}".encode())
    except (ValueError, TypeError) as e:
        raise BadKey(f"the public key cannot be read: {e}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise BadKey("the public key must be ed25519")
    return key


# ---------------------------------------------------------------- signing
def sign_headers(key: Ed25519PrivateKey, tenant: str, method: str, path: str, body: bytes) -> dict[str, str]:
    ts = f"{time.time():.3f}"
    sig = key.sign(_message(method, path, ts, body))
    return {HEADER_TENANT: tenant, HEADER_TIME: ts, HEADER_SIGNATURE: base64.b64encode(sig).decode()}


class FreshOnce:
    """The freshness and single use of signed requests, on this machine's wall clock: a
    request's time may be at most `max_age_s` away from now, and each signature is taken
    once. A signature is remembered until its own time is too old to be accepted again
    (so a clock set back keeps what it saw, and forgets nothing it could still accept)."""

    def __init__(self, max_age_s: float, limit: int = 10000, clock=time.time) -> None:
        self.max_age_s = max_age_s
        self._limit = limit
        self._prune_above = limit
        self.clock = clock
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def skew(self, ts: str) -> float:
        """How far the request's time is from this machine's clock (seconds, + ahead);
        raises ValueError when it is not a number."""
        value = float(ts)
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(ts)
        return value - self.clock()

    def stale(self, skew: float, whose: str) -> str | None:
        """Why a request `skew` seconds away from this clock is refused, or None."""
        if abs(skew) <= self.max_age_s:
            return None
        return (f"the request's time is {abs(skew):.0f}s {'ahead of' if skew > 0 else 'behind'} this "
                f"server's clock (at most {self.max_age_s:.0f}s allowed): {whose}")

    def first_use(self, sig: str, ts: str) -> str | None:
        """None the first time `sig` is seen, else why it is refused."""
        now = self.clock()
        with self._lock:
            if sig in self._seen:
                return "this signed request was already used (replay)"
            self._seen[sig] = float(ts)
            if len(self._seen) > self._prune_above:
                horizon = now - self.max_age_s
                self._seen = {k: v for k, v in self._seen.items() if v >= horizon}
                # More than `limit` still fresh (a thousand members report each second):
                # go over them again only once as many more came, not at every request.
                self._prune_above = max(self._limit, 2 * len(self._seen))
        return None


class SignatureVerifier:
    """Checks tenant signatures; remembers recent signatures to refuse replays."""

    def __init__(self, max_age_s: float = MAX_AGE_S) -> None:
        self.max_age_s = max_age_s
        self._once = FreshOnce(max_age_s)

    def verify(self, method: str, path: str, body: bytes, headers, public_keys: list[str]) -> str | None:
        """None when the request is signed by one of `public_keys`, fresh and new; else why not."""
        ts, sig = headers.get(HEADER_TIME), headers.get(HEADER_SIGNATURE)
        if not ts or not sig:
            return "the request is not signed; use remotegpu-cli (it signs with your key)"
        try:
            skew = self._once.skew(ts)
            raw = base64.b64decode(sig, validate=True)
        except (ValueError, TypeError):
            return "the request's signature headers cannot be read"
        stale = self._once.stale(skew, "set the clocks of this computer and the server right (NTP)")
        if stale:
            return stale
        msg = _message(method, path, ts, body)
        for line in public_keys:
            try:
                parse_public_key(line).verify(raw, msg)
            except (BadKey, InvalidSignature):
                continue
            return self._once.first_use(sig, ts)
        return "wrong signature: the request was not signed with a key registered for this tenant"

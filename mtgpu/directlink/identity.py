"""Who an endpoint is, and what a relay lets in (docs/DIRECTLINK.md, "Credentials").

An endpoint's id is its ed25519 public key (hex). A cluster's key is an ed25519 key
derived from the cluster secret, so every member holds it; its public half is what a
relay is told to trust. A credential says "id X is a member (or tenant NAME) of
cluster C until T", signed with the cluster key; the relay also makes the endpoint sign
a fresh challenge with X's private key, so a credential is worth nothing without it.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import time
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

ROLES = ("member", "tenant")
CHALLENGE_LABEL = b"mtgpu-relay-challenge-v1\0"
MEMBER_CREDENTIAL_S = 7 * 86400  # members issue their own, renewed at each start
TENANT_CREDENTIAL_S = 30 * 86400


class CredentialError(ValueError):
    """A credential or key that cannot be used; the message says which and why."""


def endpoint_id(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def public_key_of(ident: str) -> Ed25519PublicKey:
    try:
        raw = bytes.fromhex(ident)
        if len(raw) != 32:
            raise ValueError(f"{len(raw)} bytes")
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError as e:
        raise CredentialError(f"{ident[:80]!r} is not an endpoint id (64 hex digits of an ed25519 key): {e}") from None


def cluster_key(secret: str, cluster_id: str) -> Ed25519PrivateKey:
    """The cluster's DirectLink key: derived from its secret, the same on every member."""
    seed = HKDF(algorithm=hashes.SHA256(), length=32, salt=cluster_id.encode(),
                info=b"mtgpu-directlink-cluster-key-v1").derive(secret.encode())
    return Ed25519PrivateKey.from_private_bytes(seed)


def member_key(secret: str, cluster_id: str, address: str) -> Ed25519PrivateKey:
    """A member's DirectLink key, derived from the cluster secret and its advertised
    LISTEN address: every member knows every other's id from its address alone (so a
    member joining from behind NAT reaches PEERS through the relay with nothing else),
    and proves it is a member by holding the key (only holders of the secret can)."""
    seed = HKDF(algorithm=hashes.SHA256(), length=32, salt=cluster_id.encode(),
                info=b"mtgpu-directlink-member-key-v1\0" + address.encode()).derive(secret.encode())
    return Ed25519PrivateKey.from_private_bytes(seed)


def invite_code_hash(code: str) -> str:
    """What the cluster's state keeps of an invite code (never the code itself)."""
    return hashlib.sha256(b"mtgpu-invite-v1\0" + code.strip().encode()).hexdigest()


def invite_key(code_hash: str) -> Ed25519PrivateKey:
    """The DirectLink key of a pending invitation, derived from its code's hash: the
    invitee's client holds the code, so it derives it; the members see the hash in the
    state, so they know the id and admit it to the API alone (to join), until the code
    is used or expires. From behind NAT, `remotegpu-cli join` goes through the relay
    with it (issue 26)."""
    seed = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=b"mtgpu-directlink-invite-key-v1\0").derive(bytes.fromhex(code_hash))
    return Ed25519PrivateKey.from_private_bytes(seed)


@functools.lru_cache(maxsize=1024)
def invite_id(code_hash: str) -> str:
    """The endpoint id of a pending invitation (its key: invite_key)."""
    return endpoint_id(invite_key(code_hash))


def _canonical(fields: dict) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Credential:
    cluster: str
    id: str
    role: str
    name: str
    expires: float
    signature: str = ""

    def fields(self) -> dict:
        return {"v": 1, "cluster": self.cluster, "id": self.id, "role": self.role, "name": self.name,
                "expires": round(self.expires, 3)}

    def to_dict(self) -> dict:
        return {**self.fields(), "sig": self.signature}

    @classmethod
    def from_dict(cls, d: dict) -> "Credential":
        try:
            if d.get("v") != 1:
                raise CredentialError(f"credential version {d.get('v')!r}; this relay reads version 1")
            return cls(cluster=str(d["cluster"]), id=str(d["id"]), role=str(d["role"]), name=str(d["name"]),
                       expires=float(d["expires"]), signature=str(d["sig"]))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            if isinstance(e, CredentialError):
                raise
            raise CredentialError(f"the credential cannot be read ({type(e).__name__}: {e})") from None


def issue(cluster_priv: Ed25519PrivateKey, cluster_id: str, ident: str, role: str, name: str,
          valid_s: float, now: float | None = None) -> Credential:
    if role not in ROLES:
        raise CredentialError(f"role {role!r}: a credential is for a {' or a '.join(ROLES)}")
    public_key_of(ident)
    c = Credential(cluster_id, ident, role, name, (time.time() if now is None else now) + valid_s)
    sig = base64.b64encode(cluster_priv.sign(_canonical(c.fields()))).decode()
    return Credential(c.cluster, c.id, c.role, c.name, c.expires, sig)


def check(cred: Credential, trusted: dict[str, Ed25519PublicKey], now: float | None = None) -> str | None:
    """None when `cred` is signed by the key trusted for its cluster and not expired,
    else why it is refused."""
    key = trusted.get(cred.cluster)
    if key is None:
        return f"this relay does not serve the cluster {cred.cluster!r} (it serves: {', '.join(sorted(trusted))})"
    try:
        key.verify(base64.b64decode(cred.signature, validate=True), _canonical(cred.fields()))
    except (InvalidSignature, ValueError):
        return (f"the credential of {cred.role} {cred.name!r} is not signed by the cluster {cred.cluster!r}'s key "
                "this relay trusts (a member of another cluster with the same name, or a relay given an old key?)")
    at = time.time() if now is None else now
    if cred.expires < at:
        return (f"the credential of {cred.role} {cred.name!r} expired {at - cred.expires:.0f}s ago: get a new one "
                "(a member issues its own at start; a tenant runs `remotegpu-cli join` again)")
    return None


def sign_challenge(key: Ed25519PrivateKey, nonce: bytes, channel: bytes = b"") -> str:
    """The answer to a relay's challenge; `channel`: the fingerprint of the relay's TLS
    certificate as this endpoint saw it (relaytls.py), which binds the answer to this
    TLS connection."""
    return base64.b64encode(key.sign(CHALLENGE_LABEL + nonce + channel)).decode()


def signed_by(ident: str, signature: str, message: bytes) -> bool:
    """Whether `signature` (base64) is the key `ident`'s over `message`."""
    try:
        public_key_of(ident).verify(base64.b64decode(signature, validate=True), message)
    except (InvalidSignature, ValueError, CredentialError):
        return False
    return True


def check_challenge(ident: str, nonce: bytes, signature: str, channel: bytes = b"") -> str | None:
    if not signed_by(ident, signature, CHALLENGE_LABEL + nonce + channel):
        return (f"the endpoint did not prove that it holds the key of {ident[:16]}... (its challenge answer is wrong, "
                "or it answered through a machine in the middle that showed another TLS certificate)")
    return None

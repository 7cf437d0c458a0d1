"""Cluster keys and credentials (directlink/identity.py)."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mtgpu.directlink.identity import (Credential, CredentialError, check, check_challenge, cluster_key,
                                       endpoint_id, issue, public_key_of, sign_challenge)

SECRET = "s" * 48


def test_the_cluster_key_is_the_same_on_every_member_and_differs_per_cluster_and_secret():
    a, b = cluster_key(SECRET, "lab"), cluster_key(SECRET, "lab")
    assert endpoint_id(a) == endpoint_id(b)
    assert endpoint_id(cluster_key(SECRET, "other")) != endpoint_id(a)
    assert endpoint_id(cluster_key("t" * 48, "lab")) != endpoint_id(a)


def test_a_credential_is_taken_only_signed_by_the_trusted_key_unexpired_and_for_a_served_cluster():
    ck = cluster_key(SECRET, "lab")
    me = Ed25519PrivateKey.generate()
    trusted = {"lab": ck.public_key()}
    cred = issue(ck, "lab", endpoint_id(me), "member", "m0", 60, now=1000.0)
    assert check(Credential.from_dict(cred.to_dict()), trusted, now=1030.0) is None
    assert "expired 40s ago" in check(cred, trusted, now=1100.0)
    assert "does not serve the cluster 'lab'" in check(cred, {"else": ck.public_key()}, now=1000.0)
    forged = issue(cluster_key("x" * 48, "lab"), "lab", endpoint_id(me), "member", "m0", 60, now=1000.0)
    assert "not signed by the cluster 'lab'" in check(forged, trusted, now=1000.0)
    changed = Credential(cred.cluster, cred.id, "member", "m9", cred.expires, cred.signature)  # renamed
    assert "not signed" in check(changed, trusted, now=1000.0)


def test_the_challenge_proves_the_id_key_and_bad_input_is_named():
    me, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    nonce = b"n" * 32
    assert check_challenge(endpoint_id(me), nonce, sign_challenge(me, nonce)) is None
    assert "did not prove" in check_challenge(endpoint_id(me), nonce, sign_challenge(other, nonce))
    assert "did not prove" in check_challenge(endpoint_id(me), b"m" * 32, sign_challenge(me, nonce))
    with pytest.raises(CredentialError, match="not an endpoint id"):
        public_key_of("abcd")
    with pytest.raises(CredentialError, match="role 'admin'"):
        issue(cluster_key(SECRET, "lab"), "lab", endpoint_id(me), "admin", "x", 60)
    with pytest.raises(CredentialError, match="version"):
        Credential.from_dict({"v": 2})
    with pytest.raises(CredentialError, match="cannot be read"):
        Credential.from_dict({"v": 1, "cluster": "lab"})

"""TLS certificates bound to DirectLink identities (docs/DIRECTLINK.md, "Sessions").

QUIC needs a TLS certificate; our identities are ed25519 keys, and the QUIC stack we use
(qh3) signs its TLS handshakes with ECDSA. So each endpoint makes a P-256 key and a
self-signed certificate for it at start, carrying one extension: the endpoint's id and its
ed25519 signature over the certificate's public key. A dialer that knows whom it dials
checks that binding, which pins the session to that identity whatever the path or relay.
The dialer proves its own identity inside the session by signing the responder's
certificate fingerprint (`dialer_proof`), since QUIC clients here send no certificate.
"""

from __future__ import annotations

import base64
import datetime
import hashlib

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import NameOID

from .identity import CredentialError, endpoint_id, public_key_of, signed_by

# A UUID-based OID (2.25.<uuid as an integer>): needs no registration.
BINDING_OID = x509.ObjectIdentifier("2.25.217535811290717364432419637233812394151")
BINDING_LABEL = b"mtgpu-directlink-tls-binding-v1\0"
DIALER_LABEL = b"mtgpu-directlink-dialer-v1\0"


class TlsIdentity:
    """This endpoint's TLS key and certificate, bound to its identity key."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self.id = endpoint_id(key)
        self._key = key
        tls_key = ec.generate_private_key(ec.SECP256R1())
        spki = tls_key.public_key().public_bytes(serialization.Encoding.DER,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo)
        binding = bytes.fromhex(self.id) + key.sign(BINDING_LABEL + spki)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"mtgpu-{self.id[:16]}")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(tls_key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=365))
                .add_extension(x509.UnrecognizedExtension(BINDING_OID, binding), critical=False)
                .sign(tls_key, hashes.SHA256()))
        self.cert_der = cert.public_bytes(serialization.Encoding.DER)
        self.cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        self.key_pem = tls_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption())
        self.fingerprint = hashlib.sha256(self.cert_der).digest()

    def dialer_proof(self, responder_fingerprint: bytes) -> str:
        return base64.b64encode(self._key.sign(DIALER_LABEL + responder_fingerprint)).decode()


def bound_id(cert_der: bytes) -> str:
    """The identity a certificate is bound to; raises CredentialError when it is bound to
    none (not one of ours, or its binding does not verify)."""
    try:
        cert = x509.load_der_x509_certificate(cert_der)
        binding = cert.extensions.get_extension_for_oid(BINDING_OID).value.value
    except (ValueError, x509.ExtensionNotFound) as e:
        raise CredentialError(f"the peer's certificate carries no DirectLink identity ({type(e).__name__})") from None
    ident, sig = binding[:32].hex(), binding[32:]
    spki = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        public_key_of(ident).verify(sig, BINDING_LABEL + spki)
    except InvalidSignature:
        raise CredentialError("the peer's certificate claims an identity whose key did not sign it") from None
    return ident


def check_dialer(ident: str, proof: str, my_fingerprint: bytes) -> str | None:
    if not signed_by(ident, proof, DIALER_LABEL + my_fingerprint):
        return f"the dialer did not prove that it holds the key of {ident[:16]}..."
    return None

"""TLS on the relay's TCP port (docs/DIRECTLINK.md, "The relay").

What an endpoint sends the relay is already end to end encrypted (QUIC packets), but
its hello is not: the credential names its cluster, role and name. TLS 1.3 hides that
and the frame pattern from the networks between. The relay is untrusted by design, so
nothing is gained by authenticating it with a certificate authority: it makes a
certificate for a fresh key at each start, and the endpoint binds its admission to the
TLS connection instead, by signing the relay's challenge together with the fingerprint
of the certificate it saw. A machine in the middle that terminates TLS itself shows
another certificate, so the proof it passes on is refused by the real relay: it can
neither log in as the endpoint nor read its hello.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import ssl
import tempfile

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

HANDSHAKE_TIMEOUT_S = 10.0


class RelayTls:
    """The relay's side: a throw-away key and certificate, and the context that serves them."""

    def __init__(self) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mtgpu-relay")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=3650))
                .sign(key, hashes.SHA256()))
        der = cert.public_bytes(serialization.Encoding.DER)
        self.fingerprint = hashlib.sha256(der).digest()
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_3
        pem = cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        # The ssl module reads a certificate chain only from a file: one only root can read,
        # gone again at once.
        fd, path = tempfile.mkstemp(prefix="mtgpu-relay-", suffix=".pem")
        try:
            os.write(fd, pem)
            os.close(fd)
            self.context.load_cert_chain(path)
        finally:
            os.unlink(path)


def client_context() -> ssl.SSLContext:
    """An endpoint's side: TLS 1.3, the certificate not checked against any authority
    (the admission proof binds it instead, see the module's docstring)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def peer_fingerprint(writer) -> bytes:
    """The SHA-256 of the certificate the other side of this TLS stream showed."""
    obj = writer.get_extra_info("ssl_object")
    der = obj.getpeercert(binary_form=True) if obj is not None else None
    return hashlib.sha256(der).digest() if der else b""

"""A real private container registry for tests: Debian's `docker-registry` (Docker
distribution 2.8) on 127.0.0.1:<free port>, TLS with a certificate of its own CA and
htpasswd (bcrypt) authentication, its storage in a temporary folder.

    with private_registry() as reg:
        ref = reg.push(local_root_image, "team/bb:1")   # "127.0.0.1:PORT/team/bb:1"
        reg.auth_file                                   # containers-auth.json, root 0600
        reg.write_auth_file(path, password="wrong")     # another one, e.g. bad credentials

Podman (root and rootless) trusts the CA through /etc/containers/certs.d/127.0.0.1:PORT/ca.crt,
written here and removed at exit. A pushed name is removed from root's local store right
after the push, so that a node really has to pull it, and again at exit (a node's pull
leaves it there). The registry is stopped by its PID and its folder removed at exit, also
when the test failed.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import ipaddress
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support.node import free_port

REGISTRY = "/usr/bin/docker-registry"
CERTS_D = Path("/etc/containers/certs.d")
HOST = "127.0.0.1"


def registry_missing() -> str | None:
    """None when a private registry can run here, else why not (for pytest.skip)."""
    if os.geteuid() != 0:
        return "the private registry writes /etc/containers/certs.d and pushes as root: needs root"
    if not os.access(REGISTRY, os.X_OK):
        return f"{REGISTRY} is missing (apt install docker-registry)"
    if shutil.which("podman") is None:
        return "podman is not installed"
    return None


def bcrypt_hash(password: str) -> str:
    """An htpasswd bcrypt hash ($2b$, the lowest cost: the registry checks it on every request)."""
    try:
        import bcrypt  # type: ignore[import-not-found]

        return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    except ImportError:
        pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # Debian's libcrypt makes bcrypt hashes

        h = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))
    if not h or not h.startswith("$2"):
        raise RuntimeError(f"this libcrypt made no bcrypt hash ({h!r}); pip install bcrypt")
    return h


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A self-signed CA and a server certificate for 127.0.0.1 (SAN IP) it signed:
    (ca.crt, server.crt, server.key)."""
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder()
          .subject_name(_name("mtgpu test registry CA")).issuer_name(_name("mtgpu test registry CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(_name(HOST)).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_path, cert_path, key_path = directory / "ca.crt", directory / "server.crt", directory / "server.key"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    os.chmod(key_path, 0o600)
    return ca_path, cert_path, key_path


def auth_string(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


@dataclass
class Registry:
    base: Path  # 0755: tenants may traverse it, so a file's own mode is what keeps them out
    port: int
    user: str
    password: str
    ca_path: Path
    auth_file: Path
    log_path: Path
    proc: subprocess.Popen | None = None
    pushed: list[str] = field(default_factory=list)

    @property
    def host(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def auth(self) -> str:
        """The `auth` value of the good credentials (base64 of user:password)."""
        return auth_string(self.user, self.password)

    def ref(self, repo_tag: str) -> str:
        return f"{self.host}/{repo_tag}"

    def write_auth_file(self, path: Path, password: str | None = None, mode: int = 0o600) -> Path:
        """A containers-auth.json for this registry (owned by root, `mode`)."""
        doc = {"auths": {self.host: {"auth": auth_string(self.user, self.password if password is None else password)}}}
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        os.chown(tmp, 0, 0)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        return path

    def push(self, local: str, repo_tag: str) -> str:
        """Push root's local image `local` as HOST:PORT/`repo_tag` (with the good credentials,
        TLS verified against the CA), then drop that name from root's store."""
        ref = self.ref(repo_tag)
        self.pushed.append(ref)
        r = subprocess.run(["podman", "push", "--quiet", "--authfile", str(self.auth_file), local, ref],
                           capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise RuntimeError(f"podman push {local} {ref} failed ({r.returncode}): {r.stderr}\n{self.log()[-3000:]}")
        _forget_local(ref)
        return ref

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def manifest_gets(self, repo_tag: str) -> int:
        """How many GET requests for the manifest of `repo_tag` the registry answered with 200."""
        repo, _, tag = repo_tag.rpartition(":")
        needle = f'"GET /v2/{repo}/manifests/{tag} HTTP'
        return sum(1 for line in self.log().splitlines() if needle in line and '" 200 ' in line)


def _forget_local(ref: str) -> None:
    subprocess.run(["podman", "rmi", "--force", ref], capture_output=True, timeout=120, stdin=subprocess.DEVNULL)


def _wait_up(reg: Registry, timeout_s: float) -> None:
    ctx = ssl.create_default_context(cafile=str(reg.ca_path))
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        if reg.proc.poll() is not None:
            raise RuntimeError(f"docker-registry exited with {reg.proc.returncode}:\n{reg.log()[-3000:]}")
        try:
            urllib.request.urlopen(f"https://{reg.host}/v2/", context=ctx, timeout=5)
            raise RuntimeError("the registry answered /v2/ without credentials: htpasswd auth is not on")
        except urllib.error.HTTPError as e:
            if e.code == 401:
                return
            last = e
        except (urllib.error.URLError, OSError) as e:
            last = e
        time.sleep(0.1)
    raise RuntimeError(f"docker-registry did not answer on {reg.host} within {timeout_s}s ({last}):\n{reg.log()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@contextlib.contextmanager
def private_registry(user: str = "mtgpu-team", start_timeout_s: float = 60.0) -> Iterator[Registry]:
    why = registry_missing()
    if why:
        raise RuntimeError(why)
    base = Path(tempfile.mkdtemp(prefix="mtgpu-registry-"))
    os.chmod(base, 0o755)
    certs_dir: Path | None = None
    made_certs_d = False
    reg: Registry | None = None
    try:
        private = base / "private"
        private.mkdir(mode=0o700)
        (private / "data").mkdir(mode=0o700)
        ca_path, cert_path, key_path = make_certificates(private)
        password = secrets.token_urlsafe(18)
        htpasswd = private / "htpasswd"
        htpasswd.write_text(f"{user}:{bcrypt_hash(password)}\n")
        os.chmod(htpasswd, 0o600)
        for attempt in range(5):
            port = free_port()
            reg = Registry(base, port, user, password, ca_path, base / "containers-auth.json",
                           private / f"registry-{attempt}.log")
            config = {
                "version": 0.1,
                "log": {"level": "info", "accesslog": {"disabled": False}, "fields": {"service": "registry"}},
                "storage": {"filesystem": {"rootdirectory": str(private / "data")}, "delete": {"enabled": True}},
                "http": {"addr": f"{HOST}:{port}", "tls": {"certificate": str(cert_path), "key": str(key_path)}},
                "auth": {"htpasswd": {"realm": "mtgpu-test", "path": str(htpasswd)}},
            }
            config_path = private / "config.yml"
            config_path.write_text(json.dumps(config, indent=1))  # JSON is YAML
            with open(reg.log_path, "wb") as log:
                reg.proc = subprocess.Popen([REGISTRY, "serve", str(config_path)], stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True, cwd=str(private))
            try:
                _wait_up(reg, start_timeout_s)
                break
            except RuntimeError:
                _stop(reg.proc)
                if "address already in use" not in reg.log() or attempt == 4:
                    raise
        if not CERTS_D.is_dir():
            CERTS_D.mkdir(parents=True, exist_ok=True)
            made_certs_d = True
        certs_dir = CERTS_D / reg.host
        certs_dir.mkdir(mode=0o755)
        shutil.copyfile(ca_path, certs_dir / "ca.crt")
        os.chmod(certs_dir / "ca.crt", 0o644)
        reg.write_auth_file(reg.auth_file)
        yield reg
    finally:
        if reg is not None:
            for ref in reg.pushed:
                with contextlib.suppress(Exception):
                    _forget_local(ref)
            if reg.proc is not None:
                _stop(reg.proc)
        if certs_dir is not None:
            shutil.rmtree(certs_dir, ignore_errors=True)
        if made_certs_d:
            with contextlib.suppress(OSError):
                CERTS_D.rmdir()
        shutil.rmtree(base, ignore_errors=True)

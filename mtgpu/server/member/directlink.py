"""A member's DirectLink side (docs/DIRECTLINK.md): its identity, its connection to the
first of `[DIRECTLINK] relays` that admits it (kept, and made again when it drops), the
relay it serves itself (`relay_listen`), and the sessions tenants open to it, whose
streams reach its tenant sshd and its network API (directlink/services.py).

It runs in its own thread with its own event loop, so a slow session never holds up
the API or the member's loop. Who may open a session: a tenant of this cluster (by the
key it joined with) or another member (by the DirectLink id it registered).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ...config import Config
from ...config.schema import parse_address
from ...directlink.endpoint import Endpoint
from ...directlink.identity import MEMBER_CREDENTIAL_S, cluster_key, endpoint_id, issue
from ...directlink.relay import Relay
from ...directlink.relay_client import RelayConnection, RelayRefused
from ...directlink.services import serve_stream

log = logging.getLogger(__name__)
KEY_FILE = "directlink.key"
RETRY_S = (1.0, 2.0, 5.0, 10.0)


def load_or_create_key(state_dir: Path) -> Ed25519PrivateKey:
    """The member's long-term DirectLink key: STATE_DIR/directlink.key (32 raw bytes, 0600)."""
    path = Path(state_dir) / KEY_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        key = Ed25519PrivateKey.generate()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                      serialization.NoEncryption()))
        log.info("directlink: made this member's key %s", path)
        return key
    if len(raw) != 32:
        raise ValueError(f"{path} holds {len(raw)} bytes, not the 32 of an ed25519 key: move it aside and "
                         "start again (a new key is made; clients learn it from the cluster)")
    return Ed25519PrivateKey.from_private_bytes(raw)


def openssh_key_id(line: str) -> str | None:
    """The DirectLink id of an OpenSSH ed25519 public key line ("ssh-ed25519 AAAA... c")."""
    try:
        key = serialization.load_ssh_public_key(" ".join(line.split()[:2]).encode())
    except (ValueError, IndexError, TypeError):
        return None
    return endpoint_id(key) if isinstance(key, Ed25519PublicKey) else None


def loopback_target(address: str) -> tuple[str, int]:
    """Where this node's own service at `address` (LISTEN, SSH_LISTEN) is reached from itself."""
    host, port = parse_address(address)
    return ("127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host), port


class MemberDirectLink:
    def __init__(self, config: Config, member, secret: str) -> None:
        self.config, self.member = config, member
        self.settings = config.DIRECTLINK
        self.cluster_id = str(config.CLUSTER_ID)
        self.key = load_or_create_key(config.STATE_DIR)
        self.id = endpoint_id(self.key)
        self.cluster_priv = cluster_key(secret, self.cluster_id)
        self.targets = {"ssh": loopback_target(config.SSH_LISTEN), "api": loopback_target(config.LISTEN)}
        self.relay_now = ""  # the relay this member is connected to ("" none)
        self.problem = ""
        self.endpoint: Endpoint | None = None
        self._ids: dict[str, str | None] = {}  # OpenSSH line -> id (cache)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False

    # ------------------------------------------------------------ life cycle
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mtgpu-directlink", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        loop = self._loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        if self.settings.relay_listen:
            loop.create_task(self._serve_relay())
        if self.settings.relays:
            loop.create_task(self._stay_connected())
        try:
            loop.run_forever()
        finally:
            loop.close()

    def status(self) -> dict:
        ep = self.endpoint
        sessions = []
        if ep is not None:
            for s in list(ep.answered.values()) + list(ep.dialled.values()):
                if not s.closed.is_set():
                    sessions.append({"peer": s.peer_id, "path": s.path})
        return {"id": self.id, "relay": self.relay_now, "relay_listen": self.settings.relay_listen,
                "public": ep.public if ep is not None else None, "sessions": sessions, "problem": self.problem}

    def summary(self) -> dict:
        """For /v1/info: the relay and how many sessions go which way (no peer ids)."""
        st = self.status()
        paths = [x["path"] for x in st["sessions"]]
        return {"relay": st["relay"], "relay_listen": st["relay_listen"], "problem": st["problem"],
                "sessions_direct": paths.count("direct"), "sessions_relayed": paths.count("relay")}

    # ------------------------------------------------------------ the relay it serves
    async def _serve_relay(self) -> None:
        host, port = parse_address(self.settings.relay_listen)
        relay = Relay({self.cluster_id: self.cluster_priv.public_key()})
        try:
            await relay.serve(host, port)
        except OSError as e:
            self.problem = f"[DIRECTLINK] relay_listen = {self.settings.relay_listen!r}: cannot listen ({e.strerror})"
            log.error("directlink: %s; pick a free port", self.problem)
            return
        log.info("directlink: serving as a relay for %s on %s", self.cluster_id, self.settings.relay_listen)

    # ------------------------------------------------------------ its relay connection
    async def _stay_connected(self) -> None:
        failures = 0
        while not self._stopping:
            for address in self.settings.relays:
                if await self._connect_and_serve(address):
                    failures = 0
            failures += 1
            await asyncio.sleep(RETRY_S[min(failures, len(RETRY_S)) - 1])

    async def _connect_and_serve(self, address: str) -> bool:
        """Connect to one relay and take sessions until it drops; False when it could not connect."""
        host, port = parse_address(address)
        cred = issue(self.cluster_priv, self.cluster_id, self.id, "member", self.config.NODE_NAME, MEMBER_CREDENTIAL_S)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
            ip = infos[0][4][0]
            relay = await RelayConnection.open(ip, port, self.key, cred)
        except RelayRefused as e:
            self.problem = str(e)
            log.error("directlink: %s", e)
            return False
        except (OSError, asyncio.TimeoutError, ValueError) as e:
            self.problem = f"the relay {address} does not answer: {e or type(e).__name__}"
            log.warning("directlink: %s", self.problem)
            return False
        ep = self.endpoint = Endpoint(self.key, relay, on_stream=self._stream, admit=self._admit)
        try:
            await ep.enable_direct((ip, port))
        except OSError as e:
            log.warning("directlink: no direct paths (%s): sessions stay on the relay", e)
        self.relay_now, self.problem = address, ""
        log.info("directlink: connected to the relay %s as %s...", address, self.id[:16])
        await relay.closed.wait()
        self.relay_now = ""
        if not self._stopping:
            log.warning("directlink: the relay %s closed the connection; connecting again", address)
        await ep.close()
        self.endpoint = None
        return True

    # ------------------------------------------------------------ sessions
    def _admit(self, peer_id: str) -> str | None:
        machine = self.member.store.machine
        with self.member.store.lock:
            tenants = [(t.name, list(t.keys)) for t in machine.tenants.values() if self.cluster_id in t.clusters]
            members = {(n.directlink or {}).get("id") for n in machine.nodes.values()}
        if peer_id in members:
            return None
        for _name, keys in tenants:
            for line in keys:
                if line not in self._ids:
                    self._ids[line] = openssh_key_id(line)
                if self._ids[line] == peer_id:
                    return None
        return (f"{peer_id[:16]}... is no tenant of {self.cluster_id} (no joined key is this one) and no member: "
                "join with `remotegpu-cli join` first")

    async def _stream(self, session, stream) -> None:
        await serve_stream(session, stream, self.targets)

"""A member's DirectLink side (docs/DIRECTLINK.md): its identity, its connection to the
first of `[DIRECTLINK] relays` that admits it (kept, and made again when it drops), the
relay it serves itself (`relay_listen`), the sessions tenants open to it (their streams
reach its tenant sshd and its network API), and the routes to other members it cannot
reach directly: a loopback port per member and service whose connections go to that
member's API or Raft port through a session (so a cluster spans NATed sites).

A member's key derives from the cluster secret and its advertised LISTEN address
(identity.member_key): any member knows any other's id from its address, with no
directory. It runs in its own thread with its own event loop, so a slow session never
holds up the API or the member's loop. Who may open a session: a tenant of this
cluster (by a key it joined with), or a member (it claims its address and holds the key
derived from it).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ...config import Config
from ...config.schema import parse_address
from ...directlink import noise
from ...directlink.endpoint import Endpoint
from ...directlink.identity import MEMBER_CREDENTIAL_S, cluster_key, endpoint_id, invite_id, issue, member_key
from ...directlink.relay import Relay
from ...directlink.relay_client import RelayConnection, RelayRefused
from ...directlink.services import ServiceRefused, open_service, pipe, serve_stream
from ...directlink.session import SessionError
from ..cluster.addresses import advertised, api_address, raft_address

log = logging.getLogger(__name__)
RETRY_S = (1.0, 2.0, 5.0, 10.0)
PROBE_EVERY_S = 10.0  # how often a member's address is tried directly again
PROBE_TIMEOUT_S = 1.5
PROBES_AT_ONCE = 32


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
    def __init__(self, config: Config, secret: str) -> None:
        self.config, self.member = config, None
        self.settings = config.DIRECTLINK
        self.cluster_id = str(config.CLUSTER_ID)
        self.secret = secret
        self.address = advertised(config.LISTEN)
        self.key = member_key(secret, self.cluster_id, self.address)
        self.id = endpoint_id(self.key)
        self.cluster_priv = cluster_key(secret, self.cluster_id)
        api = loopback_target(config.LISTEN)
        self.tenant_targets = {"ssh": loopback_target(config.SSH_LISTEN), "api": api}
        self.member_targets = {"api": api, "raft": loopback_target(raft_address(config.LISTEN))}
        self.relay_now = ""  # the relay this member is connected to ("" none)
        self.problem = ""
        self.endpoint: Endpoint | None = None
        self._ids: dict[str, str | None] = {}  # OpenSSH line -> id (cache)
        self._member_ids: dict[str, str] = {}  # address -> member id (cache)
        self._members_in: set[str] = set()  # ids of members that proved who they are
        self._invitees: set[str] = set()  # ids of pending invitations' keys (the API only, to join)
        self._direct: dict[str, tuple[bool, float]] = {}  # address -> (answers directly, when tried)
        self._forwarders: dict[tuple[str, str], int] = {}  # (address, service) -> loopback port
        self._routed_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.connected = threading.Event()  # set while a relay connection is up

    def attach(self, member) -> None:
        """The member whose replicated state says who the tenants are (tenants wait until then)."""
        self.member = member
        member.directlink_id = self.id

    # ------------------------------------------------------------ life cycle
    def start(self) -> None:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="mtgpu-directlink", daemon=True)
        self._thread.start()
        ready.wait(10)
        if self.settings.relays:  # members behind NAT are reached through it from the first request
            if not self.connected.wait(10):
                log.warning("directlink: no relay admitted this member within 10 s (%s); it goes on trying",
                            self.problem or "no answer")

    def stop(self) -> None:
        self._stopping = True
        loop = self._loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self, ready: threading.Event) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        noise.install(loop, logging.WARNING)  # asyncio's reports: one line each, no traceback
        loop.call_soon(ready.set)
        if self.settings.relay_listen:
            loop.create_task(self._serve_relay())
        if self.settings.relays:  # routes to other members go through a relay it is connected to
            loop.create_task(self._stay_connected())
            loop.create_task(self._probe_loop())
        try:
            loop.run_forever()
        finally:
            loop.close()

    def status(self) -> dict:
        ep = self.endpoint
        sessions = []
        if ep is not None:
            for s in ep.sessions():
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
        ep = self.endpoint
        if ep is None:  # the first relay connection: the endpoint lives from now on, its sessions with it
            ep = self.endpoint = Endpoint(self.key, relay, on_stream=self._stream, admit=self._admit,
                                          claims={"member": self.address}, reconnect=None)
            try:
                await ep.enable_direct((ip, port))
            except OSError as e:
                log.warning("directlink: no direct paths (%s): sessions stay on the relay", e)
        else:
            ep.use_relay(relay, (ip, port))
        self.relay_now, self.problem = address, ""
        self.connected.set()
        log.info("directlink: connected to the relay %s as %s...", address, self.id[:16])
        await relay.closed.wait()
        self.relay_now = ""
        self.connected.clear()
        if not self._stopping:
            direct = sum(1 for s in ep.sessions() if s.path == "direct")
            self.problem = (f"the relay {address} closed the connection: new sessions wait until a relay admits "
                            "this member")
            log.warning("directlink: the relay %s closed the connection; %d session(s) on the direct path go on, "
                        "new sessions wait until a relay admits this member again (connecting again)",
                        address, direct)
        return True

    # ------------------------------------------------------------ sessions
    def member_id(self, address: str) -> str:
        ident = self._member_ids.get(address)
        if ident is None:
            ident = self._member_ids[address] = endpoint_id(member_key(self.secret, self.cluster_id, address))
        return ident

    def _admit(self, peer_id: str, claims: dict) -> str | None:
        claimed = claims.get("member")
        if isinstance(claimed, str) and len(claimed) < 300:
            if self.member_id(claimed) == peer_id:
                self._members_in.add(peer_id)
                return None
            return f"{peer_id[:16]}... claims to be the member at {claimed[:100]} but holds another key"
        if self.member is None:
            return "this member is still starting: try again in a moment"
        machine = self.member.store.machine
        with self.member.store.lock:
            tenants = [list(t.keys) for t in machine.tenants.values() if self.cluster_id in t.clusters]
        for keys in tenants:
            for line in keys:
                if line not in self._ids:
                    self._ids[line] = openssh_key_id(line)
                if self._ids[line] == peer_id:
                    return None
        with self.member.store.lock:  # a pending invitation joins through the API alone (identity.invite_key)
            pending = [h for h, i in machine.invites.items() if i.used_at is None and i.expires_at > time.time()]
        if peer_id in {invite_id(h) for h in pending}:
            self._invitees.add(peer_id)
            return None
        return (f"{peer_id[:16]}... is no tenant of {self.cluster_id} (no joined key is this one) and no member: "
                "join with `remotegpu-cli join` first")

    async def _stream(self, session, stream) -> None:
        targets = self.member_targets if session.peer_id in self._members_in else self.tenant_targets
        if session.peer_id in self._invitees:
            targets = {"api": self.tenant_targets["api"]}
        await serve_stream(session, stream, targets)

    # ------------------------------------------------------------ routes to other members
    def reach_api(self, address: str) -> str:
        """Where to connect for a member's LISTEN `address` (ClusterLink.reach); called
        from worker threads, so a member not tried yet is tried first (at most
        PROBE_TIMEOUT_S)."""
        port = self._route(address, "api", wait=True)
        return f"127.0.0.1:{port}" if port else address

    def reach_raft(self, raft: str) -> tuple[str, int] | None:
        """Where to connect for a member's Raft address (raft_route.py), None: to it.
        Called on the Raft thread, which must never wait: a member not tried yet is
        connected to directly while it is tried, and through the relay on the next
        attempt when it did not answer."""
        port = self._route(api_address(raft), "raft", wait=False)
        return ("127.0.0.1", port) if port else None

    def _route(self, address: str, service: str, wait: bool) -> int | None:
        """The loopback port of the forwarder to `address`'s `service`, when that member
        does not answer directly and a relay is up; None: connect to it directly."""
        if address == self.address or self.endpoint is None or self._loop is None or not self.connected.is_set():
            return None
        answered = self._direct.get(address)
        if answered is None or answered[1] == 0.0:  # not tried yet (0.0: known, its try to come)
            if answered is None:
                self._direct[address] = (True, 0.0)  # directly, while it is tried
            elif not wait:
                return None  # the probe loop tries it
            probe = asyncio.run_coroutine_threadsafe(self._probe(address), self._loop)
            if not wait:
                return None
            try:
                probe.result(timeout=PROBE_TIMEOUT_S + 2)
            except Exception:  # noqa: BLE001 - a probe that did not finish: as if it answered
                return None
            answered = self._direct[address]
        if answered[0]:
            return None
        with self._routed_lock:
            port = self._forwarders.get((address, service))
        if port is None:
            future = asyncio.run_coroutine_threadsafe(self._forwarder(address, service), self._loop)
            port = future.result(timeout=5)
        return port

    async def _probe(self, address: str) -> None:
        host, port = parse_address(address)
        try:
            _r, w = await asyncio.wait_for(asyncio.open_connection(host, port), PROBE_TIMEOUT_S)
            w.close()
            ok = True
        except (OSError, asyncio.TimeoutError):
            ok = False
        before = self._direct.get(address, (None, 0.0))[0]
        self._direct[address] = (ok, time.monotonic())
        if before is not None and before != ok:
            log.info("directlink: the member at %s %s", address,
                     "answers directly again" if ok else "does not answer directly: reached through the relay")

    async def _probe_loop(self) -> None:
        """Every member's address is tried now and then, those in the replicated state
        too, so that a first request to one knows which way to go."""
        while True:
            now = time.monotonic()
            for address in self._member_addresses():
                if address != self.address and address not in self._direct:
                    self._direct[address] = (True, 0.0)
            due = [address for address, (_ok, at) in list(self._direct.items()) if now - at >= PROBE_EVERY_S]
            at_once = asyncio.Semaphore(PROBES_AT_ONCE)

            async def probe(address: str) -> None:
                async with at_once:
                    await self._probe(address)
            await asyncio.gather(*(probe(a) for a in due))  # a silent member costs its timeout once, not each
            await asyncio.sleep(1.0)

    def _member_addresses(self) -> list[str]:
        peers = [advertised(p) for p in self.config.PEERS]
        member = self.member
        if member is None:
            return peers
        with member.store.lock:
            known = [n.address for n in member.store.machine.nodes.values() if n.address]
        return peers + [advertised(a) for a in known]

    async def _forwarder(self, address: str, service: str) -> int:
        with self._routed_lock:
            port = self._forwarders.get((address, service))
            if port is not None:
                return port
        peer = self.member_id(address)

        async def carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                ep = self.endpoint
                if ep is None:
                    raise SessionError("no relay connection")
                session = await ep.dial(peer, timeout_s=10)
                stream = await open_service(session, service)
            except (SessionError, ServiceRefused) as e:
                log.warning("directlink: cannot reach the member at %s (%s): %s", address, service, e)
                writer.close()
                return
            await pipe(stream, reader, writer)

        server = await asyncio.start_server(carry, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        with self._routed_lock:
            self._forwarders[(address, service)] = port
        log.info("directlink: %s of the member at %s through 127.0.0.1:%d", service, address, port)
        return port

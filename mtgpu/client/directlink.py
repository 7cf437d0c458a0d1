"""A tenant's client side of DirectLink (docs/DIRECTLINK.md): a session to a member
through the cluster's relay (direct when the NATs allow), and the byte pipe that
`remotegpu-cli proxy` gives ssh as its ProxyCommand.

What it needs comes from the cluster (GET /v1/directlink, fetched at `join` and by
`ssh-config`) and is kept in the server's entry of servers.json: the relays, a
credential for the tenant's key, and each member's id and sshd host key. Only the
standard library's threads and asyncio are used for the pipe (no Unix-only calls), so
it runs on Windows and macOS too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path

from ..directlink import noise
from ..directlink.endpoint import Endpoint
from ..directlink.frames import FrameError
from ..directlink.identity import Credential, endpoint_id, invite_code_hash, invite_key
from ..directlink.relay_client import RelayConnection, RelayRefused
from ..directlink.services import ServiceRefused, open_service
from ..directlink.session import SessionError
from .errors import ClientError
from .signing import load_private_key

INVITATION_PREFIX = "mtgpu-invite-"  # as server/api/tenants.py writes it


def node_of(info: dict, name: str) -> dict:
    for n in info.get("nodes", []):
        if name in (n["name"], f"{n['name']}.{info.get('cluster_id')}"):
            return n
    have = ", ".join(n["name"] for n in info.get("nodes", [])) or "none"
    raise ClientError(f"no node {name!r} reachable through DirectLink in {info.get('cluster_id')!r} (nodes: {have}); "
                      "`remotegpu-cli ssh-config` fetches the list again")


def check_usable(info: dict | None, where: str) -> dict:
    if not info or not info.get("enabled"):
        raise ClientError(f"{where} has no DirectLink relay (its [DIRECTLINK] relays is empty): reach it directly")
    cred = Credential.from_dict(info["credential"])
    if cred.expires < time.time():
        raise ClientError(f"your DirectLink credential for {cred.cluster} expired: run `remotegpu-cli ssh-config` "
                          "where a node is reachable to get a new one")
    return info


RELAY_WAIT_S = 60.0   # a new session waits this long for a relay that does not answer (one restarting)
RELAY_RETRY_S = 1.0   # ... asking it again this often


async def connect(info: dict, key_path: Path | None, node: str, say=lambda text: None, key=None,
                  wait_s: float | None = None):
    """(endpoint, session) with `node`, through the first relay that admits this key
    (the one at `key_path`, or `key` itself: an invitation's). When no relay answers (one
    restarting), waits for one up to `wait_s` (None: RELAY_WAIT_S; 0: no wait), said once:
    sessions on the direct path outlive their relay, new ones need it."""
    key = key if key is not None else load_private_key(key_path)
    target = node_of(info, node)
    cred = Credential.from_dict(info["credential"])
    if cred.id != endpoint_id(key):
        raise ClientError(f"the stored DirectLink credential is for another key than {key_path}: "
                          "run `remotegpu-cli ssh-config` again")
    relays = info.get("relays", [])
    bound_s = RELAY_WAIT_S if wait_s is None else wait_s
    end = time.monotonic() + bound_s
    waited = False
    while True:
        problems, silent = [], []
        for address in relays:
            try:
                ep, session = await _through(address, key, cred, target)
            except (OSError, asyncio.TimeoutError, EOFError) as e:  # no answer: down, restarting, unreachable
                silent.append(address)
                problems.append(f"{address}: {e or type(e).__name__}")
                continue
            except (RelayRefused, ValueError, FrameError) as e:  # it answered no: final
                problems.append(f"{address}: {e or type(e).__name__}")
                continue
            except SessionError as e:  # the relay answered; the node did not (yet: it may be reconnecting)
                problems.append(f"{address}: {e}")
                if waited:
                    silent.append(address)
                continue
            say(f"remotegpu: {target['name']} through the relay {address}")
            return ep, session
        if not silent or time.monotonic() + RELAY_RETRY_S > end:
            break
        if not waited:
            waited = True
            which = (f"the relay {silent[0]} is" if len(silent) == 1 else
                     f"the relays {', '.join(silent)} are")
            say(f"remotegpu: {which} not answering; waiting for it (up to {bound_s:g} s)...")
        await asyncio.sleep(RELAY_RETRY_S)
    if waited:
        raise ClientError(f"cannot reach {node} through DirectLink: no relay answered within {bound_s:g} s ("
                          + "; ".join(problems) + "). New sessions need the relay (open ones on the direct path "
                          f"go on without it): ask the admin of {info.get('cluster_id')!r} to start it "
                          "(mtgpu-relay), or check that this network reaches it")
    raise ClientError(f"cannot reach {node} through DirectLink: " + ("; ".join(problems) or "no relay listed"))


async def _through(address: str, key, cred: Credential, target: dict):
    """(endpoint, session) with `target` through the relay at `address` (raises why not)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    ip = (await asyncio.get_running_loop().getaddrinfo(host, int(port), type=socket.SOCK_STREAM))[0][4][0]
    relay = await RelayConnection.open(ip, int(port), key, cred)
    ep = Endpoint(key, relay)
    try:
        await ep.enable_direct((ip, int(port)))
    except OSError:
        pass  # relayed only
    try:
        return ep, await ep.dial(target["id"], timeout_s=20)
    except SessionError:
        await close_endpoint(ep)
        raise


async def close_endpoint(ep: Endpoint, timeout_s: float = 2.0) -> None:
    """Close an endpoint, not waiting longer than `timeout_s` for a relay that does not answer."""
    try:
        await asyncio.wait_for(ep.close(), timeout_s)
    except Exception:  # noqa: BLE001 - leaving anyway
        pass


def _stdin_reader(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
    fd = sys.stdin.fileno()
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            data = b""
        try:
            loop.call_soon_threadsafe(queue.put_nowait, data)
        except RuntimeError:  # the pipe ended and its loop is closed: nothing left to give it to
            return
        if not data:
            return


async def proxy(info: dict, key_path: Path, node: str, svc: str = "ssh", quiet: bool = False) -> int:
    """Pipe stdin/stdout to `svc` on `node` until either side ends. Says on stderr which
    path carries it (relayed, then direct when it moves)."""

    def say(text: str) -> None:
        if not quiet:
            print(text, file=sys.stderr, flush=True)

    noise.install(asyncio.get_running_loop(), logging.DEBUG)  # nothing of asyncio's reaches ssh's terminal
    ep, session = await connect(info, key_path, node, say)
    try:
        stream = await open_service(session, svc)
    except (ServiceRefused, SessionError) as e:
        await close_endpoint(ep)
        raise ClientError(f"{node} did not open {svc}: {e}") from None
    loop = asyncio.get_running_loop()
    incoming: asyncio.Queue[bytes] = asyncio.Queue()
    threading.Thread(target=_stdin_reader, args=(loop, incoming), daemon=True).start()
    out = sys.stdout.buffer

    async def up() -> None:
        while data := await incoming.get():
            stream.write(data)
            await stream.drain()
        stream.end()

    async def down() -> None:
        while data := await stream.read():
            await loop.run_in_executor(None, lambda d=data: (out.write(d), out.flush()))

    async def watch() -> None:
        last = session.path
        say(f"remotegpu: path {last}")
        while True:
            await asyncio.sleep(0.2)
            if session.path != last:
                last = session.path
                say(f"remotegpu: path {last}")

    watcher = asyncio.ensure_future(watch())
    sender = asyncio.ensure_future(up())
    try:
        await down()  # the node ended the stream (ssh closed)
    except SessionError as e:
        say(f"remotegpu: the session with {node} ended: {e}")
        return 1
    finally:
        watcher.cancel()
        sender.cancel()
        await close_endpoint(ep)
    return 0


class Tunnel:
    """A loopback TCP port whose connections reach a node's `svc` (its API) through one
    DirectLink session, served by a thread of its own: the client's HTTP code stays as
    it is and talks to 127.0.0.1. `close()` ends it within a bound, whatever the peer
    does: the open connections are cut, the endpoint closed (or left), the loop ended."""

    CLOSE_S = 4.0

    def __init__(self, info: dict, key_path: Path | None, node: str, svc: str = "api", key=None) -> None:
        self.info, self.key_path, self.node, self.svc, self.key = info, key_path, node, svc, key
        self.address: tuple[str, int] | None = None
        self.session = None
        self._endpoint: Endpoint | None = None
        self._server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: Exception | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._closing = False
        self._redial: asyncio.Lock | None = None
        self.last_error = ""  # why the last connection could not be served ("" while all were)
        self.redials = 0      # sessions dialled again after one ended or stopped answering
        self.dial_s = 0.0     # how long the first session took to open (relay, node, handshake)

    @property
    def path(self) -> str:
        """The path the session uses now: "direct", "relay", or "none" (not open)."""
        return self.session.path if self.session is not None else "none"

    @property
    def label(self) -> str:
        """The path in the words the client shows: "p2p" or "relayed"."""
        return "p2p" if self.path == "direct" else "relayed"

    SETTLE_S = (2.0, 10.0)  # the direct path's time to come up: at least, at most
    SETTLE_DIALS = 4        # ... or this many times the dial took, between the two

    def settle(self, timeout_s: float | None = None) -> str:
        """The path in use once the direct path had `timeout_s` to come up (it takes a few
        hundred ms where the NATs allow it; no wait where this endpoint has no UDP). None:
        SETTLE_DIALS times as long as the dial took, within SETTLE_S: its offer, the peer's
        punch and the probes' answers are a few round trips through the same relay and
        peer, and on a loaded machine (the peer's or this one) a fixed 2 s left every
        command of a CI run on the relay although the direct path came up each time."""
        ep = self._endpoint
        if ep is None or ep.udp is None or not ep.public:
            return self.path
        if timeout_s is None:
            low, high = self.SETTLE_S
            timeout_s = min(high, max(low, self.SETTLE_DIALS * self.dial_s))
        end = time.monotonic() + timeout_s
        while self.path != "direct" and time.monotonic() < end and not self._closing:
            time.sleep(0.05)
        return self.path

    def start(self, timeout_s: float = 40.0) -> tuple[str, int]:
        self._thread = threading.Thread(target=self._run, name="remotegpu-tunnel", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            self.close()
            raise ClientError(f"no DirectLink session with {self.node} within {timeout_s:g}s")
        if self._error is not None:
            raise self._error
        return self.address

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        noise.install(loop, logging.DEBUG)  # nothing of asyncio's reaches the user's terminal
        try:
            loop.run_until_complete(self._open())
        except Exception as e:  # noqa: BLE001 - given to the caller of start()
            self._error = e if isinstance(e, ClientError) else ClientError(f"DirectLink: {e}")
        self._ready.set()
        try:
            if self._error is None:
                loop.run_forever()
        finally:
            try:
                loop.run_until_complete(self._shut())
            finally:
                loop.close()

    async def _open(self) -> None:
        from ..directlink.services import pipe
        self._redial = asyncio.Lock()
        began = time.monotonic()
        self._endpoint, self.session = await connect(self.info, self.key_path, self.node, key=self.key, wait_s=0)
        self.dial_s = time.monotonic() - began

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._writers.add(writer)
            try:
                stream = await self._stream()
                if stream is None:
                    writer.close()
                    return
                await pipe(stream, reader, writer)
            finally:
                self._writers.discard(writer)

        self._server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.address = self._server.sockets[0].getsockname()[:2]

    async def _stream(self):
        """A stream to the node's service for one connection, or None (the reason in
        `last_error`). A session that ended (the member restarted, the relay dropped it, a
        path timed out) or that no longer answers is dialled again once, so a tunnel that
        stays open (the VS Code extension's) outlives it; a refusal by the node is final."""
        session = self.session
        for attempt in (1, 2):
            try:
                if not session.closed.is_set():
                    stream = await open_service(session, self.svc)
                    self.last_error = ""
                    return stream
                self.last_error = f"the session had ended: {session.why}"
            except ServiceRefused as e:
                self.last_error = f"{self.node} refused {self.svc}: {e}"
                if not str(e).startswith("the node did not answer") and not session.closed.is_set():
                    return None  # the node said no: a new session would hear the same
            except SessionError as e:
                self.last_error = f"the session ended: {e}"
            if attempt == 2 or self._closing:
                return None
            session = await self._dial_again(session)
            if session is None:
                return None
        return None

    async def _dial_again(self, broken):
        """A new session in place of `broken` (one dial for all the connections that saw it
        fail), or None with the reason in `last_error`."""
        async with self._redial:
            if self.session is not broken and not self.session.closed.is_set():
                return self.session  # another connection dialled already
            old = self._endpoint
            try:
                self._endpoint, self.session = await connect(self.info, self.key_path, self.node, key=self.key,
                                                             wait_s=0)
            except (ClientError, OSError, asyncio.TimeoutError) as e:
                self.last_error += f"; dialling again failed: {e}"
                return None
            self.redials += 1
            if old is not None:
                asyncio.ensure_future(close_endpoint(old))
            return self.session

    async def _shut(self) -> None:
        """Stop taking connections, cut the open ones, close the endpoint (bounded: a peer
        or relay that does not answer is not waited for) and end every task left."""
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        if self._endpoint is not None:
            try:
                await asyncio.wait_for(self._endpoint.close(), self.CLOSE_S / 2)
            except (asyncio.TimeoutError, OSError, SessionError, Exception):  # noqa: BLE001 - leaving anyway
                pass
        await noise.cancel_rest(self.CLOSE_S / 4)

    def close(self) -> None:
        """End the tunnel and wait for it, at most CLOSE_S seconds (its thread is a daemon:
        a process that leaves meanwhile is not held)."""
        self._closing = True
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or thread is threading.current_thread():
            return
        try:
            loop.call_soon_threadsafe(loop.stop)  # _run then shuts everything down
        except RuntimeError:
            pass  # already closed
        thread.join(2 * self.CLOSE_S)  # its waits are bounded (CLOSE_S in all); this is slack for a busy machine


def parse_invitation(text: str) -> dict | None:
    """An invitation (`mtgpu-admin tenant invite` prints it: the code, the node's LISTEN
    and, with DirectLink, its relays, id and a credential for the invitation's key), or
    None for a bare code."""
    import base64
    import json
    text = text.strip()
    if not text.startswith(INVITATION_PREFIX):
        return None
    raw = text[len(INVITATION_PREFIX):]
    try:
        doc = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        if not isinstance(doc, dict) or not isinstance(doc.get("code"), str) or not doc.get("server"):
            raise ValueError("no code or server in it")
    except ValueError as e:
        raise ClientError(f"this invitation cannot be read ({e}): copy it whole, as `mtgpu-admin tenant invite` "
                          "printed it, or give the bare code with --server HOST:PORT") from None
    return doc


def join_through_relay(invitation: dict, public: str, key_path: Path) -> tuple[dict, dict]:
    """Redeem the invitation's code through the cluster's relay (the node does not answer
    directly: it is behind NAT), as the invitation's own key, which the member admits to
    its API until the code is used; then fetch this key's DirectLink details the same way
    (signed with it, now a tenant's key). (the join's answer, the DirectLink details)."""
    from .remote import RemoteClient
    d = invitation["directlink"]
    code = invitation["code"]
    info = {"enabled": True, "cluster_id": d["cluster_id"], "relays": d["relays"], "credential": d["credential"],
            "nodes": [{"name": invitation["node"], "id": d["node_id"], "ssh_host_key": ""}]}
    check_usable(info, "the invitation")
    tunnel = Tunnel(info, None, invitation["node"], key=invite_key(invite_code_hash(code)))
    host, port = tunnel.start()
    try:
        with RemoteClient(f"{host}:{port}") as c:
            answer = c.join(code, public)
        with RemoteClient(f"{host}:{port}", answer["name"], key_path) as c:
            details = c.directlink(endpoint_id(load_private_key(key_path)))
    finally:
        tunnel.close()
    return answer, details


def reachable(server: str, timeout_s: float = 2.0) -> bool:
    """Whether a TCP connection to HOST:PORT opens now (else DirectLink is tried)."""
    host, _, port = server.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False

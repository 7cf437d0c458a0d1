"""pysyncobj's TCP transport with three changes.

Where it connects to reach a node: nodes keep their addresses (a member's Raft address is
its identity in the cluster), but a `route(address)` may answer another (host, port) to
connect to instead: a loopback port whose connections DirectLink carries to that member
through a relay (server/member/directlink.py), when the member cannot be reached directly.

Keepalives: pysyncobj drops a connection on which nothing was read for `connectionTimeout`,
and finds that out only when it next sends on it. Two followers exchange nothing while a
leader lives, so their connection lapsed every few seconds, and a follower standing for
election lost its vote request to the lapsed connection (it was dropped instead of sent):
the election failed and the next came a timeout later, about a second after the leader's
death. Every connection to a voter now carries a small message at least every
KEEPALIVE_S, which the receiving transport drops.

A hook (`on_peer_lost`) for a connection to a member that ended (raft_hasten.py).

A Raft port that cannot be bound is said: pysyncobj tries again every second without a
word, and a voter that never binds never stands for election, so a port taken by another
process left a one-member cluster with no leader and its first command timing out with
"no quorum reachable?". Now the first failed bind (and one a minute after it) is logged
as an error naming the address, and `bind_problem` holds it until the bind succeeds
(raft.py adds it to a command that timed out, and to the member's Raft facts)."""

from __future__ import annotations

import logging
from typing import Callable

import socket

from pysyncobj.monotonic import monotonic
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

log = logging.getLogger(__name__)

Route = Callable[[str], "tuple[str, int] | None"]

# A message of a type pysyncobj does not know: a member of an older version, which does not
# drop it in its transport, ignores it (pysyncobj acts on the types it knows only).
KEEPALIVE = {"type": "mtgpu_keepalive"}
KEEPALIVE_S = 0.6  # pysyncobj drops a connection silent for connectionTimeout (2 s, raft.py)
BIND_LOG_EVERY_S = 60.0  # a Raft port that stays taken is said again this often


def bind_error(address: str) -> str:
    """Why `address` (host:port) cannot be bound now, as pysyncobj binds it (SO_REUSEADDR);
    "" when it can."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, int(port)))
    except (OSError, ValueError) as e:
        return getattr(e, "strerror", None) or str(e)
    return ""


def routed_transport(route: Route | None, on_peer_lost: Callable | None = None) -> type[TCPTransport]:
    """The transport class; `route` None connects to every member's own address.
    `on_peer_lost(node)` is called (on pysyncobj's thread) when a connection to a
    member ends (raft_hasten.py), unless that member is reached through a route."""

    def routed(node) -> "tuple[str, int] | None":
        if route is None:
            return None
        try:
            return route(node.address)
        except Exception:  # noqa: BLE001 - a route that fails must not stop Raft: connect directly
            return None

    class RoutedTransport(TCPTransport):
        bind_problem = ""  # why the Raft port could not be bound, until it is

        def _maybeBind(self):
            tried = self._lastBindAttemptTime
            super()._maybeBind()
            if self._ready:
                if self.bind_problem:
                    log.info("the Raft port %s is bound now", self._bind_address())
                    self.bind_problem = ""
                return
            if self._lastBindAttemptTime == tried:  # no attempt this time (retried every second)
                return
            now = monotonic()
            said = self.__dict__.get("_mtgpu_bind_said", 0.0)
            if self.bind_problem and now - said < BIND_LOG_EVERY_S:
                return
            self.__dict__["_mtgpu_bind_said"] = now
            address = self._bind_address()
            why = bind_error(address) or "the bind failed"
            self.bind_problem = (f"this member cannot bind its Raft port {address} ({why}): until it can, it "
                                 "neither votes nor leads; stop the process that holds the port, or give this "
                                 "member another LISTEN port (its Raft port is the next one)")
            log.error("%s", self.bind_problem)

        def _bind_address(self) -> str:
            """What pysyncobj binds: every interface (0.0.0.0 or ::) at the member's Raft port."""
            server = self._server
            host, port = getattr(server, "_TcpServer__host", "?"), getattr(server, "_TcpServer__port", "?")
            return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"

        def send(self, node, message):
            self._sent_at()[node] = monotonic()
            return super().send(node, message)

        def _sent_at(self) -> dict:
            sent = self.__dict__.get("_mtgpu_sent_at")
            if sent is None:
                sent = self.__dict__["_mtgpu_sent_at"] = {}
            return sent

        def _onTick(self):
            super()._onTick()
            now, sent = monotonic(), self._sent_at()
            for node in list(self._nodes):
                if now - sent.get(node, 0.0) >= KEEPALIVE_S and node in self._connections:
                    self.send(node, KEEPALIVE)

        def _onMessageReceived(self, node, message):
            if isinstance(message, dict) and message.get("type") == KEEPALIVE["type"]:  # nothing for Raft
                return
            super()._onMessageReceived(node, message)

        def _onNodeDisconnected(self, node):
            super()._onNodeDisconnected(node)
            if on_peer_lost is not None and routed(node) is None:
                try:
                    on_peer_lost(node)
                except Exception:  # noqa: BLE001 - never let a hook break the Raft thread
                    log.exception("the hook for a lost Raft connection failed")

        def _connectIfNecessarySingle(self, node):
            # pysyncobj 0.3's own logic, but for the address connected to.
            if node in self._connections and self._connections[node].state != CONNECTION_STATE.DISCONNECTED:
                return True
            if not self._shouldConnect(node):
                return False
            last = self._lastConnectAttempt.get(node)
            if last is not None and monotonic() - last < self._syncObj.conf.connectionRetryTime:
                return False
            self._lastConnectAttempt[node] = monotonic()
            target = routed(node)
            host, port = target if target else (node.ip, node.port)
            return self._connections[node].connect(host, port)

    return RoutedTransport

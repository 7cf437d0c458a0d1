"""pysyncobj's TCP transport with one change: where it connects to reach a node. Nodes
keep their addresses (a member's Raft address is its identity in the cluster), but a
`route(address)` may answer another (host, port) to connect to instead: a loopback
port whose connections DirectLink carries to that member through a relay
(server/member/directlink.py), when the member cannot be reached directly."""

from __future__ import annotations

from typing import Callable

from pysyncobj.monotonic import monotonic
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

Route = Callable[[str], "tuple[str, int] | None"]


def routed_transport(route: Route) -> type[TCPTransport]:
    class RoutedTransport(TCPTransport):
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
            try:
                target = route(node.address)
            except Exception:  # noqa: BLE001 - a route that fails must not stop Raft: connect directly
                target = None
            host, port = target if target else (node.ip, node.port)
            return self._connections[node].connect(host, port)

    return RoutedTransport

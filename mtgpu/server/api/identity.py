"""Who is calling: the kernel says, through the Unix socket's peer credentials.

Tenants on a node are identified by SO_PEERCRED, so they need no token and no
password. The uvicorn protocol below records the peer of each connection in the
per-connection ASGI `state`, where routes read it as `request.state.peer`.
"""

from __future__ import annotations

import grp
import pwd
import socket
import struct
from dataclasses import dataclass

from uvicorn.protocols.http.h11_impl import H11Protocol

try:  # the C parser, when installed, costs a fraction of h11's pure-Python parsing
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools is a declared dependency
    HttpToolsProtocol = None


@dataclass(frozen=True, slots=True)
class Caller:
    uid: int
    gid: int
    pid: int
    name: str
    is_admin: bool

    @property
    def tenant(self) -> str:
        return self.name


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", raw)


def _with_peer(protocol, transport) -> None:
    sock = transport.get_extra_info("socket")
    peer = None
    if sock is not None and sock.family == socket.AF_UNIX:
        try:
            peer = peer_credentials(sock)
        except OSError:
            peer = None
    # app_state is copied into every request's scope["state"]; make it per connection.
    protocol.app_state = {**protocol.app_state, "peer": peer, "memo": {}}


class H11PeerCredProtocol(H11Protocol):
    """uvicorn's h11 protocol, plus the peer's credentials in the request state."""

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        _with_peer(self, transport)


if HttpToolsProtocol is not None:

    class HttpToolsPeerCredProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol, plus the peer's credentials in the request state."""

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            _with_peer(self, transport)

    PeerCredProtocol = HttpToolsPeerCredProtocol
else:  # pragma: no cover
    PeerCredProtocol = H11PeerCredProtocol

def caller_from_peer(peer: tuple[int, int, int] | None, admin_group: str, memo: dict | None = None) -> Caller | None:
    """Who is calling. `memo` is the connection's own dict: the name and admin
    membership are looked up once per connection, not once per request."""
    if peer is None:
        return None
    if memo is not None and "caller" in memo:
        return memo["caller"]
    caller = _lookup_caller(*peer, admin_group)
    if memo is not None:
        memo["caller"] = caller
    return caller


def _lookup_caller(pid: int, uid: int, gid: int, admin_group: str) -> Caller:
    try:
        pw = pwd.getpwuid(uid)
        name = pw.pw_name
    except KeyError:
        pw, name = None, f"uid{uid}"
    return Caller(uid=uid, gid=gid, pid=pid, name=name, is_admin=uid == 0 or _in_group(uid, name, gid, admin_group))


def _in_group(uid: int, name: str, gid: int, group: str) -> bool:
    try:
        g = grp.getgrnam(group)
    except KeyError:
        return False
    return g.gr_gid == gid or name in g.gr_mem

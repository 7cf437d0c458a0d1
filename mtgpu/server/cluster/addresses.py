"""Member addresses. Each member serves clients and members on LISTEN (host:port)
and Raft on host:(port+1); PEERS lists LISTEN addresses."""

from __future__ import annotations

import socket


def advertised(address: str) -> str:
    host, port = address.rsplit(":", 1)
    if host in ("0.0.0.0", "", "::", "[::]"):
        host = socket.gethostbyname(socket.gethostname())
    return f"{host}:{port}"


def raft_address(listen: str) -> str:
    host, port = advertised(listen).rsplit(":", 1)
    return f"{host}:{int(port) + 1}"


def api_address(raft: str) -> str:
    host, port = raft.rsplit(":", 1)
    return f"{host}:{int(port) - 1}"

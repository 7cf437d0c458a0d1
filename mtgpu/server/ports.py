"""The ports a node listens on, taken before anything else starts: a port in use stops
the start with one line naming the port, what holds it and the rule, before the node
announces itself or joins the Raft group.

- LISTEN (the API for clients and members): bound here and handed to the server, so no
  one can take it between the check and the serving.
- LISTEN's port + 1 (Raft, cluster mode): checked here (pysyncobj binds it itself).
- SSH_LISTEN (the tenant sshd): checked here, unless this node's own sshd, left running
  by an earlier server process, holds it (the accounts agent restarts that one).
"""

from __future__ import annotations

import socket
from pathlib import Path

import psutil

from .cluster.errors import ClusterSetupError


class PortTaken(ClusterSetupError):
    """A port this node must listen on is in use; the message names it, its holder and the rule."""


def tcp_connections() -> list:
    """psutil's table of this machine's TCP sockets (it decodes addresses with
    socket.inet_ntop, which state/raft.py puts back after pysyncobj replaced it)."""
    return psutil.net_connections(kind="tcp")


def one_line(text: str) -> str:
    """A command line for a one-line message: its arguments' newlines, tabs, NULs and other
    control characters (from /proc/PID/cmdline, where any byte but NUL may be in an
    argument) as single spaces, trimmed."""
    return " ".join("".join(" " if ch < " " or ch == "\x7f" else ch for ch in text).split())


def holder_of(port: int) -> tuple[int, str] | None:
    """(pid, command line) of a process listening on TCP `port` on this machine, if one is
    found. None also when the socket's owner cannot be seen (another user's process, to a
    process that is not root) or psutil is refused the table: the caller then says
    "another process" with the bind's own error."""
    try:
        conns = tcp_connections()
    except (psutil.Error, OSError):
        return None
    pids = sorted({c.pid for c in conns
                   if c.pid and c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port})
    for pid in pids:
        try:
            p = psutil.Process(pid)
            try:
                cmd = one_line(" ".join(p.cmdline()))
            except psutil.AccessDenied:
                cmd = ""
            return pid, (cmd or one_line(p.name()))[:200]
        except psutil.Error:
            continue
    return None


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers themselves bind
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _taken(key: str, value: str, port: int, e: OSError, rule: str) -> PortTaken:
    held = holder_of(port)
    who = f"process {held[0]} ({held[1]})" if held else f"another process ({e.strerror})"
    return PortTaken(f"{key} = {value!r}: port {port} is in use by {who}; {rule}")


def take_ports(config) -> socket.socket:
    """Check every port before the node starts; returns LISTEN's socket, bound, for the API."""
    host, port = config.listen_host_port()
    try:
        public = _bind(host, port)
    except OSError as e:
        raise _taken("LISTEN", config.LISTEN, port, e, "stop that process or give this node another LISTEN "
                     "(in cluster mode its port + 1 must be free too, for Raft)") from None
    try:
        if config.CLUSTER_MODE == "cluster":
            try:
                _bind(host, port + 1).close()
            except OSError as e:
                raise _taken("LISTEN", config.LISTEN, port + 1, e, f"Raft listens on LISTEN's port + 1 ({port + 1}); "
                             "stop that process or give this node another LISTEN") from None
        ssh_host, ssh_port = config.ssh_listen_host_port()
        try:
            _bind(ssh_host, ssh_port).close()
        except OSError as e:
            held = holder_of(ssh_port)
            own = str(Path(config.STATE_DIR) / "ssh" / "sshd_config")
            if held is None or own not in held[1]:
                raise _taken("SSH_LISTEN", config.SSH_LISTEN, ssh_port, e, "tenants' SSH logins need it: stop that "
                             "process or give this node another SSH_LISTEN") from None
    except PortTaken:
        public.close()
        raise
    return public

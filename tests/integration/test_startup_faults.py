"""Start-up faults (issue 12): a port the node must listen on is in use. The start stops
before the node announces itself or joins a Raft group, with one line that names the
port, the process that holds it and the rule."""

from __future__ import annotations

import os
import socket

import pytest

from tests.support.cluster import running_cluster
from tests.support.node import free_port, running_node


@pytest.fixture()
def squatter():
    """A listening socket of this test's process, on a free port."""
    port = free_port()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    try:
        yield port
    finally:
        s.close()


def refused_start(node) -> str:
    """Start the node, expect it to exit with status 2; the output of that start."""
    node.start(wait=False)
    assert node.proc.wait(timeout=60) == 2, node.server_log()
    return node.log_files[-1].read_text(errors="replace")


def test_a_taken_listen_port_stops_the_start_naming_the_port_and_its_holder(squatter):
    with running_node([], start=False, LISTEN=f"127.0.0.1:{squatter}") as node:
        log = refused_start(node)
    line = f"LISTEN = '127.0.0.1:{squatter}': port {squatter} is in use by process {os.getpid()}"
    assert line in log and "stop that process or give this node another LISTEN" in log, log
    assert "serving on" not in log and "Traceback" not in log, log


def test_a_taken_ssh_port_stops_the_start(squatter):
    with running_node([], start=False, SSH_LISTEN=f"127.0.0.1:{squatter}") as node:
        log = refused_start(node)
    assert f"SSH_LISTEN = '127.0.0.1:{squatter}': port {squatter} is in use by process {os.getpid()}" in log, log
    assert "serving on" not in log and "Traceback" not in log, log


def test_a_taken_raft_port_stops_a_member_before_it_joins():
    with running_cluster(1) as cl:
        member = cl.members[0]
        member.terminate()
        raft_port = member.port + 1
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", raft_port))
            s.listen()
            log = refused_start(member)
    assert f"port {raft_port} is in use by process {os.getpid()}" in log, log
    assert "Raft listens on LISTEN's port + 1" in log and "serving on" not in log, log

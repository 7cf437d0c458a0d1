"""A tenant's client through DirectLink on one real member that serves the relay itself
(on loopback), its LISTEN made unreachable in servers.json (issue 26):

- Ctrl-C ends a command that keeps a DirectLink forward (`dashboard`) promptly and
  cleanly, also while a forwarded connection is open and the member does not answer at
  all (stopped): the tunnel cuts its connections and gives up on the endpoint within a
  bound, and nothing of asyncio's (a traceback, "Task was destroyed") reaches stderr.
  In a process that lives on (the terminal app opens a tunnel per refresh), `close()`
  returns with the tunnel ended: its thread gone, its forwarded connection closed.
- The path an API command says it uses is the one in use: on loopback the direct path
  comes up, and the command says "p2p", as `servers --live` does (it said "relayed"
  always, taken before the direct path had a moment to come up).
- A tunnel that stays open (the VS Code extension keeps one) outlives its session: the
  member restarts, the session ends, and the next connection through the same tunnel is
  answered by a session dialled again.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from mtgpu.client.directlink import Tunnel
from tests.support.laptop import (joined_behind_directlink, node_serving_its_relay, printed_link, remotegpu,
                                  running_dashboard)
from tests.support.node import wait_for
from tests.support.users import can_create_users, stop_node_and_remove_tenants

if can_create_users():
    pytest.skip(can_create_users(), allow_module_level=True)

UID_RANGE = (420000, 424999)  # its own: the accounts this node makes never meet another test's
NOISE = ("Traceback", "Task was destroyed", "never retrieved", "Exception ignored")


def test_ctrl_c_ends_a_directlink_forward_promptly_with_a_connection_open_and_the_member_stopped(tmp_path):
    name = f"dc{os.getpid() % 10000}"
    home = tmp_path / "laptop"
    with node_serving_its_relay("node-dc", "lab-dl-client", UID_RANGE) as node:
        proc, stopped, conn = None, False, None
        try:
            joined_behind_directlink(node, name, home)
            proc = running_dashboard(home)
            url = printed_link(proc)
            assert url.startswith("http://127.0.0.1:") and "/dashboard?token=" in url, url
            host, port = url.split("/")[2].split(":")
            # A connection through the forward, its request half sent: the member is then
            # stopped, so it never answers and the session hears nothing more.
            conn = socket.create_connection((host, int(port)), timeout=20)
            conn.sendall(b"GET /v1/info HTTP/1.1\r\nHost: x\r\n")
            time.sleep(1.0)  # the tunnel opened its stream for it
            os.kill(node.proc.pid, signal.SIGSTOP)
            stopped = True
            proc.send_signal(signal.SIGINT)  # Ctrl-C
            try:
                _, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate(timeout=10)
                raise AssertionError(f"remotegpu-cli dashboard did not end within 30 s of Ctrl-C:\n{err}") from None
            assert proc.returncode == 0, err
            assert "through DirectLink to node-dc" in err and "Ctrl-C ends it" in err, err
            assert not [w for w in NOISE if w in err], err
        finally:
            if conn is not None:
                conn.close()
            if stopped:
                os.kill(node.proc.pid, signal.SIGCONT)
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            stop_node_and_remove_tenants(node, [name], UID_RANGE)


def test_an_api_command_says_the_path_in_use_p2p_when_the_direct_path_is_up(tmp_path):
    name = f"dp{os.getpid() % 10000}"
    home = tmp_path / "laptop"
    with node_serving_its_relay("node-dp", "lab-dl-path", UID_RANGE) as node:
        try:
            joined_behind_directlink(node, name, home)
            said = []

            def p2p() -> bool:  # each try is a new session: its path comes up within a moment
                r = remotegpu(home, "whoami", "--json")
                assert r.returncode == 0 and json.loads(r.stdout)["name"] == name, r.stderr
                assert not [w for w in NOISE if w in r.stderr], r.stderr
                said.append(r.stderr.strip())
                return "through DirectLink to node-dp (p2p)" in r.stderr
            try:
                wait_for("a command that says p2p", p2p, timeout_s=90, interval_s=0.5)
            except AssertionError:
                raise AssertionError(f"never p2p; the commands said: {said}") from None
            seen = []

            def live_p2p() -> bool:  # a server slower than the live view's bound (5 s) is listed as unreachable
                r = remotegpu(home, "servers", "--live", "--json")
                if r.returncode != 0:
                    seen.append(r.stderr.strip()[-300:])
                    return False
                view = json.loads(r.stdout)[0]
                seen.append(view["path"])
                # the path it lists is the one its own command line said
                assert f"through DirectLink to node-dp ({view['path']})" in r.stderr, (view, r.stderr)
                return view["path"] == "p2p"
            try:
                wait_for("servers --live to list the node as p2p, as the command said", live_p2p, timeout_s=90,
                         interval_s=1.0)
            except AssertionError as e:
                raise AssertionError(f"{e}; servers --live said: {seen}") from None
        finally:
            stop_node_and_remove_tenants(node, [name], UID_RANGE)


def test_a_tunnel_closed_while_the_member_does_not_answer_has_ended_when_close_returns(tmp_path):
    name = f"dt{os.getpid() % 10000}"
    home = tmp_path / "laptop"
    with node_serving_its_relay("node-dt", "lab-dl-close", UID_RANGE) as node:
        stopped, conn, tunnel = False, None, None
        try:
            joined_behind_directlink(node, name, home)
            entry = json.loads((home / "servers.json").read_text())[0]
            tunnel = Tunnel(entry["directlink"], Path(entry["key"]), entry["node"])
            host, port = tunnel.start()

            def answered():  # the forward answers (a try while the session settles may be cut: try again)
                nonlocal conn
                if conn is not None:
                    conn.close()
                conn = socket.create_connection((host, port), timeout=20)
                conn.sendall(b"GET /v1/info HTTP/1.1\r\nHost: x\r\n\r\n")
                got = b""
                while len(got) < 12 and (part := conn.recv(12 - len(got))):
                    got += part
                return got.startswith(b"HTTP/1.1 200")
            try:
                wait_for("the forward to answer before the member is stopped", answered, timeout_s=60, interval_s=0.5)
            except AssertionError as e:
                raise AssertionError(f"{e}; the tunnel said: {tunnel.last_error!r}\n{node.server_log()}") from None
            os.kill(node.proc.pid, signal.SIGSTOP)  # the member (and the relay it serves) answers nothing now
            stopped = True
            tunnel.close()
            alive = [t.name for t in threading.enumerate() if t.name == "remotegpu-tunnel"]
            assert not alive, "close() returned with the tunnel's thread still running"
            conn.settimeout(20)
            try:
                while conn.recv(65536):  # the rest of the answer, then the end
                    pass
            except ConnectionResetError:
                pass  # cut: as good as closed
        finally:
            if tunnel is not None:
                tunnel.close()
            if conn is not None:
                conn.close()
            if stopped:
                os.kill(node.proc.pid, signal.SIGCONT)
            stop_node_and_remove_tenants(node, [name], UID_RANGE)


def test_a_tunnel_that_stays_open_dials_again_after_the_member_restarts(tmp_path):
    name = f"dr{os.getpid() % 10000}"
    home = tmp_path / "laptop"
    with node_serving_its_relay("node-dr", "lab-dl-redial", UID_RANGE) as node:
        tunnel = None
        try:
            joined_behind_directlink(node, name, home)
            entry = json.loads((home / "servers.json").read_text())[0]
            tunnel = Tunnel(entry["directlink"], Path(entry["key"]), entry["node"])
            host, port = tunnel.start()

            def answered() -> bool:
                with socket.create_connection((host, port), timeout=30) as conn:
                    conn.sendall(b"GET /v1/info HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    got = b""
                    while len(got) < 12 and (part := conn.recv(12 - len(got))):
                        got += part
                    return got.startswith(b"HTTP/1.1 200")

            def why() -> str:
                return f"the tunnel said: {tunnel.last_error!r}\n{node.server_log()}"
            assert wait_for("the forward to answer", answered, timeout_s=60, interval_s=0.5), why()
            first = tunnel.session
            # The member and the relay it serves go; the session with it is stale (the first
            # connection after the restart waits for its stream, up to open_service's 15 s).
            node.terminate()
            node.start(timeout_s=120)
            try:
                wait_for("the same tunnel to answer through a new session", answered, timeout_s=90, interval_s=1.0)
            except AssertionError as e:
                raise AssertionError(f"{e}; {why()}") from None
            assert tunnel.session is not first and tunnel.redials >= 1, (tunnel.redials, why())
            assert first.closed.is_set()
        finally:
            if tunnel is not None:
                tunnel.close()
            stop_node_and_remove_tenants(node, [name], UID_RANGE)

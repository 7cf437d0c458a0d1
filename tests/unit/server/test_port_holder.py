"""The ports a node takes before it starts (server/ports.py): a port in use is named with
the process that holds it, read through psutil from real sockets on the loopback, also
once pysyncobj has replaced socket.inet_ntop (as it does in every server process)."""

import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import psutil
import mtgpu.state.raft  # noqa: F401 (imports pysyncobj, which replaces socket.inet_ntop, as in the server)
import pytest

from mtgpu.server.ports import PortTaken, holder_of, take_ports


def listening() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(listen: int, ssh: int, state_dir: str = "/var/lib/mtgpu", mode: str = "standalone"):
    return SimpleNamespace(LISTEN=f"127.0.0.1:{listen}", SSH_LISTEN=f"127.0.0.1:{ssh}", CLUSTER_MODE=mode,
                           STATE_DIR=state_dir, listen_host_port=lambda: ("127.0.0.1", listen),
                           ssh_listen_host_port=lambda: ("127.0.0.1", ssh))


def test_the_holder_of_a_listening_port_is_this_very_process():
    with listening() as s:
        port = s.getsockname()[1]
        assert holder_of(port) == (os.getpid(), " ".join(psutil.Process().cmdline())[:200])


def test_a_port_nobody_listens_on_has_no_holder():
    with listening() as s, socket.create_connection(s.getsockname()) as client:
        # the client's end is ESTABLISHED, not LISTEN: it holds no listening port
        assert holder_of(client.getsockname()[1]) is None


def test_a_listen_port_in_use_stops_the_start_naming_the_port_the_holder_and_the_fix():
    with listening() as s:
        port = s.getsockname()[1]
        with pytest.raises(PortTaken) as e:
            take_ports(config(port, free_port()))
    assert str(e.value).startswith(f"LISTEN = '127.0.0.1:{port}': port {port} is in use by process {os.getpid()} (")
    assert str(e.value).endswith("stop that process or give this node another LISTEN "
                                 "(in cluster mode its port + 1 must be free too, for Raft)")


def test_a_taken_ssh_port_stops_the_start_and_lets_go_of_listen():
    listen = free_port()
    with listening() as s:
        ssh = s.getsockname()[1]
        with pytest.raises(PortTaken, match=f"SSH_LISTEN = '127.0.0.1:{ssh}': port {ssh} is in use by process "
                                            f"{os.getpid()} .*give this node another SSH_LISTEN"):
            take_ports(config(listen, ssh))
    take_ports(config(listen, free_port())).close()  # LISTEN's socket was closed with the refusal


def test_the_nodes_own_sshd_left_running_may_keep_the_ssh_port(tmp_path):
    own = tmp_path / "ssh" / "sshd_config"
    # A stand-in for the earlier server's sshd: a process whose command line names this node's sshd_config.
    code = ("import socket,sys; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); "
            "print(s.getsockname()[1], flush=True); sys.stdin.read()")
    # (the code comes in the environment: only the first 200 characters of a command line are kept)
    sshd = subprocess.Popen([sys.executable, "-c", "import os; exec(os.environ['CODE'])", "-f", str(own)],
                            env={**os.environ, "CODE": code}, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ssh = int(sshd.stdout.readline())
        assert holder_of(ssh)[0] == sshd.pid
        take_ports(config(free_port(), ssh, str(tmp_path))).close()
        with pytest.raises(PortTaken, match="SSH_LISTEN"):  # another node's sshd is someone else
            take_ports(config(free_port(), ssh, str(tmp_path / "other")))
    finally:
        sshd.stdin.close()
        sshd.wait(timeout=30)


def test_socket_inet_ntop_is_the_standard_librarys_again_once_pysyncobj_is_loaded():
    assert socket.inet_ntop(socket.AF_INET, b"\x7f\x00\x00\x01") == "127.0.0.1"
    assert socket.inet_ntop(socket.AF_INET6, b"\x00" * 15 + b"\x01") == "::1"


def squatter_with_a_multiline_command_line():
    """A process listening on a loopback port whose arguments hold a newline, a tab and an
    escape (as /proc/PID/cmdline gives them: any byte but NUL); (process, port)."""
    code = ("import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
            "print(s.getsockname()[1], flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, "first line\nsecond\tline", "esc\x1b[31mred"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def test_the_holders_command_line_is_said_on_one_line_cleaned_of_control_characters():
    proc, port = squatter_with_a_multiline_command_line()
    try:
        # the whole line as said, whatever the interpreter's path (its length moves the 200-character cut)
        said = " ".join(psutil.Process(proc.pid).cmdline())
        with pytest.raises(PortTaken) as e:
            take_ports(config(port, free_port()))
    finally:
        proc.kill()
        proc.wait()
    text = str(e.value)
    assert "\n" not in text and "\t" not in text and "\x1b" not in text, repr(text)
    cleaned = said.replace("\n", " ").replace("\t", " ").replace("\x1b", " ")
    assert f"in use by process {proc.pid} ({' '.join(cleaned.split())[:200]})" in text, text
    assert "first line second" in text, text  # the arguments, on one line


def test_a_refused_start_says_the_port_conflict_once(tmp_path, monkeypatch, capfd, caplog):
    """mtgpu-server's own refusal: one line on stderr, not a log line beside it (both went
    to stderr, so the message came twice)."""
    import mtgpu.cli.server as server_cli

    proc, port = squatter_with_a_multiline_command_line()
    path = tmp_path / "mtgpu.toml"
    path.write_text(f'LISTEN = "127.0.0.1:{port}"\nSSH_LISTEN = "127.0.0.1:{free_port()}"\n'
                    f'STATE_DIR = "{tmp_path / "state"}"\nGPU_BACKEND = "simulated"\n[CONTAINERS]\nenabled = false\n')
    # the start would first move this process (pytest) into the node's cgroup: not the part tested
    monkeypatch.setattr(server_cli, "hold_member_early", lambda config: None)
    try:
        assert server_cli.main(["--config", str(path)]) == 2
    finally:
        proc.kill()
        proc.wait()
    said = capfd.readouterr().err + "\n".join(r.getMessage() for r in caplog.records)
    assert said.count(f"port {port} is in use by process {proc.pid}") == 1, said
    assert f"mtgpu-server: cannot start: LISTEN = '127.0.0.1:{port}'" in said, said

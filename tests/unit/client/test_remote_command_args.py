"""`remotegpu-cli ssh NODE id -un` runs `id -un` on the node, as `ssh host id -un` does:
everything after the node (or the workspace of `shell`) is the remote command, its
options included; and `ssh-config --help` names the file it really writes."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from mtgpu.cli import remotegpu

ENTRY = {"server": "127.0.0.1:9", "tenant": "alice", "key": "/nonexistent/id_ed25519", "node": "gpu-a",
         "cluster_id": "lab"}
RUNNING = {"state": "running", "reason": "", "workspace": {"name": "ws", "node": "gpu-a", "node_address": None}}


@pytest.fixture
def execs(monkeypatch):
    """The argv each command would give ssh (nothing is run, nothing is reached)."""
    ran: list[list[str]] = []

    def answer(connect, action):
        name = getattr(action, "__code__", None)
        text = name.co_names if name else ()
        return RUNNING if "workspace" in text else [{"name": "gpu-a", "address": "127.0.0.1:9"}]
    monkeypatch.setattr(remotegpu, "_server", lambda name: ENTRY)
    monkeypatch.setattr(remotegpu, "request", answer)
    monkeypatch.setattr(remotegpu, "_ssh_route", lambda entry, node, address: (["ssh", "-p", "22"], "host"))
    monkeypatch.setattr(remotegpu, "_exec_ssh", ran.append)
    return ran


@pytest.mark.parametrize("args, remote", [
    (["gpu-a", "id", "-un"], ["id", "-un"]),
    (["gpu-a", "ls", "-la", "--color=never", "/tmp"], ["ls", "-la", "--color=never", "/tmp"]),
    (["--server", "127.0.0.1:9", "gpu-a", "uname", "-a"], ["uname", "-a"]),
    (["gpu-a", "--", "id", "-un"], ["id", "-un"]),
    (["gpu-a", "echo", "--server", "x"], ["echo", "--server", "x"]),  # after NODE it is the command's
])
def test_ssh_takes_everything_after_the_node_as_the_remote_command(execs, args, remote):
    r = CliRunner().invoke(remotegpu.app, ["ssh", *args])
    assert r.exit_code == 0, r.output
    [argv] = execs
    assert argv == ["ssh", "-p", "22", "alice@host", *remote], argv


def test_ssh_with_no_command_opens_a_terminal(execs):
    r = CliRunner().invoke(remotegpu.app, ["ssh", "gpu-a"])
    assert r.exit_code == 0, r.output
    assert execs == [["ssh", "-p", "22", "-t", "alice@host"]]


def test_shell_takes_everything_after_the_workspace_as_the_command(execs):
    r = CliRunner().invoke(remotegpu.app, ["shell", "ws", "nvidia-smi", "-L"])
    assert r.exit_code == 0, r.output
    [argv] = execs
    assert argv[-3:] == ["alice@host", "nvidia-smi", "-L"] and "-t" not in argv, argv


def test_ssh_config_help_names_the_known_hosts_file_it_writes(tmp_path, monkeypatch):
    r = CliRunner().invoke(remotegpu.app, ["ssh-config", "--help"], terminal_width=200)
    assert r.exit_code == 0, r.output
    text = re.sub(r"[\s│]+", " ", r.output)
    named = set(re.findall(r"known_hosts[\w.]*", text))
    assert named == {"known_hosts.directlink"}, text
    # ... and that is the file it writes
    monkeypatch.setenv("REMOTEGPU_HOME", str(tmp_path))
    r = CliRunner().invoke(remotegpu.app, ["ssh-config", "--file", str(tmp_path / "config")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "known_hosts.directlink").exists() and not (tmp_path / "known_hosts").exists()

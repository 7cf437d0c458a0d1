"""`remotegpu-cli ssh-config`'s files: one block, replaced on each run, the rest of the
user's config kept byte for byte, host keys in our own known_hosts."""

from __future__ import annotations

import shlex

import pytest

from mtgpu.client import sshconfig

NODES = [{"name": "gpu-a", "id": "ab" * 32, "ssh_host_key": "ssh-ed25519 AAAAkeyA"},
         {"name": "gpu-b", "id": "cd" * 32, "ssh_host_key": ""}]


def entries(nodes=NODES):
    return [{"cluster": "lab", "tenant": "alice", "key": "/home/al ice/.config/remotegpu/id_ed25519", "nodes": nodes}]


def test_the_block_is_written_once_replaced_on_rerun_and_the_rest_is_kept(tmp_path):
    cfg = tmp_path / ".ssh" / "config"
    cfg.parent.mkdir()
    mine = "Host work\n    HostName work.example\n\nHost *\n    ServerAliveInterval 60\n"
    cfg.write_text(mine)
    known = tmp_path / "known_hosts.directlink"
    sshconfig.write(cfg, known, entries(), None)
    first = cfg.read_text()
    assert first.count(sshconfig.BEGIN) == 1 and first.endswith(mine)
    assert first.index("Host gpu-a.lab") < first.index("Host *")  # ours first: ssh takes the first value
    sshconfig.write(cfg, known, entries(NODES[:1]), "/opt/rg home")
    second = cfg.read_text()
    assert second.count(sshconfig.BEGIN) == 1 and second.endswith(mine)
    assert "gpu-b.lab" not in second and "Host gpu-a.lab" in second
    proxy = next(line for line in second.splitlines() if "ProxyCommand" in line).split("ProxyCommand ", 1)[1]
    argv = shlex.split(proxy)
    assert argv[-5:] == ["--home", "/opt/rg home", "proxy", "--cluster", "lab", "gpu-a"][-5:]
    assert argv[0].startswith("/")  # ssh runs it without our PATH
    assert '"/home/al ice/.config/remotegpu/id_ed25519"' in second
    assert known.read_text() == "gpu-a.lab ssh-ed25519 AAAAkeyA\n"  # a node with no key yet: not pinned to junk
    assert oct(cfg.stat().st_mode & 0o777) == "0o600"


def test_a_block_without_its_end_line_is_refused_not_guessed(tmp_path):
    cfg = tmp_path / "config"
    cfg.write_text(sshconfig.BEGIN + "\nHost x\n")
    with pytest.raises(ValueError, match="remove the broken block"):
        sshconfig.write(cfg, tmp_path / "kh", entries(), None)
    assert cfg.read_text() == sshconfig.BEGIN + "\nHost x\n"

"""`remotegpu-cli shell` and `forward` reach a node that does not answer directly through
DirectLink: ssh runs with `remotegpu-cli proxy` as its ProxyCommand and the node's host
key pinned."""

from __future__ import annotations

import shlex
import socket

from mtgpu.cli import remotegpu


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing answers there


def test_an_unreachable_node_is_reached_through_the_proxy_with_its_key_pinned(tmp_path, monkeypatch):
    monkeypatch.setenv("REMOTEGPU_HOME", str(tmp_path))
    info = {"enabled": True, "cluster_id": "lab", "relays": ["relay:7443"],
            "nodes": [{"name": "gpu-a", "id": "ab" * 32, "ssh_host_key": "ssh-ed25519 AAAAkey"}]}
    entry = {"server": f"127.0.0.1:{closed_port()}", "tenant": "alice", "key": str(tmp_path / "id_ed25519"),
             "node": "gpu-a", "directlink": info}
    argv, host = remotegpu._ssh_route(entry, "gpu-a", f"127.0.0.1:{closed_port()}")
    assert host == "gpu-a.lab"
    options = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-o")
    proxy = shlex.split(options["ProxyCommand"])
    assert proxy[-6:] == ["--home", str(tmp_path), "proxy", "--cluster", "lab", "gpu-a"]
    assert options["HostKeyAlias"] == "gpu-a.lab" and options["StrictHostKeyChecking"] == "yes"
    assert (tmp_path / "known_hosts.directlink").read_text() == "gpu-a.lab ssh-ed25519 AAAAkey\n"

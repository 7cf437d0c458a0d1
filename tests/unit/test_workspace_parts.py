"""The pieces a workspace's container is made of, without Podman: its entry script, what
`podman inspect` says of an existing one, its URLs, its firewall rules, an SSH login into
it, and the count of connections to its ports (real sockets on the loopback)."""

import json
import socket
import subprocess

from mtgpu.agent.podman.ports import chain_name, rules
from mtgpu.agent.runners.workspace import entry_script, parse_inspect, publish_args, url_of
from mtgpu.model.job import WorkspaceSpec
from mtgpu.server.member.idle_watch import established_to
from mtgpu.ssh.wrapper import workspace_argv


def test_the_entry_runs_post_create_once_post_start_always_then_the_command(tmp_path):
    ws = WorkspaceSpec(name="w", post_create=("echo created >> $OUT",), post_start=("echo started >> $OUT",))
    script = tmp_path / "entry"
    script.write_text(entry_script(ws).replace("/tmp/.mtgpu-workspace-created", str(tmp_path / "marker")))
    out = tmp_path / "out"
    for _ in range(2):
        r = subprocess.run(["/bin/sh", str(script), "echo", "main"], env={"OUT": str(out), "PATH": "/usr/bin:/bin"},
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 0 and r.stdout.strip().endswith("main"), r
    assert out.read_text().split() == ["created", "started", "started"]


def test_a_failing_lifecycle_command_is_reported_and_the_command_still_runs(tmp_path):
    ws = WorkspaceSpec(name="w", post_start=("exit 7",))
    script = tmp_path / "entry"
    script.write_text(entry_script(ws).replace("/tmp/.mtgpu-workspace-created", str(tmp_path / "marker")))
    r = subprocess.run(["/bin/sh", str(script), "echo", "main"], capture_output=True, text=True, timeout=10)
    assert "postStartCommand failed with status 7" in r.stdout and r.stdout.strip().endswith("main")


def test_an_existing_container_is_read_from_podman_inspect():
    doc = [{"Config": {"Labels": {"mtgpu.gpus": "0,1"}},
            "HostConfig": {"PortBindings": {"8888/tcp": [{"HostIp": "127.0.0.1", "HostPort": "40001"}]}}}]
    found = parse_inspect(json.dumps(doc))
    assert found.gpus == "0,1" and found.ports == {8888: 40001}
    assert parse_inspect("not json") is None


def test_ports_are_published_on_the_loopback_only_and_the_url_carries_the_token():
    assert publish_args({8888: 40001, 22: 40002}) == ["-p", "127.0.0.1:40002:22", "-p", "127.0.0.1:40001:8888"]
    ws = WorkspaceSpec(name="j", ports=(8888, 6006), token_env="JUPYTER_TOKEN", url_path="/lab")
    assert url_of(ws, 8888, 40001, "s3cret") == "http://localhost:40001/lab?token=s3cret"
    assert url_of(ws, 6006, 40002, "s3cret") == "http://localhost:40002/lab"


def test_the_firewall_lets_only_the_tenant_and_root_reach_a_port():
    text = rules(chain_name("abc"), {40001: 2001})
    assert ":MTGPU-WS-abc - [0:0]" in text and text.rstrip().endswith("COMMIT")
    lines = [line for line in text.splitlines() if "--dport 40001" in line]
    assert lines == ["-A MTGPU-WS-abc -p tcp -d 127.0.0.1 --dport 40001 -m owner --uid-owner 2001 -j RETURN",
                     "-A MTGPU-WS-abc -p tcp -d 127.0.0.1 --dport 40001 -m owner --uid-owner 0 -j RETURN",
                     "-A MTGPU-WS-abc -p tcp -d 127.0.0.1 --dport 40001 -j REJECT --reject-with tcp-reset"]
    assert len(chain_name("x" * 40)) <= 28  # iptables' limit on chain names


def test_an_ssh_login_into_a_workspace_runs_mt_container_in_tmux_or_not(monkeypatch):
    monkeypatch.setenv("MTGPU_PYTHON", "/venv/bin/python")
    base = ["/venv/bin/python", "-m", "mtgpu.cli.container"]
    assert workspace_argv("lab", "nvidia-smi -L", True, "/usr/bin/tmux", "main") == \
        base + ["exec", "lab", "--", "/bin/sh", "-c", "nvidia-smi -L"]
    assert workspace_argv("lab", None, True, "/usr/bin/tmux", "main") == \
        ["/usr/bin/tmux", "new-session", "-A", "-s", "ws-lab", "/venv/bin/python -m mtgpu.cli.container shell lab"]
    assert workspace_argv("lab", None, False, None, "main") == base + ["shell", "lab"]
    assert workspace_argv("lab; rm -rf ~", None, False, None, "main") is None


def test_connections_to_a_workspace_port_are_counted_once_each():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert established_to({port}) == 0  # listening is not a connection
        with socket.create_connection(("127.0.0.1", port)), socket.create_connection(("127.0.0.1", port)):
            accepted = [server.accept()[0] for _ in range(2)]
            # the accepted ends have the workspace's port as their local one (the clients' ends do not)
            assert established_to({port}) == 2
            for c in accepted:
                c.close()
            assert established_to({port}) == 0  # closed from the workspace's side: no longer established

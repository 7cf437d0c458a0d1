"""The app's `v`: ssh-config, then `code --folder-uri` with the URI the VS Code extension
builds, against a fake `code` on PATH that records its arguments and a stand-in for the
ssh-config step; and the refusals (no `code`, no DirectLink Host)."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from mtgpu.tui import app as app_module
from mtgpu.tui import vscode
from tests.unit.tui.test_tui_app import FakeClient, app_with, until
from tests.unit.tui.tui_builders import make_job, make_node, make_workspace


@pytest.fixture
def code(tmp_path, monkeypatch):
    """A fake `code` alone on PATH: writes its arguments, one a line, to `args`."""
    bin_dir, args = tmp_path / "bin", tmp_path / "args"
    bin_dir.mkdir()
    script = bin_dir / "code"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {args}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    calls = {"ssh-config": [], "home": []}

    def ssh_config(cli):
        calls["ssh-config"].append(cli)
        return calls.get("hosts", ["gpu1.lab"])

    def home(host):
        calls["home"].append(host)
        return calls.get("home_dir", "/home/alice")
    monkeypatch.setattr(vscode, "write_ssh_config", ssh_config)
    monkeypatch.setattr(vscode, "remote_home", home)
    monkeypatch.setattr(vscode, "docker_path_setting", lambda: calls.get("docker_path"))
    calls["args"] = args
    return calls


def status(app) -> str:
    return str(app.query_one("#status").render())


def workspace_with_container():
    ws = make_workspace("web", node="gpu1")
    ws["workspace"]["container"] = "mtgpu-ws99"
    return ws


def press_v(code, view_key, select, expect_args=True):
    client = FakeClient([make_node("gpu1")], [make_job(5, nodes=("gpu1",))], [workspace_with_container()])
    seen = {}

    async def go():
        app = app_with(client)
        async with app.run_test(size=(160, 40)) as pilot:
            await pilot.press(view_key)
            view = {"1": "servers", "3": "workspaces"}[view_key]
            await until(pilot, "the lab rows", lambda: app.table(view).row_of(select) is not None)
            app.table(view).cursor_row = app.table(view)._index[select]
            await pilot.press("v")
            if expect_args:
                await until(pilot, "code to be run", lambda: code["args"].exists() and "VS Code" in status(app)
                            and "..." not in status(app))
            else:
                await until(pilot, "the answer", lambda: "..." not in status(app) and status(app) != "")
            seen["status"] = status(app)
    asyncio.run(go())
    seen["args"] = code["args"].read_text().splitlines() if code["args"].exists() else None
    return seen


def test_v_on_a_node_writes_the_ssh_config_then_opens_its_home_over_remote_ssh(code):
    seen = press_v(code, "1", "lab/gpu1")
    assert seen["args"] == ["--folder-uri", "vscode-remote://ssh-remote+gpu1.lab/home/alice"]
    assert code["ssh-config"] == [app_module.CLI] and code["home"] == ["gpu1.lab"]
    assert seen["status"] == "opening gpu1.lab:/home/alice in VS Code (Remote-SSH)"


def test_v_on_a_node_whose_home_is_not_known_opens_the_root(code):
    code["home_dir"] = None
    seen = press_v(code, "1", "lab/gpu1")
    assert seen["args"] == ["--folder-uri", "vscode-remote://ssh-remote+gpu1.lab/"]
    assert "your home there is not known" in seen["status"]


def test_v_on_a_workspace_attaches_to_its_container_when_dev_containers_uses_mt_podman(code):
    code["docker_path"] = "/usr/local/bin/mt-podman"
    seen = press_v(code, "3", "lab/web")
    name = json.dumps({"containerName": "/mtgpu-ws99"}, separators=(",", ":")).encode().hex()
    assert seen["args"] == ["--folder-uri", f"vscode-remote://attached-container+{name}@ssh-remote+gpu1.lab/home/alice"]
    assert "(container mtgpu-ws99 on gpu1.lab)" in seen["status"]


def test_v_on_a_workspace_opens_its_node_and_says_why_when_docker_path_is_not_mt_podman(code):
    seen = press_v(code, "3", "lab/web")
    assert seen["args"] == ["--folder-uri", "vscode-remote://ssh-remote+gpu1.lab/home/alice"]
    assert ("node gpu1.lab:/home/alice in VS Code, not the container: VS Code's dev.containers.dockerPath is not "
            "set (docker), not mt-podman") in seen["status"]


def test_v_refuses_when_code_is_not_on_path(code, tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    seen = press_v(code, "1", "lab/gpu1", expect_args=False)
    assert seen["args"] is None and code["ssh-config"] == []
    assert "`code` command is not on PATH" in seen["status"] and "Install 'code' command in PATH" in seen["status"]


def test_v_refuses_when_ssh_config_writes_no_host_for_the_node(code):
    code["hosts"] = []  # a standalone node: no DirectLink relay
    seen = press_v(code, "1", "lab/gpu1", expect_args=False)
    assert seen["args"] is None and code["home"] == []
    assert seen["status"].startswith("could not open VS Code: `remotegpu-cli ssh-config` wrote no Host gpu1.lab: "
                                     "cluster lab has no DirectLink relay")


def test_uris_match_the_extensions():
    assert vscode.folder_uri("gpu1.lab", "/home/a b") == "vscode-remote://ssh-remote+gpu1.lab/home/a%20b"
    assert vscode.ssh_remote_authority("me@x") == "ssh-remote+" + '{"hostName":"me@x"}'.encode().hex()
    with pytest.raises(ValueError, match="not an absolute path"):
        vscode.folder_uri("h", "home")
    with pytest.raises(ValueError, match="not a container name"):
        vscode.attached_container_uri("a/b", "h", "/")


def test_docker_path_is_read_from_the_user_settings(tmp_path, monkeypatch):
    settings = tmp_path / "settings.json"
    monkeypatch.setattr(vscode, "settings_files", lambda: [tmp_path / "missing.json", settings])
    assert vscode.docker_path_setting() is None
    settings.write_text('{\n  // comment\n  "dev.containers.dockerPath": "mt-podman",\n}\n')
    assert vscode.docker_path_setting() == "mt-podman"
    assert os.path.basename(vscode.settings_files()[1]) == "settings.json"

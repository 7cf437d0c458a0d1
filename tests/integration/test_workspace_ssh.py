"""Reaching a workspace as a tenant does from a laptop (issue 11): an invited tenant joins,
`ssh -o SetEnv=MTGPU_WORKSPACE=NAME` lands inside the workspace (a command, and a terminal
in tmux), and `remotegpu-cli forward WS PORT` brings its web port to localhost. The
terminal app (issue 14), the real program in tmux, does the same with `t` and `f`, and
creates a workspace from a devcontainer.json in the tenant's home on the node."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import re
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.images import busybox_image, podman_missing
from tests.support.laptop import invite_and_join, remotegpu
from tests.support.node import free_port, running_node, wait_for
from tests.support.tmux import app_in_tmux
from tests.support.users import can_create_users, stop_node_and_remove_tenants

asyncssh = pytest.importorskip("asyncssh")
_why_not = can_create_users() or podman_missing() or (
    None if (shutil.which("sshd") or os.path.exists("/usr/sbin/sshd")) and shutil.which("ssh") else
    "openssh-server and openssh-client are needed")
if _why_not:
    pytest.skip(_why_not, allow_module_level=True)

UID_RANGE = (330000, 339999)  # its own: the accounts this node makes never meet another test's
WEB = "mkdir -p /tmp/www && echo inside-the-workspace > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www"


@pytest.fixture(scope="module")
def snode():
    with busybox_image() as image:
        ssh_port = free_port()
        templates = {"web": {"image": image, "ports": [8080], "command": WEB}}
        with running_node([], parent_dir="/var/lib", CLUSTER_ID="lab-ws", SSH_LISTEN=f"127.0.0.1:{ssh_port}",
                          TENANT_UID_RANGE=list(UID_RANGE), CONTAINERS={"enabled": True, "templates": templates}) as n:
            n.ssh_port = ssh_port
            n.image = image
            n.name = f"tw{os.getpid() % 10000}"
            try:
                yield n
            finally:
                stop_node_and_remove_tenants(n, [n.name], UID_RANGE)


@pytest.fixture(scope="module")
def joined(snode, tmp_path_factory):
    """The tenant, joined from a 'laptop' (a client folder), with its account and a running workspace."""
    home = tmp_path_factory.mktemp("laptop")
    pw = invite_and_join(snode, snode.name, home)
    user = SimpleNamespace(uid=pw.pw_uid, gid=pw.pw_gid, home=pw.pw_dir, name=snode.name)
    r = snode.run_cli("mtgpu.cli.container", user, "create", "--template", "web", "--name", "web", "--json",
                      timeout_s=180)
    assert r.returncode == 0, (r.stderr, snode.server_log()[-3000:])
    ws = json.loads(r.stdout)
    assert ws["state"] == "running", (ws["state"], ws["reason"], snode.server_log()[-3000:])
    return SimpleNamespace(home=home, key=str(home / "id_ed25519"), user=user, ws=ws)


def test_ssh_with_mtgpu_workspace_runs_commands_and_a_terminal_inside(snode, joined):
    async def session():
        conn = await asyncssh.connect("127.0.0.1", snode.ssh_port, username=snode.name,
                                      client_keys=[joined.key], known_hosts=None)
        try:
            command = await conn.run("id -u; cat /tmp/www/index.html", env={"MTGPU_WORKSPACE": "web"}, check=False)
            on_node = await conn.run("test -e /tmp/www/index.html && echo node-has-it || echo not-on-node",
                                     check=False)
            proc = await conn.create_process(term_type="xterm", term_size=(120, 40), env={"MTGPU_WORKSPACE": "web"})
            proc.stdin.write("echo TERM-$(cat /tmp/www/index.html)-END\n")
            try:
                seen = await asyncio.wait_for(proc.stdout.readuntil("TERM-inside-the-workspace-END"), 30)
            except asyncio.IncompleteReadError as e:
                raise AssertionError(f"the terminal ended: {e.partial!r}") from None
            sessions = await conn.run("tmux list-sessions -F '#S'", check=False)
            return command, on_node, seen, sessions
        finally:
            conn.close()

    command, on_node, seen, sessions = asyncio.run(asyncio.wait_for(session(), 90))
    assert command.exit_status == 0, (command.stdout, command.stderr)
    assert command.stdout.split() == ["1000", "inside-the-workspace"]  # the tenant is uid 1000 inside
    assert on_node.stdout.strip() == "not-on-node"  # without the variable: the node itself
    assert "TERM-inside-the-workspace-END" in seen  # the terminal is inside...
    assert "ws-web" in sessions.stdout.split(), sessions  # ... in the tmux session that outlives a disconnect


def test_remotegpu_forward_brings_the_workspace_port_to_localhost(snode, joined):
    local = free_port()
    fwd = subprocess.Popen([sys.executable, "-m", "mtgpu.cli.remotegpu", "forward", "web", "8080",
                            "--local-port", str(local)], env={**os.environ, "REMOTEGPU_HOME": str(joined.home)},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        def page():
            with urllib.request.urlopen(f"http://127.0.0.1:{local}/", timeout=5) as r:
                return r.read().decode()
        assert wait_for("the forwarded page", page, timeout_s=60, interval_s=0.3).strip() == "inside-the-workspace"
    finally:
        os.killpg(fwd.pid, signal.SIGTERM)
        _, err = fwd.communicate(timeout=30)
    assert "forwarding http://localhost:" in err
    r = remotegpu(joined.home, "forward", "web", "9999")
    assert r.returncode == 2 and "publishes no port 9999 (its ports: 8080)" in r.stderr


def test_remotegpu_shell_is_the_shortcut_into_the_workspace(snode, joined):
    r = remotegpu(joined.home, "shell", "web", "cat", "/tmp/www/index.html")
    assert r.returncode == 0 and r.stdout.strip() == "inside-the-workspace", (r.stdout, r.stderr)
    r = remotegpu(joined.home, "shell", "nope", "true")
    assert r.returncode != 0 and "no workspace 'nope' of yours" in r.stderr


def _page(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def _input_line(screen: str) -> str | None:
    """The text in the app's input box, when it is open."""
    for line in screen.splitlines():
        if line.startswith("▊") and line.rstrip().endswith("▎") and "▔" not in line and "▁" not in line:
            return line.strip("▊▎ ")
    return None


def _filter_to(app, name: str) -> None:
    """`/NAME` Enter: only that workspace's row is left in the view. Each keystroke waits
    for the box to show it: keys sent faster than the app takes them are not lost then."""
    app.keys("/")
    app.wait("the filter line", lambda s: _input_line(s) is not None, timeout_s=10)
    app.keys("C-u")
    app.wait("the filter line emptied", lambda s: _input_line(s) in ("", "filter: words every shown row contains"),
             timeout_s=10)
    app.type(name)
    app.wait(f"{name} in the filter line", lambda s: _input_line(s) == name, timeout_s=10)
    app.keys("Enter")
    app.wait(f"the view filtered to {name}", lambda s: re.search(rf"filter: {re.escape(name)}(\s|$)", s) and _input_line(s) is None
             and len([ln for ln in s.split("REASON", 1)[1].splitlines() if ln.startswith("lab-ws")]) == 1,
             timeout_s=10)


def test_the_app_creates_from_a_devcontainer_opens_its_terminal_forwards_and_removes(snode, joined):
    project = Path(joined.user.home) / "appproj"
    (project / ".devcontainer").mkdir(parents=True)
    (project / ".devcontainer" / "devcontainer.json").write_text(json.dumps({"image": snode.image}))
    (project / "README").write_text("the app's project\n")
    subprocess.run(["chown", "-R", f"{joined.user.uid}:{joined.user.gid}", str(project)], check=True)
    with app_in_tmux(joined.home) as app:
        app.keys("3")
        app.wait("the workspace in the app", lambda s: re.search(r"lab-ws\s+web\s+running", s))
        app.keys(":")
        app.wait("the command line", lambda s: "command (? lists them)" in s, timeout_s=10)
        app.type("create devcontainer ~/appproj name=fromapp")
        app.keys("Enter")  # the app suspends: mt-container runs on the node, as the tenant, where we watch it
        done = app.wait("mt-container to end", lambda s: re.search(r"\[mt-container create on node-a: exit (\d+)\]", s),
                        timeout_s=180)
        assert done.group(1) == "0", app.screen()
        app.keys("Enter")
        app.wait("the new workspace", lambda s: re.search(r"lab-ws\s+fromapp\s+running", s), timeout_s=60)

        _filter_to(app, "fromapp")
        app.keys("t")  # the app suspends; the terminal is inside the new workspace, in tmux on the node
        app.wait("the workspace's tmux session", lambda s: "[ws-froma" in s and "$" in s)  # tmux cuts the name
        app.type("echo IN-$(cat /workspaces/appproj/README | tr ' ' -)-$((6*7))")
        app.keys("Enter")
        app.wait("the command's output inside the workspace", lambda s: "IN-the-app's-project-42" in s)
        app.type("exit")
        app.keys("Enter")
        app.wait("the app back", lambda s: "back from workspace fromapp (exit 0)" in s)

        _filter_to(app, "web")
        app.keys("f")
        said = app.wait("the forward", lambda s: re.search(r"forwarding (http://localhost:\d+)", s))
        assert wait_for("the forwarded page", lambda: _page(said.group(1)), timeout_s=60,
                        interval_s=0.3).strip() == "inside-the-workspace"

        _filter_to(app, "fromapp")
        app.keys("d")
        app.wait("the question", lambda s: "remove workspace fromapp on lab-ws" in s, timeout_s=10)
        app.keys("y")
        app.wait("the removal", lambda s: "removed workspace fromapp on lab-ws" in s, timeout_s=30)
        app.keys("q")
        wait_for("the app to end", lambda: not app.alive(), timeout_s=10)
    wait_for("the forward to end with the app", lambda: not _reachable(said.group(1)), timeout_s=15)
    names = [w["name"] for w in json.loads(remotegpu(joined.home, "workspaces", "--json").stdout)]
    assert "fromapp" not in names and "web" in names, names


def _reachable(url: str) -> bool:
    try:
        _page(url)
        return True
    except OSError:
        return False

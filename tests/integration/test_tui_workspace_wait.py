"""The terminal app's workspace create and start against a real node (issue 24): they wait as
`mt-container create` and `start` do, with the same code (cli/workspace_wait.py), through the
app's network client. A tenant joined from a 'laptop' folder; the app in an 80x24 terminal
(Pilot). `:create template idle` says the workspace runs only once the node runs its container;
`:create template broken` (its command is not in the image) says it could not start, and a
notice gives the node's reason and the end of its output; `:start` after `:stop` waits again."""

from __future__ import annotations

import asyncio
import json
import os
from types import SimpleNamespace

import pytest

from mtgpu.cli.remotegpu import LIVE_TIMEOUT_S, _client
from mtgpu.tui.app import RemoteGpuApp
from tests.support.images import busybox_image, podman_missing
from tests.support.laptop import invite_and_join
from tests.support.node import running_node
from tests.support.pilot import until
from tests.support.users import can_create_users, stop_node_and_remove_tenants

if can_create_users() or podman_missing():
    pytest.skip(can_create_users() or podman_missing(), allow_module_level=True)

UID_RANGE = (480000, 484999)  # its own: the accounts this node makes never meet another test's


@pytest.fixture(scope="module")
def wtnode():
    with busybox_image() as image:
        templates = {"idle": image, "broken": {"image": image, "command": "no-such-command --here"}}
        with running_node([], CLUSTER_ID="lab-tuiw", TENANT_UID_RANGE=list(UID_RANGE),
                          CONTAINERS={"enabled": True, "templates": templates}) as n:
            n.name = f"tv{os.getpid() % 10000}"
            try:
                yield n
            finally:
                stop_node_and_remove_tenants(n, [n.name], UID_RANGE)


@pytest.fixture(scope="module")
def laptop(wtnode, tmp_path_factory):
    home = tmp_path_factory.mktemp("laptop")
    pw = invite_and_join(wtnode, wtnode.name, home)
    return SimpleNamespace(home=home, entries=json.loads((home / "servers.json").read_text()), uid=pw.pw_uid)


def _status(app) -> str:
    return str(app.query_one("#status").render())


def _workspace(node, name: str) -> dict:
    with node.client() as c:
        return next(w for w in c.workspaces(all_tenants=True) if w["workspace"]["name"] == name)


def test_the_apps_create_and_start_wait_until_the_workspace_runs_or_say_why_not(wtnode, laptop):
    app = RemoteGpuApp(laptop.entries, lambda e: _client(e, timeout_s=LIVE_TIMEOUT_S), refresh_s=0.5)
    said: list[str] = []

    async def command(pilot, text: str) -> None:
        await pilot.press("colon", *text, "enter")

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("3")
            await command(pilot, "create template idle name=w1")
            await until(pilot, "the create to end", lambda: said.append(_status(app)) or " runs on " in _status(app)
                        or "could not" in _status(app), timeout_s=180.0)
            assert _status(app) == "workspace w1 runs on node-a (lab-tuiw)", (_status(app), said[-5:])
            ws = _workspace(wtnode, "w1")  # when the app says so, the node runs it
            assert ws["state"] == "running" and ws["workspace"]["container"], ws
            assert any("waiting until it runs" in s for s in said), said  # it did not say done at once

            await command(pilot, "create template broken name=w2")
            await until(pilot, "the broken one's verdict", lambda: "could not" in _status(app) or " runs on "
                        in _status(app), timeout_s=180.0)
            assert _status(app).startswith("workspace w2 (job "), _status(app)
            assert "could not start: it is stopped" in _status(app), _status(app)
            notice = str(app.screen.query_one("#help-text").render())
            assert "no-such-command" in notice, notice  # the node's reason or the end of its output
            await pilot.press("escape")

            await command(pilot, "stop w1")
            await until(pilot, "w1 stopped", lambda: _workspace(wtnode, "w1")["state"] == "stopped", timeout_s=180.0)
            said.clear()
            await command(pilot, "start w1")
            await until(pilot, "the start to end", lambda: said.append(_status(app)) or " runs on " in _status(app)
                        or "could not" in _status(app), timeout_s=180.0)
            assert _status(app) == "workspace w1 runs on node-a (lab-tuiw)", (_status(app), said[-5:])
            assert _workspace(wtnode, "w1")["state"] == "running"
            assert any("waiting until it runs" in s for s in said), said
            for name in ("w1", "w2"):
                await command(pilot, f"rm {name}")
                await pilot.press("y")
    asyncio.run(go())

"""The terminal app driven by Pilot against stand-in clusters (the real server is in
tests/integration/test_tui.py): keys, views, filter, help, refusals, a dead cluster."""

from __future__ import annotations

import asyncio

from mtgpu.client.errors import ClientError
from mtgpu.tui.app import RemoteGpuApp, help_text
from tests.unit.tui.tui_builders import make_job, make_node, make_workspace


class FakeClient:
    path = "direct"

    def __init__(self, nodes, jobs, workspaces=()):
        self._nodes, self._jobs, self._ws = nodes, jobs, list(workspaces)
        self.cancelled: list[int] = []
        self.calls: list[tuple] = []

    def nodes(self):
        return self._nodes

    def jobs(self):
        return self._jobs

    def workspaces(self):
        return self._ws

    def cancel(self, job_id):
        self.cancelled.append(job_id)
        for j in self._jobs:
            if j["id"] == job_id:
                j["state"] = "cancelled"
        return {"cancelled": [job_id]}

    def workspace_action(self, name, action):
        self.calls.append((action, name))
        return {}

    def create_workspace(self, body):
        self.calls.append(("create", body))
        return {}

    def close(self):
        pass


def entries():
    return [{"server": "127.0.0.1:1", "cluster_id": "lab", "tenant": "alice", "key": "k"},
            {"server": "127.0.0.1:2", "cluster_id": "far", "tenant": "alice", "key": "k"}]


def app_with(client):
    def connect(entry):
        if entry["cluster_id"] == "far":
            raise ClientError("cannot reach 127.0.0.1:2: connection refused")
        return client
    return RemoteGpuApp(entries(), connect, refresh_s=0.2)


async def until(pilot, what, check, timeout_s=5.0):
    for _ in range(int(timeout_s / 0.05)):
        if check():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"waited {timeout_s} s for {what}")


def cells(app, view):
    return [r.cells for r in app.table(view).shown()]


def test_servers_view_shows_both_clusters_and_a_dead_one_as_unreachable():
    client = FakeClient([make_node("gpu1", gpus=2, util=10.0)], [make_job(5, nodes=("gpu1",))])

    async def go():
        app = app_with(client)
        async with app.run_test(size=(160, 40)) as pilot:
            await until(pilot, "both clusters", lambda: len(cells(app, "servers")) == 2)
            rows = {c[0]: c for c in cells(app, "servers")}
            assert rows["lab"][1:5] == ("gpu1", "up", "2x H100", "10 10") and rows["lab"][7] == "5"
            assert rows["far"][2] == "unreachable" and "connection refused" in rows["far"][-1]
            client._nodes[0]["gpus"][0]["utilization_pct"] = 95.0  # the next refresh changes one cell
            await until(pilot, "the new utilization", lambda: {c[0]: c for c in cells(app, "servers")}["lab"][4] == "95 10")
            assert app.is_running
    asyncio.run(go())


def test_filter_help_and_quit_keys():
    client = FakeClient([make_node("gpu1"), make_node("gpu2", model="T4")], [])

    async def go():
        app = app_with(client)
        async with app.run_test(size=(160, 40)) as pilot:
            await until(pilot, "the nodes", lambda: len(cells(app, "servers")) == 3)
            await pilot.press("slash", *"t4", "enter")
            assert [c[1] for c in cells(app, "servers")] == ["gpu2"]
            await pilot.press("question_mark")
            assert type(app.screen).__name__ == "HelpScreen"
            await pilot.press("escape")
            await pilot.press("q")
        assert not app.is_running
    asyncio.run(go())


def test_the_title_status_and_footer_all_fit_on_the_screen():
    client = FakeClient([make_node(f"gpu{i}") for i in range(60)], [])  # more rows than lines

    async def go():
        app = app_with(client)
        async with app.run_test(size=(120, 20)) as pilot:
            await until(pilot, "the nodes", lambda: len(cells(app, "servers")) == 61)
            title, status = app.query_one("#title").region, app.query_one("#status").region
            assert title.y == 0 and title.height == 1
            assert status.height == 1 and status.y == 18  # above the footer: nothing scrolled off
            assert app.table().region.bottom <= status.y
    asyncio.run(go())


def test_o_sorts_by_the_next_column_and_shift_o_reverses_it():
    client = FakeClient([make_node("gpu1"), make_node("gpu3"), make_node("gpu2")], [])

    async def go():
        app = app_with(client)
        async with app.run_test(size=(160, 40)) as pilot:
            await until(pilot, "the nodes", lambda: len(cells(app, "servers")) == 4)
            await pilot.press("slash", *"lab", "enter")
            await pilot.press("o")  # cluster -> node
            assert [c[1] for c in cells(app, "servers")] == ["gpu1", "gpu2", "gpu3"]
            await pilot.press("O")
            assert [c[1] for c in cells(app, "servers")] == ["gpu3", "gpu2", "gpu1"]
            assert "sorted by NODE, descending" in str(app.query_one("#status").render())
            await pilot.press("O")
            assert [c[1] for c in cells(app, "servers")] == ["gpu1", "gpu2", "gpu3"]
    asyncio.run(go())


def test_cancel_asks_then_cancels_the_selected_job():
    client = FakeClient([make_node()], [make_job(5), make_job(6)])

    async def go():
        app = app_with(client)
        async with app.run_test(size=(160, 40)) as pilot:
            await pilot.press("2")
            await until(pilot, "the jobs", lambda: len(cells(app, "jobs")) == 2)
            await pilot.press("down", "c")
            assert "cancel job 6 on lab?" in app.screen.question
            await pilot.press("n")
            assert client.cancelled == []
            await pilot.press("c", "y")
            await until(pilot, "the cancel", lambda: client.cancelled == [6])
            await until(pilot, "the new state", lambda: cells(app, "jobs")[1][3] == "cancelled")
    asyncio.run(go())


def test_what_is_not_available_says_so_instead_of_pretending():
    client = FakeClient([make_node()], [], [make_workspace("web", state="stopped")])

    async def go():
        app = app_with(client)
        async with app.run_test(size=(160, 40)) as pilot:
            await pilot.press("3")
            await until(pilot, "the workspace", lambda: len(cells(app, "workspaces")) == 1)
            status = app.query_one("#status")
            await pilot.press("v")
            assert "is stopped: start it first" in str(status.render())
            await pilot.press("t")
            assert "is stopped: start it first" in str(status.render())
            await pilot.press("colon", *"create devcontainer ~/proj", "enter")  # Pilot's terminal cannot be handed over
            said = str(status.render())
            assert "cannot hand itself over: run remotegpu-cli ssh node-a --server" in said, said
            assert said.endswith("-- 'mt-container create --devcontainer proj' yourself"), said
            await pilot.press("colon", *"frob", "enter")
            assert "no command 'frob'" in str(status.render())
    asyncio.run(go())


def test_help_lists_every_key_of_every_view():
    text = help_text()
    for key in ("/", ":", "?", "q", "1", "2", "3", "o", "O", "c", "l", "n", "s", "x", "d", "t", "f", "v"):
        assert f"\n  {key} " in text, key


def test_workspace_keys_and_create_command_call_the_api():
    client = FakeClient([make_node()], [], [make_workspace("web")])

    async def go():
        app = app_with(client)
        async with app.run_test(size=(160, 40)) as pilot:
            await pilot.press("3")
            await until(pilot, "the workspace", lambda: len(cells(app, "workspaces")) == 1)
            await pilot.press("x")
            await until(pilot, "the stop", lambda: client.calls == [("stop", "web")])
            await pilot.press("d", "y")
            await until(pilot, "the removal", lambda: client.calls[-1] == ("rm", "web"))
            await pilot.press("n", *"web name=w2", "enter")
            await until(pilot, "the creation", lambda: client.calls[-1] == ("create", {"template": "web",
                                                                                       "name": "w2"}))
    asyncio.run(go())

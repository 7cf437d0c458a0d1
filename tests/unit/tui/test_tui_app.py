"""The terminal app driven by Pilot against stand-in clusters (the real server is in
tests/integration/test_tui.py): keys, views, filter, help, refusals, a dead cluster."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from mtgpu.cli import workspace_wait
from mtgpu.client.errors import ClientError
from mtgpu.client.logs import LogPart
from mtgpu.tui.app import RemoteGpuApp, help_text
from tests.unit.tui.tui_builders import make_job, make_node, make_workspace


class FakeClient:
    path = "direct"

    def __init__(self, nodes, jobs, workspaces=()):
        self._nodes, self._jobs, self._ws = nodes, jobs, list(workspaces)
        self.cancelled: list[int] = []
        self.calls: list[tuple] = []
        self.looks: dict[str, list[dict]] = {}
        self.log: dict[int, bytes] = {}

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
        return self.workspace(name) if action == "start" else {}

    def create_workspace(self, body):
        self.calls.append(("create", body))
        name = body.get("name") or body.get("template") or body.get("image")
        self.looks.setdefault(name, [make_workspace(name, container=f"mtgpu-ws-{name}")])
        return {"name": name, "job_id": 99}

    def workspace(self, name):
        """Its next view: `looks[name]` in turn, the last one for good (the workspace as it evolves)."""
        views = self.looks.get(name) or [next(w for w in self._ws if w["workspace"]["name"] == name)]
        return views.pop(0) if len(views) > 1 else views[0]

    def job(self, job_id):
        return {"id": job_id, "state": "cancelled", "reason": "removed"}

    @contextlib.contextmanager
    def open_log(self, job_id, offset=0, tail=None, rank=0):
        data = self.log.get(job_id, b"")
        yield LogPart(job_id, 0, len(data), True, "stopped", "node-a", iter([data]))

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


async def until(pilot, what, check, timeout_s=30.0):
    for _ in range(int(timeout_s / 0.05)):
        if check():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"waited {timeout_s} s for {what}")


def cells(app, view):
    return [r.cells for r in app.table(view).shown()]


@contextlib.asynccontextmanager
async def on_the_workspace(client, size):
    """The app on `client` in a terminal of `size`, on its workspaces view once the one
    workspace is listed: (app, pilot)."""
    app = app_with(client)
    async with app.run_test(size=size) as pilot:
        await pilot.press("3")
        await until(pilot, "the workspace", lambda: len(cells(app, "workspaces")) == 1)
        yield app, pilot


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
        async with on_the_workspace(client, size=(160, 40)) as (app, pilot):
            status = app.query_one("#status")
            await pilot.press("v")
            assert "is stopped: start it first" in str(status.render())
            await pilot.press("t")
            assert "is stopped: start it first" in str(status.render())
            await pilot.press("colon", *"create devcontainer ~/proj", "enter")  # Pilot's terminal cannot be handed over
            said = str(status.render())
            assert "cannot hand itself over: run remotegpu-cli ssh --server" in said, said
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
        async with on_the_workspace(client, size=(160, 40)) as (app, pilot):
            await pilot.press("x")
            await until(pilot, "the stop", lambda: client.calls == [("stop", "web")])
            await pilot.press("d", "y")
            await until(pilot, "the removal", lambda: client.calls[-1] == ("rm", "web"))
            await pilot.press("n", *"web name=w2", "enter")
            await until(pilot, "the creation", lambda: client.calls[-1] == ("create", {"template": "web",
                                                                                       "name": "w2"}))
    asyncio.run(go())


@pytest.fixture
def quick_waits(monkeypatch):
    """The waits of cli/workspace_wait.py, shortened: a remote workspace counts as up after
    0.3 s of running with its container recorded; a queued one is waited for 1.5 s."""
    monkeypatch.setattr(workspace_wait, "REMOTE_SETTLE_S", 0.3)
    monkeypatch.setattr(workspace_wait, "QUEUED_WAIT_S", 1.5)
    monkeypatch.setattr(workspace_wait, "POLL_S", 0.02)


def status_of(app) -> str:
    return str(app.query_one("#status").render())


def test_create_waits_until_the_workspace_runs_as_mt_container_does(quick_waits, monkeypatch):
    """Not done while it is queued or its container not yet recorded: the status line says it
    waits, then that it runs (an 80x24 terminal)."""
    # its eight queued looks end by themselves: never "stays queued" first, however slow the
    # looks come on a busy machine (1.5 s could pass within them)
    monkeypatch.setattr(workspace_wait, "QUEUED_WAIT_S", 600.0)
    client = FakeClient([make_node()], [], [make_workspace("web")])
    queued = make_workspace("w2", state="queued", container=None)
    queued["reason"] = "waiting for a GPU"
    client.looks["w2"] = [queued] * 8 + [make_workspace("w2", container=None)] * 4 + [
        make_workspace("w2", container="mtgpu-ws99")]

    async def go():
        async with on_the_workspace(client, size=(80, 24)) as (app, pilot):
            # every status the app says (on a busy machine the wait's can come and go between two looks)
            said, say = [], app.say
            app.say = lambda text: (said.append(text), say(text))[1]
            await pilot.press("n", *"web name=w2", "enter")
            await until(pilot, "the creation", lambda: ("create", {"template": "web", "name": "w2"}) in client.calls)
            await until(pilot, "the wait", lambda: any("waiting until it runs" in t for t in said))
            waited = next(i for i, t in enumerate(said) if "waiting until it runs" in t)
            assert not any("runs on" in t for t in said[:waited]), said
            await until(pilot, "the workspace to run", lambda: status_of(app) == "workspace w2 runs on node-a (lab)")
            assert client.looks["w2"] == [make_workspace("w2", container="mtgpu-ws99")]  # every look was taken
    asyncio.run(go())


def test_a_workspace_that_stays_queued_says_why_and_keeps_its_place(quick_waits):
    client = FakeClient([make_node()], [], [make_workspace("web", state="stopped")])
    queued = make_workspace("web", state="queued", container=None)
    queued["reason"] = "no node has a free GPU now"
    client.looks["web"] = [queued]

    async def go():
        async with on_the_workspace(client, size=(80, 24)) as (app, pilot):
            await pilot.press("s")
            await until(pilot, "the start", lambda: ("start", "web") in client.calls)
            await until(pilot, "the verdict", lambda: "keeps its place" in status_of(app))
            assert status_of(app).startswith("workspace web is queued: no node has a free GPU now"), status_of(app)
    asyncio.run(go())


def test_a_start_that_stops_instead_says_why_with_the_end_of_its_output(quick_waits, monkeypatch):
    # it stops at the fourth look: never counted as up before that, however slow the looks
    # come on a busy machine (with 0.3 s, three looks 0.1 s apart could outlast it)
    monkeypatch.setattr(workspace_wait, "REMOTE_SETTLE_S", 600.0)
    client = FakeClient([make_node()], [], [make_workspace("web", state="stopped")])
    stopped = make_workspace("web", state="stopped", container="mtgpu-ws99")
    stopped["reason"] = "its command ended (exit 127)"
    client.looks["web"] = [make_workspace("web", container="mtgpu-ws99")] * 3 + [stopped]
    client.log[99] = b"starting\n/bin/sh: jupyter: not found\n"

    async def go():
        async with on_the_workspace(client, size=(80, 24)) as (app, pilot):
            await pilot.press("s")
            await until(pilot, "the failure", lambda: "could not start" in status_of(app))
            assert status_of(app).startswith("workspace web (job 99) could not start: it is stopped"), status_of(app)
            notice = str(app.screen.query_one("#help-text").render())
            assert "(its command ended (exit 127)); its output ends with:" in notice, notice
            assert "jupyter: not found" in notice, notice
            await pilot.press("escape")
            assert "could not start" in status_of(app)
    asyncio.run(go())

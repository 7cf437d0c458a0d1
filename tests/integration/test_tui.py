"""The terminal app against a real node (issue 14): a loopback node with simulated GPUs,
a tenant joined from a 'laptop' folder. Pilot drives the app in this process (servers
view follows `mtgpu-admin simulate-load`; a job submitted elsewhere appears, its log is
followed, and cancel from the app cancels it); tmux drives the real `remotegpu-cli` program; `servers --live
--json` is the servers view's scriptable twin."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from types import SimpleNamespace

import pytest

from mtgpu.cli.remotegpu import LIVE_TIMEOUT_S, _client
from mtgpu.tui.app import RemoteGpuApp
from tests.support.laptop import invite_and_join, remotegpu
from tests.support.node import running_node, wait_for
from tests.support.pilot import until
from tests.support.tmux import app_in_tmux
from tests.support.users import can_create_users, stop_node_and_remove_tenants

if can_create_users():
    pytest.skip(can_create_users(), allow_module_level=True)

UID_RANGE = (400000, 409999)  # its own: the accounts this node makes never meet another test's
GPUS = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 2}]



@pytest.fixture(scope="module")
def tnode():
    with running_node(GPUS, CLUSTER_ID="lab-tui", TENANT_UID_RANGE=list(UID_RANGE)) as n:
        n.name = f"tu{os.getpid() % 10000}"
        try:
            yield n
        finally:
            stop_node_and_remove_tenants(n, [n.name], UID_RANGE)


@pytest.fixture(scope="module")
def laptop(tnode, tmp_path_factory):
    """The tenant, joined from a client folder, with its account on the node."""
    home = tmp_path_factory.mktemp("laptop")
    invite_and_join(tnode, tnode.name, home)
    job = home / "sleep.sh"
    job.write_text("#!/bin/sh\n#MTGPU gpus=1\necho hello-from-the-job\nsleep 600\n")
    return SimpleNamespace(home=home, entries=json.loads((home / "servers.json").read_text()), job=job)


def lab_row(app, view: str, key: str):
    row = app.table(view).row_of(key)
    return row.cells if row else None


def test_the_app_follows_live_load_and_jobs_and_cancels_one(tnode, laptop):
    # A joined server that does not answer is shown as such, next to the real one.
    dead = {**laptop.entries[0], "server": "127.0.0.1:9", "cluster_id": "gone"}
    app = RemoteGpuApp(laptop.entries + [dead], lambda e: _client(e, timeout_s=LIVE_TIMEOUT_S), refresh_s=0.5)

    async def go():
        async with app.run_test(size=(200, 50)) as pilot:
            await until(pilot, "the node's row", lambda: lab_row(app, "servers", "lab-tui/node-a"))
            cells = lab_row(app, "servers", "lab-tui/node-a")
            assert cells[3] == "2x NVIDIA GeForce RTX 4090" and cells[5] == "0/24 0/24", cells
            await until(pilot, "the dead server's row", lambda: lab_row(app, "servers", "gone!"))
            assert lab_row(app, "servers", "gone!")[2] == "unreachable"

            r = tnode.admin("simulate-load", "1", "--used", "20G", "--util", "90", "--state-dir", str(tnode.state_dir))
            assert r.returncode == 0, r.stderr
            await until(pilot, "GPU 1's load in the servers view",
                        lambda: lab_row(app, "servers", "lab-tui/node-a")[4].split() == ["0", "90"])
            assert lab_row(app, "servers", "lab-tui/node-a")[5] == "0/24 20/24"

            r = remotegpu(laptop.home, "submit", str(laptop.job), "--json")  # elsewhere: another program
            assert r.returncode == 0, r.stderr
            jid = json.loads(r.stdout)["job_id"]
            await pilot.press("2")
            key = f"lab-tui/{jid}"
            await until(pilot, f"job {jid} running in the jobs view",
                        lambda: (lab_row(app, "jobs", key) or ("",) * 4)[3] == "running")
            await pilot.press("1")
            await until(pilot, "the job on the node's row",
                        lambda: str(jid) in lab_row(app, "servers", "lab-tui/node-a")[7].split(","))
            await pilot.press("2")
            app.table("jobs").cursor_row = app.table("jobs")._index[key]
            await pilot.press("enter")  # follow its log
            await until(pilot, "the job's log", lambda: type(app.screen).__name__ == "LogScreen" and any(
                "hello-from-the-job" in line for line in app.screen.query_one("#log").lines))
            await pilot.press("escape")
            await pilot.press("c", "y")
            await until(pilot, f"job {jid} cancelled in the view", lambda: lab_row(app, "jobs", key)[3] == "cancelled")
            assert tnode.job(jid)["state"] == "cancelled"
            # The jobs view's scriptable twin, without --server: every joined cluster, each job labelled.
            r = remotegpu(laptop.home, "jobs", "--json")
            assert r.returncode == 0, r.stderr
            [mine] = [j for j in json.loads(r.stdout) if j["id"] == jid]
            assert mine["cluster"] == "lab-tui" and mine["state"] == "cancelled", mine
            # ... and its usage, from the laptop: the cancelled job held its GPU while it ran
            r = remotegpu(laptop.home, "usage", "--json")
            assert r.returncode == 0, r.stderr
            assert json.loads(r.stdout)["totals"]["jobs"] >= 1 and json.loads(r.stdout)["totals"]["gpu_s"] > 0
            assert app.is_running
    asyncio.run(go())


def test_servers_live_json_is_the_servers_views_twin(tnode, laptop):
    r = remotegpu(laptop.home, "servers", "--live", "--json")
    assert r.returncode == 0, r.stderr
    [lab] = json.loads(r.stdout)
    assert lab["cluster"] == "lab-tui" and lab["error"] is None and lab["path"] == "direct"
    [node] = lab["nodes"]
    assert node["name"] == "node-a" and [g["model"] for g in node["gpus"]] == ["NVIDIA GeForce RTX 4090"] * 2


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_the_real_program_in_tmux_shows_the_servers_help_and_quits(tnode, laptop):
    with app_in_tmux(laptop.home) as app:
        app.wait("the servers view in tmux", lambda s: "node-a" in s and "RTX 4090" in s)
        assert app.screen().startswith(" remotegpu  <1 servers>"), app.screen()  # the title is on the top line
        app.keys("?")
        app.wait("the keys", lambda s: "Keys everywhere" in s and "cancel job" in s, timeout_s=10)
        app.keys("Escape")
        app.wait("the help to close", lambda s: "Keys everywhere" not in s, timeout_s=10)
        app.keys("q")
        wait_for("the program to end", lambda: not app.alive(), timeout_s=10)

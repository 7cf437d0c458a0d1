"""`remotegpu-cli jobs` / `workspaces` without --server: every joined cluster asked once,
listed together with their cluster (the app's views and their JSON), against stand-in
clients; a cluster that does not answer is said on stderr and the exit status is 1."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mtgpu.cli import remotegpu
from mtgpu.client.errors import ClientError
from mtgpu.tui.rows import JOB_COLUMNS, job_items, workspace_items
from mtgpu.tui.source import Cluster, fetch_all, group_by_cluster
from tests.unit.tui.tui_builders import make_job, make_snapshot, make_workspace


class Stand:
    """A RemoteClient stand-in: counts what it was asked."""

    path = "direct"

    def __init__(self, jobs=(), workspaces=()):
        self._jobs, self._ws = list(jobs), list(workspaces)
        self.asked: list[str] = []
        self.closed = False

    def nodes(self):
        self.asked.append("nodes")
        return []

    def jobs(self):
        self.asked.append("jobs")
        return self._jobs

    def workspaces(self):
        self.asked.append("workspaces")
        return self._ws

    def close(self):
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


ENTRIES = [{"server": "127.0.0.1:1", "cluster_id": "lab", "tenant": "alice", "key": "k", "uid": 1},
           {"server": "127.0.0.1:2", "cluster_id": "far", "tenant": "alice", "key": "k", "uid": 1},
           {"server": "127.0.0.1:3", "cluster_id": "home", "tenant": "alice", "key": "k", "uid": 1}]


def clients():
    return {"127.0.0.1:1": Stand([make_job(5), make_job(6, workspace=True)], [make_workspace("web")]),
            "127.0.0.1:3": Stand([make_job(1, state="queued", nodes=(), reason="no free GPU")],
                                 [make_workspace("nb", ports=())])}


def connect_with(stands):
    def connect(entry, timeout_s=30.0):
        if entry["server"] not in stands:
            raise ClientError(f"cannot reach {entry['server']}: connection refused")
        return stands[entry["server"]]
    return connect


def test_fetch_all_asks_each_cluster_once_for_the_part_only_and_closes_it():
    stands = clients()
    clusters = [Cluster(n, es, connect_with(stands)) for n, es in group_by_cluster(ENTRIES).items()]
    snaps = fetch_all(clusters, ("jobs",))
    assert [s.cluster for s in snaps] == ["lab", "far", "home"]
    assert [s.error is None for s in snaps] == [True, False, True] and "connection refused" in snaps[1].error
    assert snaps[0].nodes is None and snaps[0].workspaces is None and len(snaps[0].jobs) == 2
    assert all(s.asked == ["jobs"] and s.closed for s in stands.values())
    with pytest.raises(ValueError, match="no part \\['gpus'\\]"):
        clusters[0].fetch(("gpus",))


def test_items_are_the_views_jobs_and_workspaces_labelled_with_their_cluster():
    snaps = [make_snapshot("lab", jobs=[make_job(5), make_job(6, workspace=True)], workspaces=[make_workspace("web")]),
             make_snapshot("far", error="timed out"),
             make_snapshot("home", jobs=[make_job(1)], workspaces=[make_workspace("nb")])]
    assert [(j["cluster"], j["id"]) for j in job_items(snaps)] == [("lab", 5), ("home", 1)]
    assert [(w["cluster"], w["workspace"]["name"]) for w in workspace_items(snaps)] == [("lab", "web"), ("home", "nb")]
    assert job_items(snaps)[0]["name"] == "job-5"  # the API's fields are kept


@pytest.fixture
def cli(tmp_path, monkeypatch):
    (tmp_path / "servers.json").write_text(json.dumps(ENTRIES))
    monkeypatch.setenv("REMOTEGPU_HOME", str(tmp_path))
    stands = clients()
    monkeypatch.setattr(remotegpu, "_client", connect_with(stands))

    def run(*args):
        return CliRunner().invoke(remotegpu.app, list(args))
    run.stands = stands
    return run


def test_jobs_json_without_server_lists_every_cluster_and_says_which_did_not_answer(cli):
    r = cli("jobs", "--json")
    assert r.exit_code == 1
    assert [(j["cluster"], j["id"], j["state"]) for j in json.loads(r.stdout)] == [("lab", 5, "running"),
                                                                                  ("home", 1, "queued")]
    assert r.stderr.strip() == ("remotegpu: cluster far (127.0.0.1:2) did not list its jobs: 127.0.0.1:2: "
                                "cannot reach 127.0.0.1:2: connection refused")


def test_jobs_table_without_server_has_the_cluster_column(cli):
    r = cli("jobs")
    lines = r.stdout.splitlines()
    assert lines[0].split() == [w for c in JOB_COLUMNS for w in c.split()]
    assert lines[1].split()[:4] == ["lab", "5", "job-5", "running"]
    assert lines[2].split()[:4] == ["home", "1", "job-1", "queued"] and lines[2].rstrip().endswith("no free GPU")
    assert r.exit_code == 1 and "far" in r.stderr


def test_workspaces_without_server_json_and_table(cli):
    r = cli("workspaces", "--json")
    assert [(w["cluster"], w["workspace"]["name"]) for w in json.loads(r.stdout)] == [("lab", "web"), ("home", "nb")]
    assert r.exit_code == 1 and "did not list its workspaces" in r.stderr
    lines = cli("workspaces").stdout.splitlines()
    assert lines[0].split()[:2] == ["CLUSTER", "NAME"] and lines[1].split()[:4] == ["lab", "web", "running", "node-a"]


def test_all_clusters_answering_is_exit_0(cli, tmp_path):
    (tmp_path / "servers.json").write_text(json.dumps([ENTRIES[0], ENTRIES[2]]))
    r = cli("jobs", "--json")
    assert r.exit_code == 0 and r.stderr == "" and len(json.loads(r.stdout)) == 2


def test_with_server_only_that_server_is_asked_as_before(cli):
    r = cli("jobs", "--json", "--server", "127.0.0.1:3")
    assert r.exit_code == 0 and [j["id"] for j in json.loads(r.stdout)] == [1] and "cluster" not in r.stdout
    assert cli.stands["127.0.0.1:1"].asked == []


def test_nothing_joined_says_how_to_join(tmp_path, monkeypatch):
    monkeypatch.setenv("REMOTEGPU_HOME", str(tmp_path))
    r = CliRunner().invoke(remotegpu.app, ["jobs"])
    assert r.exit_code == 2 and "remotegpu-cli join CODE" in r.stderr

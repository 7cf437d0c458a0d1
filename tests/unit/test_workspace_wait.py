"""How create and start wait for a workspace on the caller's own member (cli/workspace_wait.py):
the member's answers come from a LocalClient whose requests are answered here, podman is a
script in the test's folder that prints what `podman container inspect --format` would."""

from __future__ import annotations

import os
import stat

import pytest

from mtgpu.cli import container, workspace_wait
from mtgpu.cli.workspace_wait import WorkspaceNotUp, wait_until_up
from mtgpu.client.local import LocalClient


def make_view(name: str = "web", state: str = "running", container_name: str | None = "mtgpu-ws7") -> dict:
    return {"id": 7, "state": state, "reason": None, "spec": {},
            "workspace": {"name": name, "node": "node-a", "image": "localhost/base", "container": container_name,
                          "ports": []}}


class MemberAnswers(LocalClient):
    """The member's side of the wait, as a LocalClient (the wait asks podman only for one):
    health names node-a, every look at the workspace gives `look`, podman_env names `podman`."""

    def __init__(self, podman: str, look: dict) -> None:  # no socket: nothing is sent
        self.podman, self.look = podman, look
        self.podman_env_calls = 0

    def close(self) -> None:
        pass

    def health(self) -> dict:
        return {"node": "node-a"}

    def workspace(self, name: str) -> dict:
        return self.look

    def podman_env(self, load=None, enter=None) -> dict:
        self.podman_env_calls += 1
        return {"podman": self.podman, "env": {"HOME": "/nonexistent"}}


def fake_podman(tmp_path, prints: str) -> str:
    """A podman whose `container inspect` answers `prints` (exit 0)."""
    path = tmp_path / "podman"
    path.write_text(f"#!/bin/sh\necho '{prints}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def short_waits(monkeypatch):
    monkeypatch.setattr(workspace_wait, "UP_WAIT_S", 1.0)
    monkeypatch.setattr(workspace_wait, "POLL_S", 0.01)


def test_a_container_never_seen_up_is_a_failure_naming_what_was_seen_and_what_to_run(tmp_path, short_waits):
    """Its job runs, its container was recorded, podman shows it created and never running:
    not a success once UP_WAIT_S has passed."""
    c = MemberAnswers(fake_podman(tmp_path, "created 0001-01-01 00:00:00 +0000 UTC"), make_view())
    with pytest.raises(WorkspaceNotUp) as got:
        wait_until_up(c, make_view())
    text = str(got.value)
    assert "workspace web (job 7) is not up after 1 s" in text, text
    assert "container mtgpu-ws7 was not seen up (podman last showed it created)" in text, text
    assert "`mt-container show web`" in text and "`mt-container logs web`" in text, text


def test_mt_container_exits_1_when_the_container_was_never_seen_up(tmp_path, short_waits, capsys):
    c = MemberAnswers(fake_podman(tmp_path, "created 0001-01-01 00:00:00 +0000 UTC"), make_view())
    with pytest.raises(SystemExit) as got:
        container._finish(c, make_view(), wait=True, json_out=False)
    assert got.value.code == 1
    captured = capsys.readouterr()
    assert "running on" not in captured.out and "running" not in captured.out, captured.out
    assert "is not up after" in captured.err, captured.err


def test_a_container_podman_shows_running_is_up(tmp_path, monkeypatch):
    monkeypatch.setattr(workspace_wait, "SETTLE_S", 0.05)
    monkeypatch.setattr(workspace_wait, "POLL_S", 0.01)
    c = MemberAnswers(fake_podman(tmp_path, "running 2026-12-02 15:00:00 +0000 UTC"), make_view())
    assert wait_until_up(c, make_view())["state"] == "running"


def test_the_member_is_asked_for_podman_once_per_wait(tmp_path, short_waits):
    """Every look asks podman; the member's answer (its podman, the tenant's environment) is
    the same at each, so it is asked once, not at every look."""
    c = MemberAnswers(fake_podman(tmp_path, "created 0001-01-01 00:00:00 +0000 UTC"), make_view())
    looks = []
    with pytest.raises(WorkspaceNotUp):
        wait_until_up(c, make_view(), sleep=lambda s: looks.append(s))
    assert len(looks) >= 3, looks
    assert c.podman_env_calls == 1

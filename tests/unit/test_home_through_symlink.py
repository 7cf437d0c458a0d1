"""A tenant whose HOME is reached through a symlink (/home -> /var/home, as on Fedora Atomic
and other image-based systems): `${localEnv:HOME}` expands to /home/alice while the home's
real path is /var/home/alice. The text checks read both spellings; the walk on the real file
system (homepath.py) still decides what a source is."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mtgpu.cli.devcontainer import checked_devcontainer
from mtgpu.server.api.service import ServiceError
from mtgpu.server.api.workspaces import DevcontainerParts, WorkspaceService
from mtgpu.workspaces.errors import DevContainerError


@pytest.fixture
def linked_home(tmp_path) -> tuple[str, str]:
    """(HOME as the account spells it, the real path): TMP/home -> var/home, a folder `data`
    in the home and a symlink `out` from it to /etc."""
    real = tmp_path / "var" / "home" / "alice"
    (real / "data").mkdir(parents=True)
    (real / "out").symlink_to("/etc")
    (tmp_path / "home").symlink_to("var/home")
    return str(tmp_path / "home" / "alice"), str(real)


def _project(home: str, config: dict) -> str:
    folder = Path(home) / "proj" / ".devcontainer"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "devcontainer.json").write_text(json.dumps(config))
    return str(folder.parent)


def test_mounts_written_with_home_through_a_symlink_are_accepted(linked_home):
    home, real = linked_home
    project = _project(home, {"image": "localhost/base", "mounts": [
        "source=${localEnv:HOME}/data,target=/d,type=bind", f"source={real}/data,target=/r,type=bind"],
        "runArgs": ["-v", "${localEnv:HOME}/data:/v", "--mount", f"type=bind,source={real}/data,target=/m"]})
    dc = checked_devcontainer(project, home, {"HOME": home})
    assert [m.source for m in dc.mounts] == [f"{home}/data", f"{real}/data"]
    assert dc.workspace_mount.source == project
    assert dc.run_args[:2] == ("-v", f"{home}/data:/v")


def test_the_walk_still_refuses_a_symlink_out_of_a_home_reached_through_a_symlink(linked_home):
    home, real = linked_home
    project = _project(home, {"image": "localhost/base", "mounts": [
        "source=${localEnv:HOME}/out,target=/o,type=bind", "source=/etc,target=/e,type=bind"]})
    with pytest.raises(DevContainerError) as e:
        checked_devcontainer(project, home, {"HOME": home})
    shown = str(e.value)
    assert "bind source /etc is outside your home" in shown, shown  # the text: neither spelling
    project = _project(home, {"image": "localhost/base", "mounts": ["source=${localEnv:HOME}/out,target=/o,type=bind"]})
    with pytest.raises(DevContainerError) as e:
        checked_devcontainer(project, home, {"HOME": home})
    assert f"leaves your home through the symlink {real}/out -> /etc" in str(e.value), str(e.value)


def test_the_node_reads_both_spellings_of_the_accounts_home(linked_home):
    """The node's home is the account's (passwd: the symlinked spelling); a runArgs source
    written with the real path is in it too, and a way out through a symlink is not."""
    home, real = linked_home
    ws = WorkspaceService.__new__(WorkspaceService)  # the devcontainer checks use no member
    parts = DevcontainerParts(path=f"{home}/proj/.devcontainer/devcontainer.json", image="localhost/base",
                              mounts=[(f"{home}/data", "/d", False)], run_args=["-v", f"{real}/data:/v"])
    image, spec, _ = ws._from_devcontainer(parts, home)
    assert image == "localhost/base" and spec.run_args == ("-v", f"{real}/data:/v")
    parts.run_args = ["-v", f"{real}/out:/o"]
    with pytest.raises(ServiceError) as e:
        ws._from_devcontainer(parts, home)
    assert f"{real}/out -> /etc" in str(e.value), str(e.value)

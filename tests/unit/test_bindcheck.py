"""bindcheck: a bind's mounted inode, walked from a process's root, against its source
resolved inside the home (the process here is the test's own, whose root is the host's)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mtgpu.agent.podman.bindcheck import Bind, BindMismatch, check_binds
from mtgpu.workspaces.homepath import OutsideHome


@pytest.fixture()
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    (h / "proj").mkdir(parents=True)
    (h / "other").mkdir()
    (tmp_path / "outside").mkdir()
    return h


def test_a_target_that_is_the_sources_inode_passes(home):
    check_binds(os.getpid(), [Bind(f"{home}/proj", f"{home}/proj")], str(home))


def test_a_target_holding_another_inode_is_refused_naming_the_mount(home):
    with pytest.raises(BindMismatch, match=f"mount of {home}/proj at {home}/other is not {home}/proj"):
        check_binds(os.getpid(), [Bind(f"{home}/proj", f"{home}/other")], str(home))


def test_a_source_that_left_the_home_since_is_refused(home):
    os.rename(home / "proj", home / "proj.old")
    (home / "proj").symlink_to(home.parent / "outside")
    with pytest.raises(OutsideHome, match="leaves your home through the symlink"):
        check_binds(os.getpid(), [Bind(f"{home}/proj", str(home.parent / "outside"))], str(home))


def test_a_symlink_on_the_targets_path_is_not_followed(home):
    (home / "link").symlink_to("proj")
    with pytest.raises(BindMismatch, match="goes through a symlink of the image"):
        check_binds(os.getpid(), [Bind(f"{home}/proj", f"{home}/link")], str(home))


def test_the_nodes_own_sources_and_the_home_itself_are_not_the_tenants_to_swap(home, tmp_path):
    # podman's /etc/hosts and an admin's read-only root: mounted where they are, not checked
    check_binds(os.getpid(), [Bind("/etc/hosts", "/nonexistent/etc/hosts"), Bind(str(home), "/nowhere")], str(home))


def test_the_nodes_file_in_the_tenants_job_folder_must_still_be_a_regular_file(home, tmp_path):
    files = tmp_path / "jobs" / "7"
    files.mkdir(parents=True)
    (files / "entry").write_text("#!/bin/sh\n")
    check_binds(os.getpid(), [Bind(f"{files}/entry", f"{files}/entry")], str(home), str(files))
    os.rename(files / "entry", files / "entry.old")
    (files / "entry").symlink_to("/etc/hostname")
    with pytest.raises(BindMismatch, match="no longer a regular file"):
        check_binds(os.getpid(), [Bind(f"{files}/entry", f"{files}/entry")], str(home), str(files))


def test_a_source_in_the_home_is_checked_however_its_path_is_spelled(home):
    """runArgs' -v sources reach podman as written: '/HOME//proj' or '/HOME/./proj' pass the
    home rule (read by component) but did not start with '/HOME/', so the mounted inode of
    such a bind was never checked, and a swap between the member's check and runc's mount
    went through."""
    for spelled in (f"{home.parent}//{home.name}/proj", f"{home}/./proj", f"{home}//proj"):
        with pytest.raises(BindMismatch, match="is not"):
            check_binds(os.getpid(), [Bind(spelled, f"{home}/other")], str(home))
    check_binds(os.getpid(), [Bind(f"{home}/./proj", f"{home}/proj")], str(home))

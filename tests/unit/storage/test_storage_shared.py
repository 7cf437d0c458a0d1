"""storage.shared: what publishing read-only changes, and what it refuses to touch."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from mtgpu.storage.shared import (
    check_read_only,
    fixed_lines,
    interpreter_publish_root,
    problem_lines,
    publish_read_only,
    wanted_mode,
)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving files to root needs root")


def own(lines):
    """Lines about the tree itself, not its parents (pytest's tmp dirs are 0700)."""
    return [line for line in lines if "a parent of" not in line]


@pytest.mark.parametrize(
    "mode, wanted",
    [
        (stat.S_IFDIR | 0o777, 0o755),
        (stat.S_IFDIR | 0o700, 0o755),
        (stat.S_IFDIR | 0o1777, 0o1755),
        (stat.S_IFREG | 0o666, 0o644),
        (stat.S_IFREG | 0o600, 0o644),
        (stat.S_IFREG | 0o700, 0o755),
        (stat.S_IFREG | 0o4755, 0o755),
        (stat.S_IFREG | 0o2775, 0o755),
    ],
)
def test_wanted_mode_is_readable_by_all_and_writable_by_owner_only(mode, wanted):
    assert wanted_mode(mode) == wanted


@pytest.mark.parametrize("path", ["/", "/usr", "/home", "/etc", "/tmp", "/var/lib"])
def test_system_directories_are_never_published(path):
    lines = publish_read_only([Path(path)])
    assert len(lines) == 1 and "refused to publish a system directory" in lines[0]
    assert "refused" in check_read_only(path)[0]


def test_missing_and_relative_paths_are_reported(tmp_path):
    assert "does not exist" in publish_read_only([tmp_path / "nope"])[0]
    assert "not an absolute path" in publish_read_only([Path("data")])[0]


def test_interpreter_publish_root_never_widens_to_a_system_directory(tmp_path):
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    (env / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (env / "bin" / "python3").write_text("")
    assert interpreter_publish_root(env / "bin" / "python3") == env
    assert interpreter_publish_root(env) == env
    assert interpreter_publish_root(Path("/usr/bin/python3")) == Path("/usr/bin/python3")


@needs_root
def test_publishing_fixes_owner_and_write_bits_and_a_second_run_changes_nothing(tmp_path):
    top = tmp_path / "data"
    (top / "sub").mkdir(parents=True)
    f = top / "sub" / "x.bin"
    f.write_bytes(b"data")
    script = top / "run.sh"
    script.write_text("#!/bin/sh\n")
    for p, mode in ((top, 0o777), (top / "sub", 0o770), (f, 0o4666), (script, 0o700)):
        os.chown(p, 4242, 4242)
        os.chmod(p, mode)
    os.symlink("/etc/passwd", top / "link")
    os.lchown(top / "link", 4242, 4242)
    assert own(check_read_only(top))
    lines = publish_read_only([top])
    assert own(problem_lines(lines)) == []
    assert len(fixed_lines(lines)) == 5
    for p, mode in ((top, 0o755), (top / "sub", 0o755), (f, 0o644), (script, 0o755)):
        st = os.stat(p)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, mode), p
    assert os.lstat(top / "link").st_uid == 0
    assert os.stat("/etc/passwd").st_mode & 0o777 == 0o644  # the link's target is untouched
    assert own(check_read_only(top)) == []
    assert fixed_lines(publish_read_only([top])) == []


@needs_root
def test_publishing_is_bounded_and_says_where_it_stopped(tmp_path):
    for i in range(20):
        (tmp_path / f"f{i}").write_text("x")
        os.chmod(tmp_path / f"f{i}", 0o666)
    lines = publish_read_only([tmp_path], max_entries=5)
    assert any("stopped after 5 entries" in line for line in lines)
    assert len(fixed_lines(lines)) <= 5


def test_parents_writable_by_others_are_reported(tmp_path):
    parent = tmp_path / "open"
    (parent / "data").mkdir(parents=True)
    os.chmod(parent, 0o777)
    assert any("is writable by group or others" in line and str(parent) in line
               for line in check_read_only(parent / "data"))

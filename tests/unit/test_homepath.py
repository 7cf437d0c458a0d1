"""Bind sources resolved on the real file system and kept inside the home
(mtgpu/workspaces/homepath.py, issue 24): symlinks, `..` and special files cannot take a
workspace's mount out of the tenant's home; a symlink that stays in the home is followed."""

from __future__ import annotations

import errno
import os
import socket
import stat

import pytest

from mtgpu.workspaces.devcontainer import parse_devcontainer
from mtgpu.workspaces.homepath import (OutsideHome, checked_mounts, mount_sources, recheck_stored_sources, resolve_in_home,
                                      resolved_source, source_problems)
from mtgpu.workspaces.runargs import host_sources


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "homes" / "alice"
    (h / "data" / "sub").mkdir(parents=True)
    (h / "notes.txt").write_text("mine\n")
    (tmp_path / "homes" / "bob" / "secret").mkdir(parents=True)
    return h


def refusal(path, home) -> str:
    with pytest.raises(OutsideHome) as e:
        resolve_in_home(str(path), str(home))
    return str(e.value)


def test_a_symlink_to_etc_is_refused_naming_the_link(home):
    (home / "etcdir").symlink_to("/etc")
    msg = refusal(home / "etcdir", home)
    assert msg == f"leaves your home through the symlink {home}/etcdir -> /etc"
    assert "leaves your home" in refusal(home / "etcdir" / "passwd", home)


def test_a_symlink_to_a_device_folder_or_node_is_refused(home):
    (home / "gpudir").symlink_to("/dev")
    (home / "null").symlink_to("/dev/null")
    assert "through the symlink" in refusal(home / "gpudir", home)
    assert "through the symlink" in refusal(home / "null", home)


def test_special_files_in_the_home_are_refused_whatever_they_are(home):
    os.mknod(home / "dev-null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # root can; a tenant cannot
    os.mkfifo(home / "fifo")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(home / "agent.sock"))
    try:
        assert refusal(home / "dev-null", home).startswith("is a character device")
        assert refusal(home / "fifo", home).startswith("is a FIFO")
        assert refusal(home / "agent.sock", home).startswith("is a socket")
    finally:
        s.close()


def test_a_chain_of_symlinks_is_followed_to_its_end(home):
    (home / "c").symlink_to("/etc")
    (home / "b").symlink_to("c")
    (home / "a").symlink_to(str(home / "b"))
    assert "through the symlink" in refusal(home / "a", home)
    (home / "c").unlink()
    (home / "c").symlink_to("data/sub")
    with resolve_in_home(str(home / "a"), str(home)) as p:
        assert p.real == str(home / "data" / "sub") and p.is_dir


def test_dot_dot_may_climb_back_to_the_home_never_above(home):
    assert resolved_source(f"{home}/data/sub/../../notes.txt", str(home)) == str(home / "notes.txt")
    assert refusal(f"{home}/../bob/secret", home).startswith("leaves your home through '..'")
    (home / "up").symlink_to("../bob")
    assert refusal(home / "up" / "secret", home).startswith("leaves your home through '..'")


def test_another_tenants_home_is_out_of_reach_by_every_spelling(home):
    bob = home.parent / "bob"
    (home / "bob").symlink_to(str(bob))
    assert "through the symlink" in refusal(home / "bob" / "secret", home)
    assert refusal(bob / "secret", home) == f"is outside your home {home}"
    assert refusal(f"{home}bob/x", home) == f"is outside your home {home}"  # a prefix is not a folder


def test_a_symlink_that_stays_in_the_home_is_allowed(home):
    (home / "rel").symlink_to("data")
    (home / "abs").symlink_to(str(home / "data" / "sub"))
    (home / "data" / "back").symlink_to("../notes.txt")
    assert resolved_source(str(home / "rel" / "sub"), str(home)) == str(home / "data" / "sub")
    assert resolved_source(str(home / "abs"), str(home)) == str(home / "data" / "sub")
    with resolve_in_home(str(home / "data" / "back"), str(home)) as p:
        assert p.real == str(home / "notes.txt") and not p.is_dir
    assert resolved_source(str(home), str(home)) == str(home)


def test_loops_missing_sources_and_files_used_as_folders_are_refused(home):
    (home / "loop").symlink_to("loop")
    assert "more than 40 symlinks" in refusal(home / "loop", home)
    assert refusal(home / "nope", home) == f"does not exist: {home}/nope is missing; create it first"
    assert refusal(home / "notes.txt" / "x", home) == f"goes through {home}/notes.txt, which is not a folder"
    assert refusal("relative/path", home) == "is not an absolute path"


def test_the_held_descriptor_is_the_inode_that_was_checked(home):
    p = resolve_in_home(str(home / "data"), str(home))
    checked = os.fstat(p.fd).st_ino
    os.rename(home / "data", home / "moved")
    (home / "data").symlink_to("/etc")  # swapped after the check: the descriptor still holds the folder
    try:
        assert os.fstat(p.fd).st_ino == checked == os.stat(home / "moved").st_ino
    finally:
        p.close()


def test_hardlinks_name_only_files_of_the_same_file_system(home):
    """A hard link is another name of an inode the tenant could link (its own, or one it may
    read and write: fs.protected_hardlinks); /dev's device nodes live on devtmpfs, which no
    home shares, so they cannot be linked into it."""
    os.link(home / "notes.txt", home / "again.txt")
    assert resolved_source(str(home / "again.txt"), str(home)) == str(home / "again.txt")
    if os.stat("/dev/null").st_dev != os.stat(home).st_dev:
        with pytest.raises(OSError) as e:
            os.link("/dev/null", home / "null-link")
        assert e.value.errno in (errno.EXDEV, errno.EPERM)


def test_every_host_path_of_a_devcontainer_is_checked_naming_the_key_the_value_and_the_fix(home):
    (home / "proj").mkdir()
    (home / "gpudir").symlink_to("/dev")
    (home / "etcdir").symlink_to("/etc")
    text = ('{"image": "localhost/x", '
            '"mounts": ["source=${localEnv:HOME}/gpudir,target=/gpus,type=bind", "type=volume,source=v,target=/v",'
            ' "source=${localEnv:HOME}/data,target=/d,type=bind"],'
            '"runArgs": ["-v", "${localEnv:HOME}/etcdir:/e", "--mount=type=bind,source=${localEnv:HOME}/etcdir,target=/m"]}')
    dc = parse_devcontainer(text, config_path=f"{home}/proj/.devcontainer/devcontainer.json",
                            workspace_folder=f"{home}/proj", home=str(home), env={"HOME": str(home)})
    problems = {p.key: p for p in source_problems(mount_sources(dc.workspace_mount, dc.mounts, dc.run_args), str(home))}
    assert set(problems) == {"mounts[0]", "runArgs[0]", "runArgs[2]"}
    gpus = problems["mounts[0]"]
    assert gpus.value == f"type=bind,source={home}/gpudir,target=/gpus"
    assert gpus.message.startswith(f"bind source {home}/gpudir leaves your home through the symlink {home}/gpudir -> /dev;")
    assert "point the source at the real folder in your home" in gpus.message
    assert problems["runArgs[0]"].value == f"-v {home}/etcdir:/e"


def test_run_args_name_every_host_path_podman_would_open():
    args = ["--shm-size=1g", "-v", "/h/a:/a:ro", "--volume=named:/n", "-v", "/anonymous-in-container",
            "--mount", "type=bind,source=/h/b,target=/b", "--mount=type=volume,source=v,target=/v",
            "--env-file", "/h/.env", "-e", "X=/etc"]
    assert host_sources(args) == [("runArgs[1]", "-v /h/a:/a:ro", "/h/a"),
                                  ("runArgs[6]", "--mount type=bind,source=/h/b,target=/b", "/h/b"),
                                  ("runArgs[9]", "--env-file /h/.env", "/h/.env")]


def test_the_member_hands_podman_resolved_sources_and_names_the_mount_it_refuses(home):
    (home / "link").symlink_to("data/sub")
    assert checked_mounts([(f"{home}/link", "/w", True)], [], str(home)) == ((str(home / "data" / "sub"), "/w", True),)
    (home / "out").symlink_to("/etc")
    with pytest.raises(OutsideHome) as e:
        checked_mounts([(f"{home}/data", "/d", False), (f"{home}/out", "/o", False)], [], str(home))
    assert str(e.value).startswith(f"the mount of {home}/out at /o: bind source {home}/out leaves your home "
                                   f"through the symlink {home}/out -> /etc; a workspace mounts only")
    with pytest.raises(OutsideHome) as e:
        checked_mounts([], ["-v", f"{home}/out:/o"], str(home))
    assert str(e.value).startswith("runArgs[0] = '-v ") and f"host path {home}/out leaves your home" in str(e.value)


def test_a_stopped_containers_stored_sources_are_checked_again_and_the_nodes_own_left_alone(home):
    recheck_stored_sources(["/var/lib/mtgpu/jobs/1/entry", f"{home}/data", str(home)], str(home))
    os.rename(home / "data", home / "data.old")
    (home / "data").symlink_to("/dev")
    with pytest.raises(OutsideHome) as e:
        recheck_stored_sources(["/var/lib/mtgpu/jobs/1/entry", f"{home}/data"], str(home))
    assert str(e.value).startswith(f"the container's mount of {home}/data: bind source {home}/data leaves your home")


def test_a_home_that_cannot_be_opened_is_refused_naming_it_not_raised_as_an_os_error(tmp_path):
    """The member's create answered 500 (a bare FileNotFoundError) for a tenant whose home
    is missing on this node; every caller catches OutsideHome only."""
    gone = tmp_path / "homes" / "nobody"
    with pytest.raises(OutsideHome) as e:
        resolve_in_home(f"{gone}/data", str(gone))
    assert str(e.value) == f"cannot be resolved: your home {gone} cannot be opened (No such file or directory)"


def test_a_name_no_file_system_can_hold_is_refused_not_raised_as_a_value_error(home):
    """A NUL or a lone surrogate (json reads "\\ud800") made os.open raise ValueError, which
    no caller catches: the CLI's devcontainer check crashed with a traceback."""
    for bad in ("x\0y", "x\ud800"):
        with pytest.raises(OutsideHome) as e:
            resolve_in_home(f"{home}/{bad}", str(home))
        assert str(e.value).startswith("holds a character no file name can (")


def test_names_that_are_not_utf8_are_shown_escaped_so_the_refusal_can_be_sent(home):
    """A symlink whose target is not UTF-8 (ln -s $'/etc/\\xff') made a message holding a
    lone surrogate: the server's JSON answer (and a job's reason) could not be encoded."""
    os.symlink(b"/etc/\xff", os.fsencode(home / "bad"))
    os.symlink(b"\xfe/x", os.fsencode(home / "rel"))
    for source in (home / "bad", home / "rel"):
        problems = source_problems([("mounts[0]", str(source), str(source))], str(home))
        assert len(problems) == 1
        problems[0].render().encode("utf-8")  # raised UnicodeEncodeError
    assert refusal(home / "bad", home) == f"leaves your home through the symlink {home}/bad -> /etc/\\xff"
    assert refusal(home / "rel", home) == f"does not exist: {home}/\\xfe is missing; create it first"


def test_a_path_longer_than_the_kernel_takes_once_resolved_is_refused(home):
    """Every folder of the walk is held open (for '..'): a path of thousands of nested
    folders, or one made longer by symlinks, held as many descriptors in the member's
    process. The walk stops where the resolved path passes PATH_MAX (4096 bytes), which
    podman could not mount anyway."""
    name = "n" * 250
    fd = os.open(home, os.O_PATH)
    try:
        for _ in range(17):  # 17 levels of 251 bytes: 4267 bytes below the home, too long for mkdir(path)
            os.mkdir(name, dir_fd=fd)
            nxt = os.open(name, os.O_PATH, dir_fd=fd)
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)
    msg = refusal(str(home) + f"/{name}" * 17, home)
    assert msg.startswith("is longer than the 4095 bytes a path may have once resolved (Linux's PATH_MAX)"), msg
    (home / "deep").symlink_to("/".join([name] * 15))  # as long through a symlink
    assert refusal(f"{home}/deep/{name}/{name}", home).startswith("is longer than the 4095 bytes")
    assert resolved_source(str(home) + f"/{name}" * 2, str(home)) == str(home) + f"/{name}" * 2

"""A workspace mounts only what resolves inside its tenant's home, on the real file system
(issue 24, point 1): a symlink in the home to the GPUs' device folder, to /etc or to another
tenant's home is refused when `mt-container create --devcontainer` reads the file, again by
the node when a request skips the client, and again by the member each time it starts the
container, so a folder swapped for a symlink after the check is refused too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_workspaces import image, mtc, mtc_json, running, wnode  # noqa: F401 (fixtures)
from tests.support.node import wait_for
from tests.support.tenant_api import TenantCallError, TenantSession


def _owned(user, *paths: Path) -> None:
    for p in paths:
        os.lchown(p, user.uid, user.gid)


def _folder_and_link(user, folder: str, file: str, text: str, link: str, target: str) -> None:
    """~/folder holding `file` with `text`, and the symlink ~/link -> target, all the tenant's."""
    home = Path(user.home)
    (home / folder).mkdir()
    (home / folder / file).write_text(text)
    (home / link).symlink_to(target)
    _owned(user, home / folder, home / folder / file, home / link)


def _project(user, name: str, config: dict) -> Path:
    project = Path(user.home) / name
    (project / ".devcontainer").mkdir(parents=True)
    (project / ".devcontainer" / "devcontainer.json").write_text(json.dumps(config))
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(project)], check=True)
    return project


def test_a_symlink_out_of_the_home_is_refused_naming_the_mount_the_value_and_the_fix(wnode, alice, bob, image):
    home = Path(alice.home)
    gpus = Path("/dev/mtgpu")
    assert gpus.is_dir(), "the simulated GPUs' device folder is missing"
    links = {"gpudir": gpus, "etcdir": Path("/etc"), "bobs": Path(bob.home)}
    for name, target in links.items():
        (home / name).symlink_to(target)
        _owned(alice, home / name)
    project = _project(alice, "escape", {
        "image": image,
        "mounts": ["source=${localEnv:HOME}/gpudir,target=/gpus,type=bind"],
        "runArgs": ["-v", "${localEnv:HOME}/etcdir:/host-etc", "--mount", "type=bind,source=${localEnv:HOME}/bobs,target=/b"],
    })
    r = mtc(wnode, alice, "create", "--devcontainer", str(project))
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    err = r.stderr
    assert f"mounts[0] = 'type=bind,source={home}/gpudir,target=/gpus'" in err, err
    assert f"bind source {home}/gpudir leaves your home through the symlink {home}/gpudir -> {gpus}" in err, err
    assert f"runArgs[0] = '-v {home}/etcdir:/host-etc'" in err and f"{home}/etcdir -> /etc" in err, err
    assert f"{home}/bobs -> {bob.home}" in err, err
    assert "point the source at the real folder in your home, or use a named volume" in err, err
    assert not mtc_json(wnode, alice, "list"), "a refused workspace was created"
    # a symlink that stays in the home is followed
    _folder_and_link(alice, "data", "f", "in the home\n", "datalink", "data")
    ok = _project(alice, "inside", {"image": image, "mounts": ["source=${localEnv:HOME}/datalink,target=/d,type=bind"]})
    mtc_json(wnode, alice, "create", "--devcontainer", str(ok), "--name", "inside")
    running(wnode, alice, "inside")
    r = mtc(wnode, alice, "exec", "inside", "--", "cat", "/d/f")
    assert r.returncode == 0 and r.stdout == "in the home\n", (r.stdout, r.stderr)
    assert mtc(wnode, alice, "rm", "inside").returncode == 0


def test_the_node_refuses_a_request_that_skips_the_client(wnode, alice, image):
    home = Path(alice.home)
    if not (home / "gpudir").is_symlink():
        (home / "gpudir").symlink_to("/dev/mtgpu")
    parts = {"path": f"{home}/x/.devcontainer/devcontainer.json", "image": image,
             "mounts": [[f"{home}/gpudir", "/gpus", False]]}
    with TenantSession(wnode.socket_path, alice) as s:
        with pytest.raises(TenantCallError) as e:
            s.call("create_workspace", {"devcontainer": parts})
        assert e.value.refused and f"{home}/gpudir -> /dev/mtgpu" in str(e.value), str(e.value)
        # the text reads {home}/passwd; the kernel reads /etc/passwd ('..' of the link's target)
        if not (home / "sshconf").is_symlink():
            (home / "sshconf").symlink_to("/etc/ssh")
        parts["mounts"] = []
        parts["run_args"] = ["-v", f"{home}/sshconf/../passwd:/e"]
        with pytest.raises(TenantCallError) as e:
            s.call("create_workspace", {"devcontainer": parts})
        assert f"{home}/sshconf -> /etc/ssh" in str(e.value), str(e.value)
    assert not mtc_json(wnode, alice, "list")


def test_a_folder_swapped_for_a_symlink_after_create_is_refused_when_the_container_starts(wnode, alice, image):
    """The member hands podman the resolved path (~/work, not the link ~/current) and checks
    at every start both what the file names and what the stopped container holds, because
    podman follows a source again each time it starts a container."""
    home = Path(alice.home)
    for d in ("work", "other"):
        (home / d).mkdir()
    (home / "current").symlink_to("work")
    _owned(alice, home / "work", home / "other", home / "current")
    project = _project(alice, "swap", {"image": image, "mounts": ["source=${localEnv:HOME}/current,target=/w,type=bind"]})
    mtc_json(wnode, alice, "create", "--devcontainer", str(project), "--name", "swap")
    ws = running(wnode, alice, "swap")
    r = wnode.run_cli("mtgpu.cli.podman", alice, "inspect", "--format", "{{json .Mounts}}", ws["workspace"]["container"])
    assert {"Source": f"{home}/work", "Destination": "/w"}.items() <= next(
        m for m in json.loads(r.stdout) if m["Destination"] == "/w").items(), r.stdout
    assert mtc_json(wnode, alice, "stop", "swap")["state"] == "stopped"
    # after the check: the link the file names points elsewhere in the home, the folder it held is a way out
    (home / "current").unlink()
    (home / "current").symlink_to("other")
    os.rename(home / "work", home / "work.old")
    (home / "work").symlink_to("/dev/mtgpu")
    _owned(alice, home / "current", home / "work")
    mtc(wnode, alice, "start", "swap")
    job = wait_for("the start to be refused", lambda: "could not start" in (j := wnode.job(ws["id"]))["reason"] and j,
                   timeout_s=90, interval_s=0.3)
    assert job["state"] == "stopped", job  # a workspace that cannot start is stopped again, kept
    assert (f"the container's mount of {home}/work: bind source {home}/work leaves your home through the symlink "
            f"{home}/work -> /dev/mtgpu") in job["reason"], job
    r = wnode.run_cli("mtgpu.cli.podman", alice, "ps", "--filter", "status=running", "--format", "{{.Names}}")
    assert ws["workspace"]["container"] not in r.stdout.split(), "the container ran with the swapped mount"
    assert mtc(wnode, alice, "rm", "swap").returncode == 0


def _cgroup_of(pid: int, controller: str = "devices") -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(",") or (not names and controller == "unified"):
            return path
    return ""


def test_what_runc_mounted_is_checked_before_the_container_runs(wnode, alice, image):
    """runc looks a source up again after the member's check, in the tenant's rootless mount
    namespace: there the tenant mounts the GPUs' device folder over a plain folder of its home
    (what a folder swapped for a symlink between the check and runc's mount gives, but at a
    moment the test controls). Every check on the member's file system passes (a plain
    folder); the container is made, mounted by runc, checked by its mount's inode, and
    refused before anything of it runs. Without the mount, the same workspace runs, its
    conmon and first process in the job's cgroup, as with `podman run` under the shim."""
    home = Path(alice.home)
    (home / "plain").mkdir()
    (home / "plain" / "mine").write_text("the home's folder\n")
    _owned(alice, home / "plain", home / "plain" / "mine")
    project = _project(alice, "over", {"image": image, "mounts": ["source=${localEnv:HOME}/plain,target=/p,type=bind"]})
    r = wnode.run_cli("mtgpu.cli.podman", alice, "unshare", "mount", "--bind", "/dev/mtgpu", str(home / "plain"))
    assert r.returncode == 0, (r.stdout, r.stderr)
    try:
        r = wnode.run_cli("mtgpu.cli.podman", alice, "unshare", "ls", str(home / "plain"))
        assert "mine" not in r.stdout.split(), ("the tenant's mount did not cover the folder", r.stdout)
        r = mtc(wnode, alice, "create", "--devcontainer", str(project), "--name", "over")
        assert r.returncode != 0, ("the workspace ran with the GPUs' folder at /p", r.stdout, r.stderr)
        shown = r.stdout + r.stderr
        assert f"the container's mount of {home}/plain at /p is not {home}/plain: runc mounted devtmpfs" in shown, shown
        assert "mounted over in your own namespace" in shown, shown
        r = wnode.run_cli("mtgpu.cli.podman", alice, "ps", "-a", "--format", "{{.Names}} {{.Status}}")
        assert "over" not in r.stdout and not any("Up" in line for line in r.stdout.splitlines()), r.stdout
        assert mtc(wnode, alice, "rm", "over").returncode == 0
    finally:
        wnode.run_cli("mtgpu.cli.podman", alice, "unshare", "umount", str(home / "plain"))
    mtc_json(wnode, alice, "create", "--devcontainer", str(project), "--name", "over2")
    ws = running(wnode, alice, "over2")
    r = mtc(wnode, alice, "exec", "over2", "--", "cat", "/p/mine")
    assert r.returncode == 0 and r.stdout == "the home's folder\n", (r.stdout, r.stderr)
    name = ws["workspace"]["container"]
    r = wnode.run_cli("mtgpu.cli.podman", alice, "inspect", "--format", "{{.State.Pid}} {{.State.ConmonPid}}", name)
    pids = [int(x) for x in r.stdout.split()]
    assert len(pids) == 2 and all(pids), r.stdout
    for pid in pids:  # born in the job's cgroup, under its device fence
        assert _cgroup_of(pid).rstrip("/").split("/")[-1].startswith(f"job-{ws['id']}"), (pid, _cgroup_of(pid))
    assert mtc(wnode, alice, "rm", "over2").returncode == 0


_SWAPPER = """
import os, sys, time
home, stop = sys.argv[1], sys.argv[2]
os.chdir(home)
end = time.monotonic() + 600
while not os.path.exists(stop) and time.monotonic() < end:
    os.rename("loopwork", "loop.dir"); os.rename("loop.link", "loopwork")  # ~/loopwork: a symlink to the GPUs' folder
    time.sleep(0.002)
    os.rename("loopwork", "loop.link"); os.rename("loop.dir", "loopwork")  # ~/loopwork: the home's folder again
    time.sleep(0.002)
"""


def test_a_folder_swapped_in_a_loop_never_reaches_the_container(wnode, alice, image):
    """A second process of the tenant's swaps ~/loopwork between its folder and a symlink to the
    GPUs' device folder, every few milliseconds, while the workspace is started again and
    again: whatever moment the swap hits (before the member's check, between it and runc's
    mount, after), a container that runs has the home's folder at /w, never the device
    folder; the others are refused or fail, and are stopped."""
    home = Path(alice.home)
    _folder_and_link(alice, "loopwork", "mine", "the home's folder\n", "loop.link", "/dev/mtgpu")
    project = _project(alice, "loop", {"image": image, "mounts": ["source=${localEnv:HOME}/loopwork,target=/w,type=bind"]})
    mtc_json(wnode, alice, "create", "--devcontainer", str(project), "--name", "loop")
    running(wnode, alice, "loop")
    assert mtc_json(wnode, alice, "stop", "loop")["state"] == "stopped"
    stop_file = home / "swapper.stop"
    swapper = subprocess.Popen([sys.executable, "-c", _SWAPPER, str(home), str(stop_file)], user=alice.uid,
                               group=alice.gid, extra_groups=[], cwd="/", stderr=subprocess.PIPE)
    outcomes = []
    try:
        for _ in range(10):
            r = mtc(wnode, alice, "start", "loop")
            if r.returncode != 0:
                why = (r.stdout + r.stderr).strip()
                outcomes.append("refused by the mount check" if "runc mounted" in why else
                                "refused before podman" if "leaves your home" in why else f"failed: {why[-200:]}")
                continue
            seen = mtc(wnode, alice, "exec", "loop", "--", "ls", "/w")
            outcomes.append(f"ran, /w: {seen.stdout.split()}")
            assert seen.returncode == 0 and seen.stdout.split() == ["mine"], ("the container saw", seen.stdout, outcomes)
            assert mtc_json(wnode, alice, "stop", "loop")["state"] == "stopped"
    finally:
        stop_file.touch()
        try:
            swapper.wait(timeout=30)
        finally:
            if swapper.poll() is None:
                swapper.kill()
                swapper.wait()
    assert swapper.returncode == 0, swapper.stderr.read()
    print(outcomes)
    assert mtc(wnode, alice, "rm", "loop").returncode == 0


def test_a_folder_named_with_a_colon_and_a_comma_is_mounted(wnode, alice, image):
    """The member hands podman each bind as `--mount`, quoted as the CSV podman reads: `-v
    SOURCE:TARGET` was cut at the folder's ':' (and its `--mount` string at ','), so the
    workspace could not start."""
    home = Path(alice.home)
    _folder_and_link(alice, "run:2,b", "f", "odd name\n", "odd.link", "run:2,b")
    project = _project(alice, "oddname", {"image": image, "mounts": [
        {"type": "bind", "source": "${localEnv:HOME}/run:2,b", "target": "/data:1,2"},
        "type=bind,\"source=${localEnv:HOME}/odd.link\",target=/l"]})
    r = mtc(wnode, alice, "create", "--devcontainer", str(project), "--name", "oddname")
    assert r.returncode == 0, (r.stdout, r.stderr)
    running(wnode, alice, "oddname")
    for path in ("/data:1,2/f", "/l/f"):
        r = mtc(wnode, alice, "exec", "oddname", "--", "cat", path)
        assert r.returncode == 0 and r.stdout == "odd name\n", (path, r.stdout, r.stderr)
    assert (home / "run:2,b").is_dir()
    assert mtc(wnode, alice, "rm", "oddname").returncode == 0


def test_a_workspace_mount_or_project_folder_that_is_a_symlink_out_of_the_home_is_refused(wnode, alice, image, base):
    """workspaceMount is a host path like any other: written as a symlink out of the home, or
    left to its default (the project folder) where the project folder itself is a symlink out
    of the home, the file is refused naming workspaceMount, the value and the fix."""
    home = Path(alice.home)
    (home / "wsetc").symlink_to("/etc")
    _owned(alice, home / "wsetc")
    project = _project(alice, "wsmount", {
        "image": image, "workspaceFolder": "/workspaces/w",
        "workspaceMount": "source=${localEnv:HOME}/wsetc,target=/workspaces/w,type=bind"})
    r = mtc(wnode, alice, "create", "--devcontainer", str(project))
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    err = r.stderr
    assert f"workspaceMount = 'type=bind,source={home}/wsetc," in err, err  # the value (long ones are cut)
    assert f"bind source {home}/wsetc leaves your home through the symlink {home}/wsetc -> /etc" in err, err
    assert "point the source at the real folder in your home, or use a named volume" in err, err
    # the project folder itself: ~/projlink -> a folder of alice's outside her home (a scratch folder)
    outside = base / "proj"
    (outside / ".devcontainer").mkdir(parents=True)
    (outside / ".devcontainer" / "devcontainer.json").write_text(json.dumps({"image": image}))
    subprocess.run(["chown", "-R", f"{alice.uid}:{alice.gid}", str(outside)], check=True)
    (home / "projlink").symlink_to(outside)
    _owned(alice, home / "projlink")
    r = mtc(wnode, alice, "create", "--devcontainer", str(home / "projlink"))
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    err = r.stderr
    assert f"workspaceMount = 'type=bind,source={home}/projlink," in err, err
    assert f"bind source {home}/projlink leaves your home through the symlink {home}/projlink -> {outside}" in err, err
    assert "point the source at the real folder in your home, or use a named volume" in err, err
    assert not mtc_json(wnode, alice, "list"), "a refused workspace was created"

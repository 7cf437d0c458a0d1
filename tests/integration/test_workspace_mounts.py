"""A workspace mounts only what resolves inside its tenant's home, on the real file system
(issue 24, point 1): a symlink in the home to the GPUs' device folder, to /etc or to another
tenant's home is refused when `mt-container create --devcontainer` reads the file, again by
the node when a request skips the client, and again by the member each time it starts the
container, so a folder swapped for a symlink after the check is refused too."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_workspaces import image, mtc, mtc_json, running, wnode  # noqa: F401 (fixtures)
from tests.support.node import wait_for
from tests.support.tenant_api import TenantCallError, TenantSession


def _owned(user, *paths: Path) -> None:
    for p in paths:
        os.lchown(p, user.uid, user.gid)


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
    (home / "data").mkdir()
    (home / "data" / "f").write_text("in the home\n")
    (home / "datalink").symlink_to("data")
    _owned(alice, home / "data", home / "data" / "f", home / "datalink")
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

"""Workspaces' lifecycle as a tenant sees it from mt-container (issue 24): a failed exec
leaves no session that keeps the workspace from idle culling; create and start wait the
same way and exit non-zero, saying why, when the workspace cannot run; a devcontainer
`build` on a member that runs no tenant's own image is refused before podman builds.
Real server, real tenants, real rootless podman."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.integration.test_workspaces import _staged, mtc, mtc_json, running
from tests.support.images import busybox_image, podman_missing
from tests.support.node import running_node, wait_for
from tests.support.users import can_create_users

if can_create_users() or podman_missing():
    pytest.skip(can_create_users() or podman_missing(), allow_module_level=True)


@pytest.fixture(scope="module")
def image():
    with busybox_image() as name:
        yield name


@pytest.fixture(scope="module")
def lnode(image):
    """Tenants' own images not allowed; a template whose command does not exist in the image."""
    templates = {"plain": image, "broken": {"image": image, "command": ["/no/such/command"]}}
    with running_node([], CONTAINERS={"enabled": True, "templates": templates}) as node:
        wait_for("the image to be staged", lambda: image in _staged(node), timeout_s=120)
        yield node


def test_a_failed_exec_ends_its_session_and_the_idle_workspace_is_then_culled(image, alice):
    # Busy (CPU, as in test_workspaces' busy one) until the test says so: the failed exec must
    # reach a running workspace, which slow CLIs on a loaded machine could let idle culling stop first.
    go = Path(alice.home) / "go-idle"
    busy = (f"while [ ! -e {go} ]; do i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; sleep 0.05; done; "
            "exec sleep 1000000")
    templates = {"held": {"image": image, "command": busy}}
    with running_node([], CONTAINERS={"enabled": True, "templates": templates, "idle_timeout": "10s"}) as node:
        wait_for("the image to be staged", lambda: image in _staged(node), timeout_s=120)
        mtc_json(node, alice, "create", "--template", "held", "--name", "leaky")
        ws = running(node, alice, "leaky")
        r = mtc(node, alice, "exec", "leaky", "--", "nosuchcmd")
        assert r.returncode == 127 and "nosuchcmd" in r.stderr, (r.returncode, r.stdout, r.stderr)  # podman's own
        go.write_text("")  # now idle: nothing attached, no CPU

        def culled():
            w = mtc_json(node, alice, "show", "leaky")
            return w if w["state"] == "stopped" else None
        # idle 10 s, sampled every 2 s: stopped about 14 s after the go; 180 s is for a loaded machine
        w = wait_for("the idle workspace to be stopped after a failed exec", culled, timeout_s=180, interval_s=1)
        assert "idle (idle_timeout 10s)" in w["reason"], w["reason"]
        assert "removed exec session" in node.server_log(), node.server_log()[-3000:]
        # its container is still there (stopped, kept) and lists no exec session any more
        r = node.run_cli("mtgpu.cli.podman", alice, "container", "inspect", "--format", "{{len .ExecIDs}}",
                         ws["workspace"]["container"])
        assert r.returncode == 0 and r.stdout.strip() == "0", (r.stdout, r.stderr)


def test_create_exits_non_zero_with_the_reason_when_the_workspace_cannot_run(lnode, alice):
    r = mtc(lnode, alice, "create", "--template", "broken", "--name", "broken")
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "workspace broken" in r.stderr and "could not start" in r.stderr, r.stderr
    assert "exited with code 127" in r.stderr and "/no/such/command" in r.stderr, r.stderr  # its output's end
    assert mtc(lnode, alice, "rm", "broken").returncode == 0


def test_start_waits_until_the_workspace_runs_as_create_does(lnode, alice):
    mtc_json(lnode, alice, "create", "--template", "plain", "--name", "again")
    assert mtc_json(lnode, alice, "stop", "again")["state"] == "stopped"
    ws = mtc_json(lnode, alice, "start", "again")
    assert ws["state"] == "running" and ws["workspace"]["container"], ws
    mtc_json(lnode, alice, "stop", "again")
    ws = mtc_json(lnode, alice, "start", "again", "--no-wait")
    assert ws["state"] in ("queued", "running"), ws
    running(lnode, alice, "again")
    assert mtc(lnode, alice, "rm", "again").returncode == 0


def test_a_devcontainer_build_is_refused_before_podman_builds_where_own_images_are_not_allowed(lnode, alice, image):
    project = Path(alice.home) / "nobuild"
    (project / ".devcontainer").mkdir(parents=True)
    (project / ".devcontainer" / "Dockerfile").write_text(f"FROM {image}\nRUN echo built > /built-file\n")
    (project / ".devcontainer" / "devcontainer.json").write_text('{"build": {"dockerfile": "Dockerfile"}}')
    subprocess.run(["chown", "-R", f"{alice.uid}:{alice.gid}", str(project)], check=True)
    r = mtc(lnode, alice, "create", "--devcontainer", str(project))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "allow_user_images = false" in r.stderr and "node-a" in r.stderr and "building" not in r.stderr, r.stderr
    r = lnode.run_cli("mtgpu.cli.podman", alice, "images", "--format", "json")
    assert r.returncode == 0 and "devcontainer-" not in r.stdout, r.stdout
    assert not [w for w in mtc_json(lnode, alice, "list") if w["workspace"]["name"] == "nobuild"]


def test_a_local_feature_is_refused_before_podman_builds_where_own_images_are_not_allowed(lnode, alice, image):
    """A local Feature makes an image of the tenant's own (its install.sh built on `image`), as a
    `build` does: where tenants' own images do not run it is refused before anything is built."""
    project = Path(alice.home) / "nofeature"
    feature = project / ".devcontainer" / "x"
    feature.mkdir(parents=True)
    (feature / "devcontainer-feature.json").write_text('{"id": "x"}')
    (feature / "install.sh").write_text("#!/bin/sh\necho built > /built-file\n")
    (project / ".devcontainer" / "devcontainer.json").write_text(
        '{"image": "%s", "features": {"./x": {}}}' % image)
    subprocess.run(["chown", "-R", f"{alice.uid}:{alice.gid}", str(project)], check=True)
    r = mtc(lnode, alice, "create", "--devcontainer", str(project))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "allow_user_images = false" in r.stderr and "node-a" in r.stderr and "building" not in r.stderr, r.stderr
    assert "its Features (./x) makes an image of your own" in r.stderr, r.stderr
    r = lnode.run_cli("mtgpu.cli.podman", alice, "images", "--format", "json")
    assert r.returncode == 0 and "devcontainer-" not in r.stdout, r.stdout
    assert not [w for w in mtc_json(lnode, alice, "list") if w["workspace"]["name"] == "nofeature"]


def test_a_registry_feature_is_refused_as_an_image_of_ones_own_before_anything_is_fetched(lnode, alice, image):
    """A Feature from a registry, staged or not, is built into an image of the tenant's own like
    a local one: where those do not run, it is refused first (not as "not staged")."""
    project = Path(alice.home) / "noregfeature"
    (project / ".devcontainer").mkdir(parents=True)
    (project / ".devcontainer" / "devcontainer.json").write_text(
        '{"image": "%s", "features": {"ghcr.io/devcontainers/features/node:1": {}}}' % image)
    subprocess.run(["chown", "-R", f"{alice.uid}:{alice.gid}", str(project)], check=True)
    r = mtc(lnode, alice, "create", "--devcontainer", str(project))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert ("its Feature ghcr.io/devcontainers/features/node:1 makes an image of your own, to run on node-a, which "
            "does not run tenants' own images ([CONTAINERS] allow_user_images = false)") in r.stderr, r.stderr
    assert "not staged" not in r.stderr and "building" not in r.stderr, r.stderr

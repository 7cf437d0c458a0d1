"""`${containerEnv:...}` in a real workspace's lifecycle commands (issue 24): the fixture
lifecycle-container-env (every hook, the string, list and object forms) made into a workspace
on a real node, its commands run by the container's entry, their output read back with
`mt-container exec`. The values are the reference's (@devcontainers/cli run-user-commands,
the fixture's comment) for this image, which sets no Env: podman's PATH, containerEnv's
names, defaults for the rest. Before, the shell was handed `${containerEnv:X}` and busybox
sh made it nothing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from mtgpu.workspaces.jsonc import loads_jsonc
from mtgpu.workspaces.variables import PODMAN_DEFAULT_PATH
from tests.integration.test_workspaces import image, mtc, mtc_json, running, wnode  # noqa: F401 (fixtures)
from tests.support.node import wait_for

FIXTURE = (Path(__file__).resolve().parents[1] / "fixtures" / "devcontainer" / "lifecycle-container-env"
           / ".devcontainer" / "devcontainer.json")


def test_lifecycle_commands_read_the_containers_environment(wnode, alice, image):
    config = loads_jsonc(FIXTURE.read_text())
    config["image"] = image
    project = Path(alice.home) / "lifeenv"
    (project / ".devcontainer").mkdir(parents=True)
    (project / ".devcontainer" / "devcontainer.json").write_text(json.dumps(config))
    subprocess.run(["chown", "-R", f"{alice.uid}:{alice.gid}", str(project)], check=True)
    mtc_json(wnode, alice, "create", "--devcontainer", str(project), "--name", "lifeenv")
    running(wnode, alice, "lifeenv")
    out = wait_for("the lifecycle commands", lambda: (r := mtc(wnode, alice, "exec", "lifeenv", "--", "cat", "/tmp/out"))
                   .returncode == 0 and "attach=" in r.stdout and r.stdout, timeout_s=60, interval_s=0.3)
    assert out.split("\n")[:-1] == ["on=over/c1/dflt/d2//", "post=c1", "start=over", f"attach={PODMAN_DEFAULT_PATH}"], out
    assert mtc(wnode, alice, "rm", "lifeenv").returncode == 0

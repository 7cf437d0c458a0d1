"""Real devcontainer.json files on real rootless Podman as a real tenant (issue 24, points 7
and 8): `${containerEnv:PATH}` in remoteEnv, the VS Code Dev Containers templates as they are
written (tests/fixtures/devcontainer/template-*, whose sources are in their README), the
debugger's SYS_PTRACE and seccomp=unconfined, and a local Feature built into the image.

No registry is reachable here, so the templates' images (mcr.microsoft.com/devcontainers/...)
are mapped onto the node's staged busybox image: the test rewrites the `image` (and a
Dockerfile's FROM) of its copy of each template to that image's name, and nothing else."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_workspaces import image, mtc, mtc_json, running, wnode  # noqa: F401 (fixtures)
from tests.support.node import wait_for

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "devcontainer"


def _owned(user, project: Path) -> Path:
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(project)], check=True)
    return project


def _project(user, name: str, config: dict, files: dict[str, str] | None = None) -> Path:
    project = Path(user.home) / name
    (project / ".devcontainer").mkdir(parents=True)
    (project / ".devcontainer" / "devcontainer.json").write_text(json.dumps(config))
    for rel, text in (files or {}).items():
        (project / ".devcontainer" / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / ".devcontainer" / rel).write_text(text)
    return _owned(user, project)


def _exec(node, user, ws: str, script: str) -> str:
    r = mtc(node, user, "exec", ws, "--", "sh", "-c", script)
    assert r.returncode == 0, (r.stdout, r.stderr, node.server_log()[-2000:])
    return r.stdout


def test_remote_env_reads_the_images_path_through_container_env(wnode, alice, image):
    project = _project(alice, "cenv", {
        "name": "cenv", "build": {"dockerfile": "Dockerfile"},
        "containerEnv": {"TOOLS": "/opt/tools"},
        "remoteEnv": {"PATH": "${containerEnv:PATH}:/x", "TOOLBIN": "${containerEnv:TOOLS}/bin",
                      "MISSING": "${containerEnv:NOT_SET:dflt}"},
    }, {"Dockerfile": f"FROM {image}\nENV PATH=/opt/tools/bin:/usr/bin:/bin\n"})
    mtc_json(wnode, alice, "create", "--devcontainer", str(project))
    running(wnode, alice, "cenv")
    out = _exec(wnode, alice, "cenv", 'echo "$PATH"; echo "$TOOLBIN"; echo "$MISSING"')
    assert out.split() == ["/opt/tools/bin:/usr/bin:/bin:/x", "/opt/tools/bin", "dflt"], out
    r = mtc(wnode, alice, "exec", "cenv", "--", "sh", "-c", "exit 7")  # a bare `sh`, found through that PATH
    assert r.returncode == 7, (r.returncode, r.stderr)
    assert mtc(wnode, alice, "rm", "cenv").returncode == 0

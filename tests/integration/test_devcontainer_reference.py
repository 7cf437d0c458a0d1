"""The devcontainer.json reader checked against the reference implementation,
`@devcontainers/cli` (pinned in tests/tools/devcontainer-cli; install it with
`npm ci --prefix tests/tools/devcontainer-cli`).

For every fixture in tests/fixtures/devcontainer, `devcontainer read-configuration`
prints the configuration as it parsed it (comments gone, variables substituted) and the
workspace folder and mount it computed; each field both readers produce must agree.
The corpus holds the VS Code Dev Containers templates as written (template-*, each with its
SOURCE), the debugger's options, a local Feature. The fixtures are copied to a temporary "home" outside any git repository, and the
reference is told not to mount the git root, so both see the same project folder.

The reference runs no container here. Its one engine call in `read-configuration` is
`ps -q -a --filter label=...` (is there a container of this folder already?), so it is
given a stand-in engine that answers "none": the check needs neither podman nor root's
podman store. (Without a working `--docker-path` it exits 1 without a word.)
`--include-merged-configuration` is not used: it inspects, then pulls, the image.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from mtgpu.workspaces import DevContainer, DevContainerError, load_devcontainer

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "devcontainer"
CLI = REPO / "tests" / "tools" / "devcontainer-cli" / "node_modules" / ".bin" / "devcontainer"
ACCEPTED = sorted(p.name for p in FIXTURES.iterdir() if not p.name.startswith("refused-"))
REFUSED = sorted(p.name for p in FIXTURES.iterdir() if p.name.startswith("refused-"))
TIMEOUT_S = 60



def _why_no_reference() -> str | None:
    if shutil.which("node") is None:
        return "the reference @devcontainers/cli needs Node.js 20 or later, and node is not installed"
    version = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    if int(version.lstrip("v").split(".")[0] or 0) < 20:
        return f"the reference @devcontainers/cli needs Node.js 20 or later, and node is {version}"
    if not CLI.exists():
        return "the reference @devcontainers/cli is not installed: npm ci --prefix tests/tools/devcontainer-cli"
    return None


if _why_no_reference():
    pytest.skip(_why_no_reference(), allow_module_level=True)


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    h = tmp_path_factory.mktemp("devcontainer-ref") / "home"
    shutil.copytree(FIXTURES, h)
    return h


@pytest.fixture(scope="module")
def env(home) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "MTGPU_FIXTURE_VAR": "v"}


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Path:
    stub = tmp_path_factory.mktemp("engine") / "podman"
    stub.write_text("#!/bin/sh\n# stands in for podman ps: no container of this folder exists\nexit 0\n")
    stub.chmod(0o755)
    return stub


@pytest.fixture(scope="module")
def reference(home, env, engine):
    """fixture name -> what `devcontainer read-configuration` printed for it."""

    def read(name: str) -> dict:
        cmd = [str(CLI), "read-configuration", "--docker-path", str(engine), "--mount-workspace-git-root", "false",
               "--workspace-folder", str(home / name)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        assert done.returncode == 0, f"the reference refused {name}: {done.stderr[-2000:]}"
        return json.loads(done.stdout)

    return {name: read(name) for name in ACCEPTED + REFUSED}


# -------------------------------------------- each reader's output, in one comparable form


def _mount(m: str | dict) -> tuple:
    """A mount as (type, source, target, readonly), read independently of mounts.py."""
    if isinstance(m, dict):
        return (m["type"], m.get("source"), m["target"], False)
    fields = dict(f.partition("=")[::2] for f in m.split(","))
    readonly = "readonly" in fields or fields.get("ro") in ("", "true", "1")
    return (fields.get("type", "volume"), fields.get("source") or fields.get("src"), fields.get("target") or fields.get("dst"), readonly)


def _port(p: int | str) -> int:
    return p if isinstance(p, int) else int(str(p).removeprefix("localhost:"))


def _app_port(p: int | str) -> tuple:
    if isinstance(p, int):  # the reference publishes it as -p 127.0.0.1:N:N
        return (p, p, "tcp")
    spec, _, proto = p.partition("/")
    parts = spec.split(":")
    host = parts[-2] if len(parts) > 1 and parts[-2] else None
    return (int(parts[-1]), int(host) if host else None, proto or "tcp")


def _commands(v) -> list:
    if isinstance(v, str):
        return [(None, v, ())] if v.strip() else []
    if isinstance(v, list):
        return [(None, None, tuple(v))] if v else []
    return [(name, *c[1:]) for name, sub in v.items() for c in _commands(sub)]


def _size(s: str) -> int | None:
    """The reference's own reading of a hostRequirements size (1024-based units)."""
    m = re.fullmatch(r"(\d+)([tgmk]b)?", s)
    n = int(m.group(1)) * ({"t": 2**40, "g": 2**30, "m": 2**20, "k": 2**10}[m.group(2)[0]] if m.group(2) else 1)
    return n or None


LIFECYCLE = ("initializeCommand", "onCreateCommand", "updateContentCommand", "postCreateCommand",
             "postStartCommand", "postAttachCommand")


def reference_view(out: dict) -> dict:
    c, ws = out["configuration"], out["workspace"]
    folder = posixpath.dirname(c["configFilePath"]["fsPath"])
    view: dict = {"workspaceFolder": ws["workspaceFolder"], "workspaceMount": _mount(ws["workspaceMount"])}
    for key in ("name", "image", "remoteUser", "containerUser", "containerEnv", "remoteEnv", "runArgs", "init",
                "overrideCommand", "capAdd", "securityOpt", "features"):
        if key in c:
            view[key] = c[key]
    if "build" in c or "dockerFile" in c:
        b = c.get("build", {})
        view["build"] = {
            "dockerfile": posixpath.normpath(posixpath.join(folder, b.get("dockerfile") or c["dockerFile"])),
            "context": posixpath.normpath(posixpath.join(folder, b.get("context") or c.get("context") or ".")),
            "args": b.get("args", {}),
            "target": b.get("target"),
        }
    if "mounts" in c:
        view["mounts"] = [_mount(m) for m in c["mounts"]]
    if "forwardPorts" in c:
        view["forwardPorts"] = list(dict.fromkeys(_port(p) for p in c["forwardPorts"]))
    if "appPort" in c:
        view["appPort"] = [_app_port(p) for p in (c["appPort"] if isinstance(c["appPort"], list) else [c["appPort"]])]
    for hook in LIFECYCLE:
        if hook in c:
            view[hook] = _commands(c[hook])
    if "hostRequirements" in c:
        h = c["hostRequirements"]
        gpu = h.get("gpu", False)
        view["hostRequirements"] = {
            "cpus": h.get("cpus"),
            "memory": _size(h["memory"]) if "memory" in h else None,
            "storage": _size(h["storage"]) if "storage" in h else None,
            "gpu": True if isinstance(gpu, dict) else gpu,
            "gpu.cores": gpu.get("cores") if isinstance(gpu, dict) else None,
            "gpu.memory": _size(gpu["memory"]) if isinstance(gpu, dict) and "memory" in gpu else None,
        }
    return view


def our_view(d: DevContainer, like: dict) -> dict:
    """Ours, in the same form, for the keys the reference printed."""
    m = d.workspace_mount
    ours = {
        "workspaceFolder": d.workspace_folder,
        "workspaceMount": (m.type, m.source, m.target, m.read_only),
        "name": d.name,
        "image": d.image,
        "remoteUser": d.remote_user,
        "containerUser": d.container_user,
        "containerEnv": dict(d.container_env),
        "remoteEnv": dict(d.remote_env),
        "runArgs": list(d.run_args),
        "init": d.init,
        "overrideCommand": d.override_command,
        "capAdd": list(d.cap_add),
        "securityOpt": list(d.security_opt),
        "features": {f.key: dict(f.options) for f in d.feature_refs},
        "mounts": [(x.type, x.source, x.target, x.read_only) for x in d.mounts],
        "forwardPorts": list(d.forward_ports),
        "appPort": [(p.container_port, p.host_port, p.protocol) for p in d.app_ports],
    }
    if d.build:
        ours["build"] = {"dockerfile": d.build.dockerfile, "context": d.build.context, "args": dict(d.build.args),
                         "target": d.build.target}
    for hook, commands in d.lifecycle.items():
        ours[hook] = [(c.name, c.shell, c.argv) for c in commands]
    if d.host_requirements:
        h = d.host_requirements
        ours["hostRequirements"] = {"cpus": h.cpus, "memory": h.memory_bytes, "storage": h.storage_bytes, "gpu": h.gpu,
                                    "gpu.cores": h.gpu_cores, "gpu.memory": h.gpu_memory_bytes}
    return {k: v for k, v in ours.items() if k in like}


# ---------------------------------------------------------------- the checks


@pytest.mark.parametrize("name", ACCEPTED)
def test_our_reading_agrees_with_the_reference(name, reference, home, env):
    theirs = reference_view(reference[name])
    ours = our_view(load_devcontainer(home / name, home=str(home), env=env), theirs)
    assert ours == theirs


def test_every_accepted_fixture_exercises_fields_beyond_the_image(reference):
    compared = set()
    for name in ACCEPTED:
        compared |= set(reference_view(reference[name]))
    assert {"build", "containerEnv", "remoteEnv", "remoteUser", "mounts", "forwardPorts", "appPort", "runArgs",
            "postCreateCommand", "hostRequirements", "workspaceMount", "capAdd", "securityOpt", "features"} <= compared


@pytest.mark.parametrize("name", REFUSED)
def test_refused_fixtures_are_valid_for_the_reference_and_refused_by_policy(name, reference, home, env):
    assert "configuration" in reference[name]  # the reference reads it ...
    with pytest.raises(DevContainerError):  # ... and the node will not run it
        load_devcontainer(home / name, home=str(home), env=env)

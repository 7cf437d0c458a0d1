"""`mt-container create --devcontainer PATH`: read the devcontainer.json as the tenant
(mtgpu/workspaces), build its image when it has a `build` (`podman build --pull=never`,
as the tenant, in the tenant's store on this node), and say what the node is asked for.

What becomes of each key is in docs/WORKSPACES.md; the node checks again what it must
never take from a tenant (mounts outside the home, runArgs off the allow-list).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import tempfile

from ..client.local import ClientError, LocalClient
from ..workspaces.devcontainer import DevContainer, load_devcontainer, locate_devcontainer
from ..workspaces.errors import DevContainerError
from ..workspaces.feature_archive import FeatureArchiveError, unpack
from ..workspaces.features import FeatureRef, StagedFeatures, StagedFolder, feature_dockerfile, stage_feature_context
from ..workspaces.homepath import mount_sources, source_problems
from ..workspaces.mounts import HomeFolder
from .common import err, fail
from .podman import tenant_podman

POST_CREATE_HOOKS = ("onCreateCommand", "updateContentCommand", "postCreateCommand")
POST_START_HOOKS = ("postStartCommand", "postAttachCommand")


def _hooks(dc: DevContainer, hooks: tuple[str, ...]) -> list[str]:
    """The commands of these hooks, in order; an object form's commands run one after another."""
    return dc.lifecycle_commands(hooks)


def metadata(dc: DevContainer) -> str:
    """The `devcontainer.metadata` label VS Code's "Attach to Running Container" reads."""
    entry: dict = {}
    if dc.remote_user:
        entry["remoteUser"] = dc.remote_user
    if dc.container_env:
        entry["containerEnv"] = dict(dc.container_env)
    remote = {k: v for k, v in dc.remote_env.items() if v is not None}
    if remote:
        entry["remoteEnv"] = remote
    ports = list(dc.forward_ports) + [p.container_port for p in dc.app_ports]
    if ports:
        entry["forwardPorts"] = ports
    return json.dumps([entry], sort_keys=True)


def parts(dc: DevContainer, image: str) -> dict:
    """What the node is sent (server/api/workspaces.DevcontainerParts)."""
    mounts = []
    for m in (dc.workspace_mount, *dc.mounts):
        if m.type != "bind" or m.source is None:
            fail(f"{dc.config_path}: the {m.type} mount at {m.target} is not available yet: a workspace takes bind "
                 "mounts of folders in your home; use one of those instead", 2)
        mounts.append([m.source, m.target, m.read_only])
    env = dc.environment()  # ${containerEnv:...} the member resolves from the image
    if dc.override_command is False:
        fail(f"{dc.config_path}: overrideCommand = false is not available yet: a workspace runs its lifecycle "
             "commands and then waits, never the image's own command; remove the key", 2)
    if dc.init is False:
        fail(f"{dc.config_path}: init = false: a workspace always runs an init process (so that stop and signals "
             "reach your processes); remove the key", 2)
    if _hooks(dc, ("initializeCommand",)):
        fail(f"{dc.config_path}: initializeCommand runs on the machine that creates the container; it is not "
             "available yet: run it yourself first and remove it from the file", 2)
    return {"path": dc.config_path, "name": dc.name, "image": image, "env": env,
            "ports": list(dict.fromkeys([*dc.forward_ports, *(p.container_port for p in dc.app_ports)])),
            "post_create": _hooks(dc, POST_CREATE_HOOKS), "post_start": _hooks(dc, POST_START_HOOKS),
            "mounts": mounts, "workdir": dc.workspace_folder, "metadata": metadata(dc),
            "resources": dc.reservation.directives(), "run_args": list(dc.run_options()),
            "user": dc.container_user or dc.remote_user}


def base_images(dockerfile: str) -> list[str]:
    """The images a Dockerfile builds FROM (not its own stages)."""
    stages, images = set(), []
    try:
        text = open(dockerfile, encoding="utf-8", errors="replace").read()
    except OSError:
        return []
    for m in re.finditer(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", text, re.I | re.M):
        if m.group(1).lower() not in stages and m.group(1) not in images:
            images.append(m.group(1))
        if m.group(2):
            stages.add(m.group(2).lower())
    return images


def refuse_own_image_build(dc: DevContainer, here: str, node: dict) -> None:
    """Before any work: a `build` (or Features) makes an image of the tenant's own, which runs
    only where `[CONTAINERS] allow_user_images = true` (the node refuses it at create otherwise)."""
    what = '"build"' if dc.build is not None else "Features (" + ", ".join(r.key for r in dc.feature_refs) + ")"
    _refuse_own_image(dc.config_path, what, here, node)


def _refuse_own_image(config_path: str, what: str, here: str, node: dict) -> None:
    containers = node.get("containers")
    if containers is None or containers.get("user_images"):  # containers off: the node says so itself
        return
    fail(f"{config_path}: its {what} makes an image of your own, to run on {here}, which does not run "
         "tenants' own images ([CONTAINERS] allow_user_images = false); name an image the cluster offers in "
         "\"image\" instead (`mt-container create` without arguments lists the templates), or ask an admin to "
         "set allow_user_images = true or to stage your image", 2)


def build_image(dc: DevContainer) -> tuple[str, str]:
    """`podman build --pull=never` of its `build`, as the tenant, into the tenant's store on
    this node: (the image's tag, this node, where the workspace must then run)."""
    b = dc.build
    tag = "localhost/devcontainer-" + hashlib.sha256(dc.config_path.encode()).hexdigest()[:12] + ":latest"
    try:
        with LocalClient() as c:
            here = c.health()["node"]
            refuse_own_image_build(dc, here, next((n for n in c.nodes() if n["name"] == here), {}))
            got = c.podman_env(load=base_images(b.dockerfile))  # the node's staged images it builds FROM
    except ClientError as e:
        fail(e)
    podman, env = tenant_podman(got)
    argv = [podman, "build", "--pull=never", "-f", b.dockerfile, "-t", tag]
    for k, v in sorted(b.args.items()):
        argv += ["--build-arg", f"{k}={v}"]
    if b.target:
        argv += ["--target", b.target]
    argv.append(b.context)
    err.print(f"building {tag} from {b.dockerfile} (podman build --pull=never)", markup=False)
    _podman_build(dc, argv, env)
    return tag, here


def _podman_build(dc: DevContainer, argv: list[str], env: dict) -> None:
    r = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        fail(f"{dc.config_path}: podman build failed (status {r.returncode}): "
             + (r.stderr.strip().splitlines() or ["no message"])[-1], 1)


def build_features(dc: DevContainer, base: str) -> tuple[str, str]:
    """Its local Features installed on `base` (each install.sh as root, its options as
    variables), `podman build --pull=never` as the tenant on this node: (tag, this node)."""
    tag = "localhost/devcontainer-" + hashlib.sha256(dc.config_path.encode()).hexdigest()[:12] + "-features:latest"
    try:
        with LocalClient() as c:
            here = c.health()["node"]
            if dc.build is None:  # (a build was checked already) Features make an image of your own too
                refuse_own_image_build(dc, here, next((n for n in c.nodes() if n["name"] == here), {}))
            got = c.podman_env(load=[base] if dc.build is None else [])  # a node's staged image, into your store
    except ClientError as e:
        fail(e)
    podman, env = tenant_podman(got)
    r = subprocess.run([podman, "image", "inspect", "--format", "{{.Config.User}}", base], env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"{dc.config_path}: the image {base} is not in your store on {here}: "
             + (r.stderr.strip().splitlines() or ["no message"])[-1], 1)
    image_user = r.stdout.strip()
    container_user = dc.container_user or image_user or "root"
    with tempfile.TemporaryDirectory(prefix="mtgpu-features-") as context:
        stage_feature_context(dc.features, context, remote_user=dc.remote_user or container_user,
                              container_user=container_user)
        with open(os.path.join(context, "Dockerfile"), "w", encoding="utf-8") as f:
            f.write(feature_dockerfile(base, dc.features, image_user))
        names = ", ".join(f.ref.key for f in dc.features)
        err.print(f"building {tag}: Features {names} on {base} (podman build --pull=never)", markup=False)
        _podman_build(dc, [podman, "build", "--pull=never", "-t", tag, context], env)
    return tag, here


class StagedFromNode:
    """The Features from a registry or a URL this node staged ([CONTAINERS] features), as
    load_features asks for them: each archive fetched from the node (POST /v1/podman/env, the
    way a build's staged base images are loaded), checked against its SHA-256 and unpacked,
    checked again, into a fresh folder of the tenant's that lives until the build is done.
    Before the first, a node that runs no tenant's own image refuses the file, as a build."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._dir = tempfile.TemporaryDirectory(prefix="mtgpu-staged-features-")
        self._got: dict[str, StagedFolder | None] = {}
        self._checked = False

    def __enter__(self) -> "StagedFromNode":
        return self

    def __exit__(self, *exc: object) -> None:
        self._dir.cleanup()

    def __call__(self, ref: FeatureRef) -> StagedFolder | None:
        key = ref.staged_key
        if key not in self._got:
            self._got[key] = self._fetch(ref, key)
        return self._got[key]

    def _fetch(self, ref: FeatureRef, key: str) -> StagedFolder | None:
        try:
            with LocalClient() as c:
                if not self._checked:
                    here = c.health()["node"]
                    config_path = locate_devcontainer(self.path)[0]
                    _refuse_own_image(config_path, f"Feature {ref.key}", here,
                                      next((n for n in c.nodes() if n["name"] == here), {}))
                    self._checked = True
                entry = (c.podman_env(features=[key]).get("features") or {}).get(key)
        except ClientError as e:
            fail(e)
        if entry is None:
            return None
        where = f"features.{ref.key}"
        data = base64.b64decode(entry["data"])
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise DevContainerError.one(where, ref.key, f"the staged archive {entry['archive']} did not arrive whole "
                                                        "(its SHA-256 differs); try again")
        folder = os.path.join(self._dir.name, str(len(self._got)))
        os.mkdir(folder, 0o700)
        try:
            unpack(data, folder, entry["archive"])
        except (FeatureArchiveError, OSError) as e:
            raise DevContainerError.one(where, ref.key, f"its staged archive cannot be used: {e}") from None
        return StagedFolder(folder, entry["sha256"])


def checked_devcontainer(path: str, home: str, env: dict[str, str],
                         staged: StagedFeatures | None = None) -> DevContainer:
    """The devcontainer.json at `path` read and checked as the tenant whose HOME is `home`:
    its text, then its host paths on the real file system (a symlink or '..' out of the home
    is refused here already); DevContainerError with every problem. The home is read in both
    spellings, its real path and HOME's (a home reached through a symlink: /home -> /var/home).
    `staged`: where the node's staged Features come from (StagedFromNode); without it, a
    Feature from a registry or a URL is refused."""
    home_folder = HomeFolder(os.path.realpath(home), home)
    dc = load_devcontainer(path, home=home_folder, env=env, staged=staged)
    problems = source_problems(mount_sources(dc.workspace_mount, dc.mounts, dc.run_args), home_folder)
    if problems:
        raise DevContainerError(problems, dc.config_path)
    return dc


def read_devcontainer(path: str) -> dict:
    if os.geteuid() == 0:
        fail("--devcontainer is read as the tenant who creates the workspace; root cannot", 2)
    home = os.environ.get("HOME") or os.path.expanduser("~")
    with StagedFromNode(path) as staged:  # the unpacked Features live until the build is done
        return _read_devcontainer(path, home, staged)


def _read_devcontainer(path: str, home: str, staged: StagedFromNode) -> dict:
    try:
        dc = checked_devcontainer(path, home, dict(os.environ), staged)
    except DevContainerError as e:
        fail(str(e), 2)
    if dc.ignored_keys:
        err.print(f"note: {dc.config_path}: not acted on: {', '.join(dc.ignored_keys)}", markup=False)
    if dc.build is None and not dc.features:
        return parts(dc, dc.image)
    image, here = build_image(dc) if dc.build is not None else (dc.image, None)
    if dc.features:
        image, here = build_features(dc, image)
    out = parts(dc, image)
    out["resources"].setdefault("server", here)
    return out

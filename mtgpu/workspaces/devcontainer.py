"""devcontainer.json -> DevContainer: what `mt-container create --devcontainer PATH` builds
a workspace from. Read as VS Code and `@devcontainers/cli` read it (JSON with comments
and trailing commas, the `${...}` variables of variables.py), then checked against what
a node allows; every problem is reported at once in one DevContainerError.

Where the workspace is: as in the reference, the project folder is bind-mounted at
`/workspaces/<its basename>` and that is the default `workspaceFolder`, because
devcontainer.json files, their Dockerfiles and scripts are written against that path.
The tenant's home is mounted at its own path as well (docs/CONTAINERS.md), so the same
files are also where native jobs see them.

`parse_devcontainer` is pure (text, paths and environment passed in); `load_devcontainer`
finds the file and reads it. The sections other than the image are in sections.py.
"""

from __future__ import annotations

import os
import posixpath
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Callable

from mtgpu.workspaces.errors import DevContainerError, Problem
from mtgpu.workspaces.features import Feature, FeatureRef, StagedFeatures, load_features, parse_feature_refs
from mtgpu.workspaces.jsonc import JsoncError, loads_jsonc
from mtgpu.workspaces.mounts import Mount, check_in_home, inside, parse_mount
from mtgpu.workspaces.runargs import check_run_args
from mtgpu.workspaces.sections import (
    LIFECYCLE_HOOKS,
    AppPort,
    Command,
    HostRequirements,
    Reservation,
    parse_app_ports,
    parse_env,
    parse_forward_ports,
    parse_host_requirements,
    parse_lifecycle,
    parse_security_keys,
)
from mtgpu.workspaces.variables import SubstitutionContext, substitute, substitute_container_env, substitute_string

CONFIG_LOCATIONS = (".devcontainer/devcontainer.json", ".devcontainer.json")
CONTAINER_WORKSPACES_ROOT = "/workspaces"
MAX_CONFIG_BYTES = 1024 * 1024

# Keys this reader acts on; any other top-level key is listed in DevContainer.ignored_keys.
_HANDLED = frozenset(
    {"$schema", "name", "image", "build", "dockerFile", "context", "containerEnv", "remoteEnv", "remoteUser",
     "containerUser", "mounts", "workspaceFolder", "workspaceMount", "forwardPorts", "appPort", "runArgs",
     "hostRequirements", "features", "init", "overrideCommand", "privileged", "capAdd", "securityOpt",
     "dockerComposeFile", "service", "runServices", *LIFECYCLE_HOOKS}
)
_BUILD_KEYS = ("dockerfile", "context", "args", "target", "options", "cacheFrom")


@dataclass(frozen=True)
class Build:
    """`podman build --pull=never` input; paths are absolute on the node, resolved from
    the folder holding devcontainer.json as the reference resolves them."""

    dockerfile: str
    context: str
    args: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    target: str | None = None


@dataclass(frozen=True)
class DevContainer:
    """A devcontainer.json a node accepts, variables substituted. `lifecycle` maps the
    hooks present (LIFECYCLE_HOOKS order) to their commands; `ignored_keys` names the
    top-level keys read but not acted on (customizations, portsAttributes, ...), so a
    CLI can say so."""

    config_path: str
    local_workspace_folder: str
    workspace_folder: str
    workspace_mount: Mount
    name: str | None = None
    image: str | None = None
    build: Build | None = None
    container_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    remote_env: Mapping[str, str | None] = field(default_factory=lambda: MappingProxyType({}))
    remote_user: str | None = None
    container_user: str | None = None
    mounts: tuple[Mount, ...] = ()
    forward_ports: tuple[int, ...] = ()
    app_ports: tuple[AppPort, ...] = ()
    run_args: tuple[str, ...] = ()
    lifecycle: Mapping[str, tuple[Command, ...]] = field(default_factory=lambda: MappingProxyType({}))
    host_requirements: HostRequirements | None = None
    reservation: Reservation = Reservation()
    init: bool | None = None
    override_command: bool | None = None
    ignored_keys: tuple[str, ...] = ()
    cap_add: tuple[str, ...] = ()
    security_opt: tuple[str, ...] = ()
    feature_refs: tuple[FeatureRef, ...] = ()
    features: tuple[Feature, ...] = ()

    def run_options(self) -> tuple[str, ...]:
        """runArgs, then capAdd and securityOpt (its own and its Features') as podman run options."""
        caps = dict.fromkeys([*self.cap_add, *(c for f in self.features for c in f.cap_add)])
        opts = dict.fromkeys([*self.security_opt, *(o for f in self.features for o in f.security_opt)])
        return (*self.run_args, *(f"--cap-add={c}" for c in caps), *(f"--security-opt={o}" for o in opts))

    def lifecycle_commands(self, hooks: tuple[str, ...]) -> list[str]:
        """The commands of these hooks, in order, as shell text (`/bin/sh -c`): a string as
        written, a list's words each quoted (run as they are, as without a shell), an object's
        commands one after another. `${containerEnv:VAR}` is substituted as the reference does
        where it knows the container (`devcontainer run-user-commands`; the specification lists
        the variable for remoteEnv only, and `up` leaves it to the shell): from the container's
        own environment, containerEnv's names here (in each word of a list, before it is quoted),
        the image's at the member that creates the container
        (variables.substitute_container_env_in_shell); remoteEnv is not the container's."""
        def words(c: Command) -> str:
            if c.shell is not None:
                return substitute_container_env(c.shell, self.container_env, keep_unknown=True)
            return shlex.join(substitute_container_env(a, self.container_env, keep_unknown=True) for a in c.argv)
        return [words(c) for h in hooks for c in self.lifecycle.get(h, ())]

    def environment(self) -> dict[str, str]:
        """The workspace container's variables: containerEnv, then remoteEnv (set on the
        container too, so exec sessions and lifecycle commands see them). In remoteEnv,
        `${containerEnv:VAR}` of a containerEnv variable is resolved here; any other is left
        for the member that creates the container, which reads the image's environment
        (variables.resolve_container_env)."""
        env = dict(self.container_env)
        for k, v in self.remote_env.items():
            if v is not None:
                env[k] = substitute_container_env(v, self.container_env, keep_unknown=True)
        return env


def locate_devcontainer(path: str | os.PathLike[str]) -> tuple[str, str]:
    """(config file, workspace folder) for PATH as `mt-container create --devcontainer`
    takes it: a project folder (its `.devcontainer/devcontainer.json`, else its
    `.devcontainer.json`) or the file itself, whose project folder is the one above its
    `.devcontainer/` folder (also for `.devcontainer/NAME/devcontainer.json`), else the
    folder it is in."""
    p = os.path.abspath(os.fspath(path))
    if os.path.isdir(p):
        for rel in CONFIG_LOCATIONS:
            if os.path.isfile(os.path.join(p, rel)):
                return os.path.join(p, rel), p
        tried = " or ".join(os.path.join(p, rel) for rel in CONFIG_LOCATIONS)
        raise DevContainerError.one("--devcontainer", os.fspath(path), f"no devcontainer.json: neither {tried} exists")
    if not os.path.isfile(p):
        raise DevContainerError.one(
            "--devcontainer", os.fspath(path), "no such file or folder; give the project folder or its devcontainer.json"
        )
    parent = os.path.dirname(p)
    for folder in (parent, os.path.dirname(parent)):
        if os.path.basename(folder) == ".devcontainer":
            return p, os.path.dirname(folder)
    return p, parent


def load_devcontainer(
    path: str | os.PathLike[str], *, home: str, env: Mapping[str, str], workspace_folder: str | None = None,
    staged: StagedFeatures | None = None,
) -> DevContainer:
    """Find, read and parse the devcontainer.json at PATH (see locate_devcontainer). `staged`
    gives the folder of a registry or URL Feature the node staged (features.load_features);
    without it such a Feature is refused."""
    config_path, found_folder = locate_devcontainer(path)
    try:
        with open(config_path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise DevContainerError.one("--devcontainer", config_path, f"cannot be read: {e.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise DevContainerError.one("--devcontainer", config_path, f"is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise DevContainerError.one("--devcontainer", config_path, "is not UTF-8 text") from None
    dc = parse_devcontainer(
        text, config_path=config_path, workspace_folder=workspace_folder or found_folder, home=home, env=env,
        staging=staged is not None,
    )
    if not dc.feature_refs:
        return dc
    try:
        features = load_features(dc.feature_refs, posixpath.dirname(config_path), staged)
    except DevContainerError as e:
        raise DevContainerError(e.problems, config_path) from None
    return replace(dc, features=features)


class _Problems:
    """Collects every problem, so all are reported at once."""

    def __init__(self) -> None:
        self.items: list[Problem] = []

    def add(self, key: str, value: object, message: str) -> None:
        self.items.append(Problem(key, value, message))

    def run(self, fn: Callable[..., Any], *args: Any, default: Any = None) -> Any:
        try:
            return fn(*args)
        except DevContainerError as e:
            self.items.extend(e.problems)
            return default


def parse_devcontainer(
    text: str, *, config_path: str, workspace_folder: str, home: str, env: Mapping[str, str], staging: bool = False
) -> DevContainer:
    """Parse and check the text of a devcontainer.json. `config_path` and
    `workspace_folder` are absolute paths on the node (the file, the project folder);
    `home` is the tenant's home, which every host path must be inside; `env` is what
    `${localEnv:...}` reads; `staging`: Features from a registry or a URL are kept for
    load_features to look up among the node's staged ones (else refused here). No I/O."""
    for what, value in (("config_path", config_path), ("workspace_folder", workspace_folder), ("home", home)):
        if not posixpath.isabs(value):
            raise ValueError(f"{what} must be an absolute path, not {value!r}")
    workspace_folder = posixpath.normpath(workspace_folder)
    try:
        raw = loads_jsonc(text)
    except JsoncError as e:
        raise DevContainerError.one(e.where, None, e.problem, config_path) from None
    if not isinstance(raw, dict):
        raise DevContainerError.one("the file", None, "must hold one JSON object {...}", config_path)
    problems = _Problems()

    local_ctx = SubstitutionContext(workspace_folder, None, env)
    container_folder = f"{CONTAINER_WORKSPACES_ROOT}/{posixpath.basename(workspace_folder)}"
    wf_raw = raw.get("workspaceFolder")
    if wf_raw is not None:
        if isinstance(wf_raw, str):
            container_folder = problems.run(substitute_string, wf_raw, local_ctx, "workspaceFolder", default=wf_raw)
        else:
            problems.add("workspaceFolder", wf_raw, "must be a string: the absolute path of the project in the container")
    ctx = SubstitutionContext(workspace_folder, container_folder, env)
    cfg = {}
    for key, value in raw.items():
        cfg[key] = problems.run(substitute, value, ctx, key, default=value)
    if not posixpath.isabs(container_folder):
        problems.add("workspaceFolder", container_folder, "must be an absolute path in the container, such as /workspaces/NAME")

    image, build = _image_and_build(cfg, posixpath.dirname(config_path), home, problems)
    default_mount = Mount("bind", f"{CONTAINER_WORKSPACES_ROOT}/{posixpath.basename(workspace_folder)}", workspace_folder)
    workspace_mount = default_mount
    if cfg.get("workspaceMount") is not None:
        workspace_mount = problems.run(_mount_in_home, cfg["workspaceMount"], "workspaceMount", home, default=default_mount)
    elif not inside(workspace_folder, home):
        problems.add(
            "workspaceMount", None, f"the project folder {workspace_folder} is outside your home {home}; a workspace "
            "mounts only folders in your home: move the project under it"
        )
    mounts = []
    mounts_raw = cfg.get("mounts", [])
    if not isinstance(mounts_raw, list):
        problems.add("mounts", mounts_raw, "must be a list of mounts")
        mounts_raw = []
    for i, m in enumerate(mounts_raw):
        mount = problems.run(_mount_in_home, m, f"mounts[{i}]", home)
        if mount is not None:
            mounts.append(mount)
    run_args = cfg.get("runArgs", [])
    if not isinstance(run_args, list):
        problems.add("runArgs", run_args, 'must be a list of strings, such as ["--shm-size=8g"]')
        run_args = []
    problems.items.extend(check_run_args(run_args, home))
    _refuse_unsupported(cfg, problems)
    cap_add, security_opt = problems.run(parse_security_keys, cfg, default=((), ()))
    feature_refs = problems.run(lambda value, folder: parse_feature_refs(value, folder, staging=staging),
                                cfg.get("features"), posixpath.dirname(config_path), default=())
    host_requirements = problems.run(parse_host_requirements, cfg.get("hostRequirements"))

    result = DevContainer(
        config_path=config_path,
        local_workspace_folder=workspace_folder,
        workspace_folder=container_folder,
        workspace_mount=workspace_mount,
        name=_optional_str(cfg, "name", problems),
        image=image,
        build=build,
        container_env=MappingProxyType(problems.run(parse_env, cfg, "containerEnv", False, default={})),
        remote_env=MappingProxyType(problems.run(parse_env, cfg, "remoteEnv", True, default={})),
        remote_user=_optional_str(cfg, "remoteUser", problems),
        container_user=_optional_str(cfg, "containerUser", problems),
        mounts=tuple(mounts),
        forward_ports=problems.run(parse_forward_ports, cfg.get("forwardPorts"), default=()),
        app_ports=problems.run(parse_app_ports, cfg.get("appPort"), default=()),
        run_args=tuple(a for a in run_args if isinstance(a, str)),
        lifecycle=MappingProxyType(problems.run(parse_lifecycle, cfg, default={})),
        host_requirements=host_requirements,
        reservation=host_requirements.reservation() if host_requirements else Reservation(),
        init=_optional_bool(cfg, "init", problems),
        override_command=_optional_bool(cfg, "overrideCommand", problems),
        ignored_keys=_ignored_keys(cfg),
        cap_add=cap_add,
        security_opt=security_opt,
        feature_refs=feature_refs,
    )
    if problems.items:
        raise DevContainerError(problems.items, config_path)
    return result


def _image_and_build(cfg: dict, config_dir: str, home: str, problems: _Problems) -> tuple[str | None, Build | None]:
    """Exactly one of image and build (or the legacy top-level dockerFile)."""
    image = cfg.get("image")
    build_raw = cfg.get("build")
    dockerfile = cfg.get("dockerFile")
    if build_raw is not None and not isinstance(build_raw, dict):
        problems.add("build", build_raw, 'must be an object such as {"dockerfile": "Dockerfile"}')
        return None, None
    wants_build = build_raw is not None or dockerfile is not None
    if image is not None and wants_build:
        problems.add("image", image, "give image or build, not both: image runs that image, build makes one from a Dockerfile")
        return None, None
    if "dockerComposeFile" in cfg:
        problems.add("dockerComposeFile", cfg["dockerComposeFile"], "docker compose is not supported; use image or build")
        return None, None
    if image is not None:
        if not isinstance(image, str) or not image.strip():
            problems.add("image", image, 'must be an image name, such as "localhost/pytorch:2.6"')
            return None, None
        return image, None
    if not wants_build:
        problems.add("image", None, 'devcontainer.json needs "image" or "build" ({"dockerfile": "Dockerfile"})')
        return None, None
    build_raw = build_raw or {}
    dockerfile = build_raw.get("dockerfile", dockerfile)
    context = build_raw.get("context", cfg.get("context", "."))
    if not isinstance(dockerfile, str) or not dockerfile:
        problems.add("build.dockerfile", dockerfile, "must name the Dockerfile, relative to the folder of devcontainer.json")
        return None, None
    if not isinstance(context, str):
        problems.add("build.context", context, "must be a folder, relative to the folder of devcontainer.json")
        return None, None
    args = build_raw.get("args", {})
    if not isinstance(args, dict) or not all(isinstance(v, str) for v in args.values()):
        problems.add("build.args", args, 'must be an object of strings, such as {"VERSION": "1.2"}')
        args = {}
    target = build_raw.get("target")
    if target is not None and not isinstance(target, str):
        problems.add("build.target", target, "must be the name of a build stage")
        target = None
    if build_raw.get("options"):
        problems.add("build.options", build_raw["options"], "extra build options are not supported; put what you need in the Dockerfile")
    resolved = Build(
        dockerfile=posixpath.normpath(posixpath.join(config_dir, dockerfile)),
        context=posixpath.normpath(posixpath.join(config_dir, context)),
        args=MappingProxyType(dict(args)),
        target=target,
    )
    for key, path in (("build.dockerfile", resolved.dockerfile), ("build.context", resolved.context)):
        if not inside(path, home):
            problems.add(key, path, f"is outside your home {home}; a workspace builds only from files in your home")
    return None, resolved


def _mount_in_home(value: object, key: str, home: str) -> Mount:
    mount = parse_mount(value, key)
    check_in_home(mount, home, key, value)
    return mount


def _refuse_unsupported(cfg: dict, problems: _Problems) -> None:
    for key in ("service", "runServices"):
        if key in cfg and "dockerComposeFile" not in cfg:
            problems.add(key, cfg[key], "belongs to docker compose, which is not supported; remove it")


def _optional_str(cfg: dict, key: str, problems: _Problems) -> str | None:
    value = cfg.get(key)
    if value is not None and not isinstance(value, str):
        problems.add(key, value, "must be a string")
        return None
    return value


def _optional_bool(cfg: dict, key: str, problems: _Problems) -> bool | None:
    value = cfg.get(key)
    if value is not None and not isinstance(value, bool):
        problems.add(key, value, "must be true or false")
        return None
    return value


def _ignored_keys(cfg: dict) -> tuple[str, ...]:
    ignored = [k for k in cfg if k not in _HANDLED]
    build = cfg.get("build")
    if isinstance(build, dict):
        ignored += [f"build.{k}" for k in build if k not in _BUILD_KEYS or k == "cacheFrom"]
    return tuple(ignored)

"""The `${...}` variables of devcontainer.json, substituted as the reference does
(`@devcontainers/cli` `read-configuration`): every string value, at any depth, never
the keys of an object.

- `${localWorkspaceFolder}`, `${localWorkspaceFolderBasename}`: the project folder on the node.
- `${containerWorkspaceFolder}`, `${containerWorkspaceFolderBasename}`: where it is in the container.
- `${localEnv:VAR}` (also `${env:VAR}`), `${localEnv:VAR:default}`: the caller's environment,
  passed in; a variable that is not set is the default, else the empty string. As in the
  reference, the text is split at every `:`, so a default cannot contain one.
- Anything else (`${containerEnv:VAR}`, `${devcontainerId}`, unknown names) is kept as written:
  those are resolved later, as the reference does. `${containerEnv:VAR}` and
  `${containerEnv:VAR:default}` read the container's own environment (the image's `Env`, what
  podman sets, then the container's variables): `substitute_container_env`, applied by the
  member that creates the container (its image is there), with `containerEnv`'s own values
  resolved first by `DevContainer.environment` (those are the container's too).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mtgpu.workspaces.errors import DevContainerError

_VARIABLE = re.compile(r"\$\{(.*?)\}")
_CONTAINER_ENV = re.compile(r"\$\{containerEnv:(.*?)\}")
# podman's own PATH for a container whose image sets none (containers/common's DefaultEnv)
PODMAN_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class SubstitutionContext:
    local_workspace_folder: str
    container_workspace_folder: str | None
    env: Mapping[str, str]


def substitute_string(value: str, ctx: SubstitutionContext, key: str = "") -> str:
    def replace(m: re.Match[str]) -> str:
        name, *args = m.group(1).split(":")
        if name in ("localEnv", "env"):
            if not args:
                raise DevContainerError.one(
                    key, value, f"{m.group(0)} names no variable; write ${{localEnv:NAME}} or ${{localEnv:NAME:default}}"
                )
            found = ctx.env.get(args[0])
            if found is not None:
                return found
            return args[1] if len(args) > 1 else ""
        if name == "localWorkspaceFolder":
            return ctx.local_workspace_folder
        if name == "localWorkspaceFolderBasename":
            return posixpath.basename(ctx.local_workspace_folder)
        if name == "containerWorkspaceFolder" and ctx.container_workspace_folder is not None:
            return ctx.container_workspace_folder
        if name == "containerWorkspaceFolderBasename" and ctx.container_workspace_folder is not None:
            return posixpath.basename(ctx.container_workspace_folder)
        return m.group(0)

    return _VARIABLE.sub(replace, value)


def substitute(value: Any, ctx: SubstitutionContext, key: str = "") -> Any:
    """`value` with every variable in its strings replaced; `key` names where it sits
    (for errors)."""
    if isinstance(value, str):
        return substitute_string(value, ctx, key)
    if isinstance(value, list):
        return [substitute(v, ctx, f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: substitute(v, ctx, f"{key}.{k}" if key else k) for k, v in value.items()}
    return value


def has_container_env(value: str) -> bool:
    return _CONTAINER_ENV.search(value) is not None


def substitute_container_env(value: str, container_env: Mapping[str, str], *, keep_unknown: bool = False) -> str:
    """`value` with `${containerEnv:VAR}` / `${containerEnv:VAR:default}` replaced from
    `container_env`; a variable that is not set is the default, else the empty string (as
    in the reference, the text is split at every `:`), or, with `keep_unknown`, stays as
    written for a later pass that knows more of the container's environment."""

    def replace(m: re.Match[str]) -> str:
        name, *default = m.group(1).split(":")
        if name in container_env:
            return container_env[name]
        if keep_unknown:
            return m.group(0)
        return default[0] if default else ""

    return _CONTAINER_ENV.sub(replace, value)


def resolve_container_env(env: Mapping[str, str], image_env: Mapping[str, str]) -> dict[str, str]:
    """A container's variables with `${containerEnv:...}` resolved as the container will see
    them: `image_env` (the image's `Env`; PATH is podman's default when it sets none),
    overlaid by the variables of `env` that reference nothing. A value that references its
    own name reads the image's (`PATH=${containerEnv:PATH}:/x` appends to the image's PATH)."""
    base = {"PATH": PODMAN_DEFAULT_PATH, **image_env}
    plain = {k: v for k, v in env.items() if not has_container_env(v)}
    container = {**base, **plain}
    return {k: substitute_container_env(v, container) for k, v in env.items()}


def image_env(entries: list[str] | None) -> dict[str, str]:
    """An image's `Config.Env` (["K=V", ...]) as a mapping."""
    return dict(e.split("=", 1) for e in entries or () if "=" in e)

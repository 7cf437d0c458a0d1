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


def container_env_of_image(image_env: Mapping[str, str]) -> dict[str, str]:
    """What `${containerEnv:...}` of a lifecycle command reads at the member: the image's `Env`
    (podman's PATH where it sets none); containerEnv's own names were resolved by the reader
    (`DevContainer.lifecycle_commands`), as they win over the image's in the container."""
    return {"PATH": PODMAN_DEFAULT_PATH, **image_env}


def substitute_container_env_in_shell(command: str, container_env: Mapping[str, str]) -> str:
    """A lifecycle command (shell text for `/bin/sh -c`) with `${containerEnv:...}` replaced as
    `substitute_container_env` does, the value written as it is (the reference substitutes
    the text before the shell reads it), except inside single quotes, where a `'` of the
    value is written `'"'"'` so that the quoting holds: a list-form command (`["echo",
    "${containerEnv:X}"]`) arrives here as shell words each quoted whole (shlex.join), and
    its word must stay the one word of the value."""
    out: list[str] = []
    i, quote = 0, ""  # quote: "" outside, "'" in single quotes, '"' in double quotes
    while i < len(command):
        m = _CONTAINER_ENV.match(command, i)
        if m:
            value = substitute_container_env(m.group(0), container_env)
            out.append(value.replace("'", "'\"'\"'") if quote == "'" else value)
            i = m.end()
            continue
        c = command[i]
        if c == "\\" and quote != "'" and command[i + 1:i + 2] in ("'", '"', "\\"):  # quoting only
            out.append(command[i:i + 2])
            i += 2
            continue
        if c in "'\"" and quote in ("", c):
            quote = "" if quote == c else c
        out.append(c)
        i += 1
    return "".join(out)


def image_env(entries: list[str] | None) -> dict[str, str]:
    """An image's `Config.Env` (["K=V", ...]) as a mapping."""
    return dict(e.split("=", 1) for e in entries or () if "=" in e)

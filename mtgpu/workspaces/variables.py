"""The `${...}` variables of devcontainer.json, substituted as the reference does
(`@devcontainers/cli` `read-configuration`): every string value, at any depth, never
the keys of an object.

- `${localWorkspaceFolder}`, `${localWorkspaceFolderBasename}`: the project folder on the node.
- `${containerWorkspaceFolder}`, `${containerWorkspaceFolderBasename}`: where it is in the container.
- `${localEnv:VAR}` (also `${env:VAR}`), `${localEnv:VAR:default}`: the caller's environment,
  passed in; a variable that is not set is the default, else the empty string. As in the
  reference, the text is split at every `:`, so a default cannot contain one.
- Anything else (`${containerEnv:VAR}`, `${devcontainerId}`, unknown names) is kept as written:
  those are resolved later, in the container, as the reference does.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mtgpu.workspaces.errors import DevContainerError

_VARIABLE = re.compile(r"\$\{(.*?)\}")


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

"""The app's `v`: open a node, or a workspace, in VS Code. The URIs are the ones the VS
Code extension builds (clients/vscode/src/core/uris.ts): a Remote-SSH folder on the
`Host NODE.CLUSTER` that `remotegpu-cli ssh-config` writes, or the Dev Containers form
for the workspace's container on that host. What to open is decided by `target` (pure);
the steps that run programs (ssh-config, ssh for the home, code) are functions of their
own, so that the tests put stand-ins in their place.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from ..client.sshconfig import host_alias

SSH_CONFIG_TIMEOUT_S = 60.0  # ssh-config asks every joined server for its DirectLink details
HOME_TIMEOUT_S = 15.0
CODE_TIMEOUT_S = 30.0
MT_PODMAN = "mt-podman"  # what dev.containers.dockerPath must run on the node (docs/VSCODE.md)


class VSCodeError(RuntimeError):
    """A step of opening VS Code failed: the message says which and why."""


@dataclass(frozen=True)
class Target:
    """What `code --folder-uri` opens, and what the status line says about it."""

    uri: str
    said: str


def _hex(text: str) -> str:
    return text.encode("utf-8").hex()


def ssh_remote_authority(host: str) -> str:
    """Remote-SSH's authority: the host as it is when it is a plain name, else hex JSON."""
    if not host:
        raise ValueError("an SSH host name is needed")
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]*", host):
        return f"ssh-remote+{host}"
    return "ssh-remote+" + _hex(json.dumps({"hostName": host}, separators=(",", ":")))


def _uri(authority: str, folder: str) -> str:
    if not folder.startswith("/"):
        raise ValueError(f"{folder!r} is not an absolute path on the remote host")
    return f"vscode-remote://{authority}" + "/".join(quote(s, safe="!~*'()") for s in folder.split("/"))


def folder_uri(host: str, folder: str) -> str:
    """vscode-remote://ssh-remote+HOST/FOLDER."""
    return _uri(ssh_remote_authority(host), folder)


def attached_container_uri(container: str, host: str, folder: str) -> str:
    """vscode-remote://attached-container+HEX({"containerName":"/NAME"})@ssh-remote+HOST/FOLDER."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", container):
        raise ValueError(f"{container!r} is not a container name")
    attached = "attached-container+" + _hex(json.dumps({"containerName": f"/{container}"}, separators=(",", ":")))
    return _uri(f"{attached}@{ssh_remote_authority(host)}", folder)


def target(node: str, cluster: str, home: str | None, workspace: dict | None = None,
           docker_path: str | None = None) -> Target:
    """What to open for a node (its folder: the home when known, else /) or a running
    workspace (inside its container when Dev Containers can reach it, which needs
    `dev.containers.dockerPath` = mt-podman; else its node's folder, saying why)."""
    host = host_alias(node, cluster)
    folder = home or "/"
    where = f"{host}:{folder}" + ("" if home else " (your home there is not known)")
    if workspace is None:
        return Target(folder_uri(host, folder), f"opening {where} in VS Code (Remote-SSH)")
    name, container = workspace["name"], workspace.get("container")
    if container and docker_path and posixpath.basename(docker_path.replace("\\", "/")) == MT_PODMAN:
        return Target(attached_container_uri(container, host, folder),
                      f"opening workspace {name} (container {container} on {host}) in VS Code (Dev Containers)")
    why = ("its container is not known yet" if not container else
           f"VS Code's dev.containers.dockerPath is {docker_path or 'not set (docker)'}, not {MT_PODMAN}: set it to "
           f"attach inside the container")
    return Target(folder_uri(host, folder), f"opening workspace {name}'s node {where} in VS Code, not the "
                                            f"container: {why}")


# ------------------------------------------------------------ the steps that run programs
def code_path() -> str | None:
    """VS Code's `code` command, or None when it is not on PATH."""
    return shutil.which("code")


def write_ssh_config(cli: list[str]) -> list[str]:
    """Run `remotegpu-cli ssh-config --json` (it writes a Host NODE.CLUSTER per node reached
    through DirectLink); the hosts it wrote."""
    try:
        r = subprocess.run(cli + ["ssh-config", "--json"], capture_output=True, text=True, timeout=SSH_CONFIG_TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise VSCodeError(f"remotegpu-cli ssh-config did not run: {e}") from None
    if r.returncode != 0:
        lines = r.stderr.strip().splitlines()
        raise VSCodeError(f"remotegpu-cli ssh-config failed: {lines[-1] if lines else f'exit {r.returncode}'}")
    try:
        return list(json.loads(r.stdout)["hosts"])
    except (ValueError, KeyError, TypeError):
        raise VSCodeError(f"remotegpu-cli ssh-config --json gave no hosts list: {r.stdout[:200]!r}") from None


def remote_home(host: str) -> str | None:
    """The tenant's home on the node (`ssh HOST printenv HOME`, as the extension asks), or
    None when ssh cannot tell within HOME_TIMEOUT_S."""
    try:
        r = subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", host, "printenv", "HOME"],
                           capture_output=True, text=True, timeout=HOME_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    home = r.stdout.strip()
    return home if r.returncode == 0 and home.startswith("/") else None


def settings_files() -> list[Path]:
    """VS Code's user settings.json on this computer (Linux, macOS, Windows)."""
    home = Path.home()
    if sys.platform == "darwin":
        return [home / "Library" / "Application Support" / "Code" / "User" / "settings.json"]
    if os.name == "nt":
        return [Path(os.environ.get("APPDATA", home / "AppData" / "Roaming")) / "Code" / "User" / "settings.json"]
    return [Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / "Code" / "User" / "settings.json"]


def docker_path_setting() -> str | None:
    """dev.containers.dockerPath from VS Code's user settings (None: not set there; a value
    set only in a node's Remote settings is not seen here)."""
    for path in settings_files():
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        found = re.search(r'"dev\.containers\.dockerPath"\s*:\s*"((?:[^"\\]|\\.)*)"', text)
        if found:
            return json.loads(f'"{found.group(1)}"')
    return None


def open_folder_uri(code: str, uri: str) -> None:
    """`code --folder-uri URI` (a new window, or the one already open on it)."""
    try:
        r = subprocess.run([code, "--folder-uri", uri], capture_output=True, text=True, timeout=CODE_TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise VSCodeError(f"{code} did not run: {e}") from None
    if r.returncode != 0:
        lines = (r.stderr or r.stdout).strip().splitlines()
        raise VSCodeError(f"{code} --folder-uri failed: {lines[-1] if lines else f'exit {r.returncode}'}")

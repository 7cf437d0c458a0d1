"""What a workspace's container is made of (docs/WORKSPACES.md): the container runner
(runners/podman.py) calls these to create, re-start and remove it.

A workspace is a container job whose container is kept: `podman run` without `--rm`
under the job's shim, named `mtgpu-ws<job id>`, labelled `mtgpu.workspace`. Its main
process is an entry script (mounted read-only) that runs the lifecycle commands
(`postCreateCommand` once, in the container's own layer a marker says it ran;
`postStartCommand` at every start) and then execs the workspace's command, or waits
quietly when it has none. Stopping it (`podman stop`) ends the run and keeps the
container; starting it again is `podman start --attach` when it was made for the same
GPUs, else its layer is committed to an image and a new container is made from it.
Ports are published on 127.0.0.1 only, at host ports picked here and recorded. Inside,
the tenant is uid 1000 (WS_UID).
"""

from __future__ import annotations

import json
import shlex
import socket
from dataclasses import dataclass

from ...model.job import WorkspaceSpec

ENTRY_MOUNT = "/.mtgpu/workspace-entry"
CREATED_MARKER = "/tmp/.mtgpu-workspace-created"  # in the container's layer: kept while the workspace is
LABEL = "mtgpu.workspace"
GPUS_LABEL = "mtgpu.gpus"
# The tenant is uid/gid 1000 inside a workspace (keep-id:uid=1000), mapped to its own on the
# node: images' usual first user (jovyan, ubuntu, vscode), and a layer podman can commit
# (`save`, a restart on other GPUs): a file owned by a uid above the 65,536 subordinate
# ids, such as the tenant's own, cannot be written into an image.
WS_UID = 1000


def workspace_container(job_id: int) -> str:
    return f"mtgpu-ws{job_id}"


def layer_image(job_id: int) -> str:
    """The image a workspace's layer is committed to when it must be made again."""
    return f"localhost/mtgpu-ws{job_id}-layer:latest"


def entry_script(ws: WorkspaceSpec) -> str:
    """The container's main process: lifecycle commands, then the workspace's command."""
    lines = ["#!/bin/sh", "# written by mtgpu: the workspace's entry (docs/WORKSPACES.md)",
             f"if [ ! -e {CREATED_MARKER} ]; then"]
    for cmd in ws.post_create:
        lines.append(f"  echo '[mtgpu] postCreateCommand: '{shlex.quote(cmd)}")
        lines.append(f"  /bin/sh -c {shlex.quote(cmd)} || echo \"[mtgpu] postCreateCommand failed with status $?\"")
    lines += [f"  : > {CREATED_MARKER}", "fi"]
    for cmd in ws.post_start:
        lines.append(f"echo '[mtgpu] postStartCommand: '{shlex.quote(cmd)}")
        lines.append(f"/bin/sh -c {shlex.quote(cmd)} || echo \"[mtgpu] postStartCommand failed with status $?\"")
    lines += ['if [ "$#" -gt 0 ]; then exec "$@"; fi',
              "trap 'exit 0' TERM INT HUP",
              "while :; do sleep 3600 & wait $!; done", ""]
    return "\n".join(lines)


def pick_host_ports(count: int, taken: set[int] | None = None) -> list[int]:
    """`count` free TCP ports on 127.0.0.1 (bound together, so they differ)."""
    socks, ports = [], []
    try:
        while len(ports) < count:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            p = s.getsockname()[1]
            if p not in (taken or set()):
                ports.append(p)
    finally:
        for s in socks:
            s.close()
    return ports


def publish_args(ports: dict[int, int]) -> list[str]:
    """`-p 127.0.0.1:HOST:PORT` for each container port: the node's loopback only."""
    out = []
    for port, host in sorted(ports.items()):
        out += ["-p", f"127.0.0.1:{host}:{port}"]
    return out


@dataclass(frozen=True)
class Existing:
    """A workspace container found in the tenant's store."""

    gpus: str  # its mtgpu.gpus label: the GPU indices it was made for
    ports: dict[int, int]  # container port -> host port


def parse_inspect(text: str) -> Existing | None:
    """`podman container inspect NAME` output (a JSON list of one), or None."""
    try:
        doc = json.loads(text)
        c = doc[0] if isinstance(doc, list) else doc
    except (ValueError, IndexError, KeyError, TypeError):
        return None
    labels = (c.get("Config") or {}).get("Labels") or {}
    bindings = (c.get("HostConfig") or {}).get("PortBindings") or {}
    ports = {}
    for key, binds in bindings.items():
        try:
            port = int(str(key).split("/", 1)[0])
            host = int((binds or [{}])[0].get("HostPort") or 0)
        except (ValueError, AttributeError):
            continue
        if host:
            ports[port] = host
    return Existing(gpus=str(labels.get(GPUS_LABEL, "")), ports=ports)


def gpus_label(indices: tuple[int, ...]) -> str:
    return ",".join(str(i) for i in indices)


def url_of(ws: WorkspaceSpec, port: int, host_port: int, token: str | None) -> str:
    """What `mt-container ports` prints for a port (reached on the laptop through a forward)."""
    path = ws.url_path if ws.url_path.startswith("/") else "/" + ws.url_path
    url = f"http://localhost:{host_port}{path}"
    if token and ws.token_env and ws.ports and port == ws.ports[0]:
        url += ("&" if "?" in url else "?") + f"token={token}"
    return url

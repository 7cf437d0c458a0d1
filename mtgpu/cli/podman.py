"""mt-podman: podman as the calling tenant, with this node's rootless settings.

    mt-podman ARGS...        e.g. mt-podman images, mt-podman load -i img.tar,
                             mt-podman ps --filter label=mtgpu.job=12, mt-podman exec NAME sh

The node prepares the tenant's podman (storage driver, containers.conf, runtime folder,
subordinate ids) on first use; container jobs use the same store, so an image loaded or
pulled here is one the tenant's jobs can run when `[CONTAINERS] allow_user_images = true`.
"""

from __future__ import annotations

import os
import sys

from ..client.local import ClientError, LocalClient
from .common import fail


def tenant_podman(got: dict) -> tuple[str, dict[str, str]]:
    """(podman, its environment) for the calling tenant, from the node's answer to
    POST /v1/podman/env: the caller's environment with the node's podman settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTAINERS_") and k != "XDG_RUNTIME_DIR"}
    env.update(got["env"])
    env["HOME"] = os.environ.get("HOME") or got["env"]["HOME"]
    return got.get("podman") or "podman", env


# `podman exec` options that take a value (podman 4): the first other word is the container
EXEC_VALUE_FLAGS = {"--detach-keys", "-e", "--env", "--env-file", "--preserve-fds", "-u", "--user", "-w", "--workdir"}


def exec_target(args: list[str]) -> str | None:
    """The container of `mt-podman [container] exec [OPTIONS] CONTAINER CMD...`, else None."""
    if args[:1] == ["exec"]:
        rest = args[1:]
    elif args[:2] == ["container", "exec"]:
        rest = args[2:]
    else:
        return None
    i = 0
    while i < len(rest):
        a = rest[i]
        if a == "--":
            return rest[i + 1] if i + 1 < len(rest) else None
        if not a.startswith("-") or a == "-":
            return a
        i += 2 if a in EXEC_VALUE_FLAGS else 1
    return None


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if os.geteuid() == 0:
        fail("mt-podman runs podman as the calling tenant; root uses podman itself", 2)
    try:
        with LocalClient() as c:
            # an exec into one of the caller's jobs or workspaces joins that job's cgroup: its GPUs only
            got = c.podman_env(enter=exec_target(args))
    except ClientError as e:
        fail(e)
    podman, env = tenant_podman(got)
    try:
        os.execve(podman, [podman, *args], env)
    except OSError as e:
        fail(f"could not run {podman}: {e}", 1)
    return 1


if __name__ == "__main__":
    sys.exit(main())

"""What several benchmarks share: percentiles, Ctrl-C/SIGTERM that unwind cleanly, and
the container benchmarks' two sides: root's (a node with a busybox image staged, a
temporary tenant, the bench's worker run as that tenant) and the worker's podman."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile, linearly interpolated between the two nearest ranks."""
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _interrupt(signum, _frame):
    # The first signal unwinds everything (the with-blocks clean up); later ones are
    # ignored so that the clean-up itself is not cut short.
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def unwind_on_signals() -> None:
    """SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt once, so `with` blocks clean up."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _interrupt)


def podman_or_users_missing() -> str | None:
    """Why rootless podman as a temporary tenant cannot run here, or None (a why_not)."""
    from tests.support.images import podman_missing
    from tests.support.users import can_create_users

    return podman_missing() or can_create_users()


def run_as_root(name: str, what: str, run, *args, why_not=None) -> dict | int:
    """The part every benchmark's main shares: refuse to run but as root, unwind cleanly
    on a signal; the result of run(*args), or the exit status to return. `why_not`, when
    given, is asked once root is known: None, or why this machine cannot run the bench."""
    import sys

    if os.geteuid() != 0:
        print(f"bench/{name} runs {what}: run it as root", file=sys.stderr)
        return 2
    why = why_not() if why_not is not None else None
    if why:
        print(f"bench/{name} cannot run here: {why}", file=sys.stderr)
        return 2
    unwind_on_signals()
    try:
        return run(*args)
    except KeyboardInterrupt:
        print("interrupted: everything the bench made was removed", file=sys.stderr)
        return 130


def staged(node) -> dict:
    """The images the node reports staged (`containers.staged` of its first member)."""
    with node.client() as c:
        for n in c.nodes():
            return (n.get("containers") or {}).get("staged") or {}
    return {}


@contextlib.contextmanager
def tenant_node(tag: str, containers: Callable[[str], dict], user_prefix: str) -> Iterator[tuple]:
    """(image, node, user): a busybox image `localhost/mtgpu-bench-TAG-XXXX:1` in root's
    store, a standalone node with `[CONTAINERS] enabled = true` plus `containers(image)`
    (its images or templates), waited on until the image is staged, and a temporary
    tenant; all removed on exit, also on failure or a signal."""
    from tests.support.images import busybox_image
    from tests.support.node import running_node, wait_for
    from tests.support.users import temp_user

    with busybox_image(f"localhost/mtgpu-bench-{tag}-{secrets.token_hex(3)}:1") as image, \
            running_node([], CONTAINERS={"enabled": True, **containers(image)}) as node, \
            temp_user(user_prefix) as user:
        wait_for("the image to be staged", lambda: image in staged(node), timeout_s=120)
        yield image, node, user


def worker_as(user, node, script: str, args: list[str], timeout_s: float) -> dict:
    """Run `python SCRIPT ARGS` as the tenant `user` (its uid and groups, its home, a bare
    environment: the node knows callers by SO_PEERCRED) and return the JSON it prints. A
    worker that fails ends the bench with its stderr and the end of the node's log."""
    from tests.support.node import PYTHON

    r = subprocess.run([PYTHON, os.path.abspath(script), *args], user=user.uid, group=user.gid, extra_groups=[],
                       capture_output=True, text=True, cwd=user.home, timeout=timeout_s,
                       env={"PATH": "/usr/bin:/bin", "HOME": user.home, "LANG": "C.UTF-8", "PYTHONPATH": str(ROOT)})
    if r.returncode != 0:
        raise SystemExit(f"the tenant's worker failed ({r.returncode}):\n{r.stderr[-3000:]}\n"
                         f"server log:\n{node.server_log()[-3000:]}")
    return json.loads(r.stdout)


def worker_podman(client) -> tuple[str, dict[str, str]]:
    """In a bench's worker (as the tenant): (podman, its environment) from the node's
    answer to POST /v1/podman/env (what mt-podman uses), with the tenant's HOME."""
    got = client.podman_env()
    return got.get("podman") or "podman", {**got["env"], "HOME": os.environ["HOME"]}

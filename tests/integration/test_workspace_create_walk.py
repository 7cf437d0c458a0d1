"""A workspace create walks the tenant's home for every bind source (workspaces/homepath.py):
a source through `..` and a chain of symlinks takes a quarter of a second or more, and a
request may name many. The node answers other requests meanwhile (issue 24 review): the
walk runs in a worker thread, not on the event loop that serves every request."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from tests.support.node import running_node, wait_for
from tests.support.tenant_api import TenantCallError, TenantSession

LINKS = 40  # the kernel's (and the walk's) limit on symlinks followed
STEP = "a/../"


def _slow_chain(user) -> str:
    """~/slow0 -> a/../a/../.../slow1 -> ... -> a: each link's target as long as a symlink may
    be, so resolving ~/slow0 walks about 32,000 components; all the tenant's."""
    home = Path(user.home)
    (home / "a").mkdir()
    os.lchown(home / "a", user.uid, user.gid)
    n = (4000 - 10) // len(STEP)
    for i in range(LINKS):
        link = home / f"slow{i}"
        link.symlink_to(STEP * n + (f"slow{i + 1}" if i + 1 < LINKS else "a"))
        os.lchown(link, user.uid, user.gid)
    (home / "out").symlink_to("/etc")
    os.lchown(home / "out", user.uid, user.gid)
    return os.path.realpath(home / "a")


def _walking(pid: int, folder: str) -> bool:
    """Whether process `pid` holds `folder` open (the walk holds each folder it passes)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == folder:
                return True
        except OSError:
            continue
    return False


def test_other_requests_are_answered_while_a_create_walks_its_mounts(alice, bob):
    folder = _slow_chain(alice)
    home = alice.home
    mounts = [[f"{home}/slow0", f"/m{i}", False] for i in range(40)] + [[f"{home}/out", "/etc-host", False]]
    parts = {"path": f"{home}/p/.devcontainer/devcontainer.json", "image": "localhost/none", "mounts": mounts}
    with running_node() as node, TenantSession(node.socket_path, alice, timeout_s=600) as creator, \
            TenantSession(node.socket_path, bob) as other:
        assert creator.call("health")["ok"] and other.call("health")["ok"]  # both sessions started
        refused: list[TenantCallError] = []

        def create() -> None:
            try:
                creator.call("create_workspace", {"devcontainer": parts})
            except TenantCallError as e:
                refused.append(e)

        creating = threading.Thread(target=create)
        creating.start()
        try:
            wait_for("the node to walk the mounts", lambda: _walking(node.proc.pid, folder), timeout_s=120,
                     interval_s=0.005)
            answered_during = 0
            for _ in range(3):
                assert other.call("health")["ok"]
                answered_during += creating.is_alive()
            assert answered_during == 3, "a request waited for the create's walk to end"
        finally:
            creating.join(timeout=600)
        assert refused and f"{home}/out -> /etc" in str(refused[0]), refused

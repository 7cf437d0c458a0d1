"""Asking the installed node how it is: over its local socket (STATE_DIR/mtgpu.sock)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..client.local import ClientError, LocalClient
from .plan import StepFailed


def role_of(health: dict) -> str:
    """standalone, leader or follower (a non-voting member is a follower too), from /v1/health;
    marked when the member is cut off from its cluster: "leader (no majority)" for a scheduler
    that lost the majority of the voters (whether or not Raft still calls it the leader),
    "follower (no scheduler)" for a member that reaches no scheduler."""
    if health.get("cluster_mode") != "cluster":
        return "standalone"
    raft = health.get("raft") or {}
    lost = (health.get("standing") or {}).get("lost")
    if lost == "majority":
        return "leader (no majority)"
    role = "leader" if raft.get("is_leader") else "follower"
    return f"{role} (no scheduler)" if lost == "scheduler" else role


def health(socket_path: Path, timeout_s: float = 3.0) -> dict:
    """The node's /v1/health; raises ClientError when it does not answer."""
    with LocalClient(str(socket_path), timeout_s=timeout_s) as c:
        return c.health()


def try_health(socket_path: Path) -> tuple[dict | None, str]:
    """(health, "") when the node answers, else (None, why not)."""
    try:
        return health(socket_path), ""
    except ClientError as e:
        return None, str(e)


@dataclass(frozen=True)
class Waited:
    health: dict
    waited_s: float


def wait_until_answers(socket_path: Path, timeout_s: float, still_running: Callable[[], bool],
                       log_tail: Callable[[], str]) -> Waited:
    """Poll the socket until the node answers; fail at once when the service stops running."""
    start = time.monotonic()
    last = ""
    while True:
        got, last = try_health(socket_path)
        if got is not None and got.get("ok"):
            return Waited(got, time.monotonic() - start)
        if not still_running():
            raise StepFailed(f"mtgpu-server stopped before it answered on {socket_path}; {log_tail()}")
        if time.monotonic() - start > timeout_s:
            raise StepFailed(f"the node did not answer on {socket_path} within {timeout_s:g}s (last: {last}); "
                             f"{log_tail()}")
        time.sleep(0.2)


def running_here(socket_path: Path) -> list[dict]:
    """The jobs and workspaces running on this node, when it answers (else [])."""
    try:
        with LocalClient(str(socket_path), timeout_s=5) as c:
            me = c.health().get("node")
            jobs = c.jobs(all_tenants=True, active_only=True)
    except ClientError:
        return []
    return [j for j in jobs if j.get("state") == "running" and me in (j.get("nodes") or [])]

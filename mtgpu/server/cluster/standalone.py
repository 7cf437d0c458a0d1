"""What a member needs from the cluster (`Link`), and the stand-in of a standalone
node, which is a cluster of one: it always schedules, reads its own current state,
and has no other member to ask. `link.ClusterLink` is the real one."""

from __future__ import annotations

from pathlib import Path

from typing import Protocol

from .errors import ClusterSetupError, LogUnavailable
from .standing import Standing


class Link(Protocol):
    """A member's view of the cluster around it."""

    is_cluster: bool

    def start(self, member) -> None: ...

    def stop(self) -> None: ...

    def in_sync(self) -> bool:
        """Whether the state this member reads is the cluster's current one (its agent may
        start and stop jobs)."""
        ...

    def renew_lease(self) -> None:
        """Renew the jobs' lease where this member's own standing allows it (cluster.lease)."""
        ...

    def pending_reasons(self) -> dict[int, str]:
        """Why queued jobs wait, from the scheduler (when this member is not it)."""
        ...

    def leader_nodes(self) -> list[dict] | None:
        """Every member as the scheduler sees it, or None when no scheduler answers."""
        ...

    def voter_names(self) -> list[str]: ...

    def quorum_problem(self) -> str | None:
        """None while this member hears the cluster; else why what it shows may be stale."""
        ...

    def standing(self) -> Standing:
        """In touch, or cut off since when and what still works there (standing.py)."""
        ...

    async def open_log(self, node_name: str, job_id: int, offset: int, tail_lines: int | None, rank: int):
        """Start streaming a job's log kept by another member (a link.RemoteLog); raises
        LogUnavailable when that member cannot be asked."""
        ...

    def handle_remove(self, name: str) -> dict: ...

    def raft_info(self) -> dict | None: ...

    def fetch_image(self, node_name: str, digest: str, dest: Path) -> None:
        """Stream an image archive from another member into `dest`; raises OSError."""
        ...


class StandaloneLink:
    """A standalone node: its own, only, permanent scheduler."""

    is_cluster = False

    def __init__(self, node_name: str) -> None:
        self.node_name = node_name

    def start(self, member) -> None:
        pass

    def stop(self) -> None:
        pass

    def in_sync(self) -> bool:
        return True  # its journal is the state

    def renew_lease(self) -> None:
        pass  # no lease: nobody else could run its jobs

    def pending_reasons(self) -> dict[int, str]:
        return {}  # it is the scheduler: its own reasons are read directly

    def quorum_problem(self) -> str | None:
        return None

    def standing(self) -> Standing:
        return Standing(True)  # it is its own majority

    def leader_nodes(self) -> list[dict] | None:
        return None

    def voter_names(self) -> list[str]:
        return [self.node_name]

    async def open_log(self, node_name: str, job_id: int, offset: int, tail_lines: int | None, rank: int):
        raise LogUnavailable(f"job {job_id}'s log is kept by {node_name!r}, which is not this standalone node")

    def handle_remove(self, name: str) -> dict:
        raise ClusterSetupError("a standalone node has no other members to remove")

    def raft_info(self) -> dict | None:
        return None

    def fetch_image(self, node_name: str, digest: str, dest: Path) -> None:
        raise OSError(f"image {digest} is kept by {node_name!r}, which is not this standalone node")

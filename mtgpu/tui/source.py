"""Where the terminal app's data comes from: every cluster joined in servers.json, asked
through a RemoteClient that `connect(entry)` opens (straight, or through DirectLink).
A cluster that does not answer gives a snapshot with its error: the app shows it and
asks again at the next refresh; it never stops the app.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Protocol

from .rows import ClusterSnapshot


class ClusterClient(Protocol):
    """What the app needs of a RemoteClient."""

    path: str

    def nodes(self) -> list[dict]: ...
    def jobs(self) -> list[dict]: ...
    def workspaces(self) -> list[dict]: ...
    def close(self) -> None: ...


def group_by_cluster(entries: list[dict]) -> dict[str, list[dict]]:
    """The joined servers per cluster id, in the order joined (several servers of one
    cluster are alternatives: the first that answers is used)."""
    out: dict[str, list[dict]] = {}
    for e in entries:
        out.setdefault(e.get("cluster_id") or e["server"], []).append(e)
    return out


PARTS = ("nodes", "jobs", "workspaces")


class Cluster:
    """One joined cluster: keeps its client open across refreshes, drops it after an
    error (the next call connects again, trying each of the cluster's servers)."""

    def __init__(self, name: str, entries: list[dict], connect: Callable[[dict], Any],
                 clock: Callable[[], float] = time.time) -> None:
        self.name, self.entries, self._connect, self._clock = name, entries, connect, clock
        self._client: Any = None
        self._entry = entries[0]
        self._lock = threading.Lock()

    @property
    def entry(self) -> dict:
        return self._entry

    def client(self) -> Any:
        """The open client, or a new one (the first of the cluster's servers that opens)."""
        with self._lock:
            if self._client is not None:
                return self._client
            problems = []
            for e in self.entries:
                try:
                    self._client, self._entry = self._connect(e), e
                    return self._client
                except Exception as exc:  # noqa: BLE001 - any failure to open is "unreachable", shown
                    problems.append(f"{e['server']}: {exc}")
            raise ConnectionError("; ".join(problems))

    def drop(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing a broken client may fail too; it is gone either way
                pass

    def fetch(self, parts: tuple[str, ...] = PARTS) -> ClusterSnapshot:
        """One refresh: the members with live use, the caller's jobs and workspaces (or
        only the `parts` named: the others stay None)."""
        unknown = set(parts) - set(PARTS)
        if unknown:
            raise ValueError(f"no part {sorted(unknown)} of a cluster to fetch; the parts: {', '.join(PARTS)}")
        try:
            c = self.client()
            nodes, jobs, workspaces = (getattr(c, p)() if p in parts else None for p in PARTS)
        except Exception as exc:  # noqa: BLE001 - a cluster that fails must not stop the app
            self.drop()
            return ClusterSnapshot(self.name, self._entry["server"], self._entry.get("tenant", ""),
                                   error=str(exc) or type(exc).__name__, fetched_at=self._clock())
        return ClusterSnapshot(self.name, self._entry["server"], self._entry.get("tenant", ""),
                               path=getattr(c, "path", "direct"), nodes=nodes, jobs=jobs, workspaces=workspaces,
                               fetched_at=self._clock())

    def call(self, what: Callable[[Any], Any]) -> Any:
        """Run an action (cancel, start, ...) with the cluster's client; an error drops the
        client (when it was the connection) and is raised for the app to show."""
        c = self.client()
        try:
            return what(c)
        except ConnectionError:
            self.drop()
            raise


def fetch_all(clusters: list[Cluster], parts: tuple[str, ...] = PARTS) -> list[ClusterSnapshot]:
    """One fetch of every cluster, all at once (a slow one costs its own timeout, not the
    sum); the snapshots in the clusters' order, each client closed afterwards."""
    if not clusters:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(clusters))) as pool:
        snapshots = list(pool.map(lambda c: c.fetch(parts), clusters))
    for c in clusters:
        c.drop()
    return snapshots


def merge(old: ClusterSnapshot | None, new: ClusterSnapshot) -> ClusterSnapshot:
    """A failed refresh keeps the last answer (shown as stale, with the error)."""
    if new.error is None or old is None or old.nodes is None:
        return new
    return ClusterSnapshot(new.cluster, new.server, new.tenant, old.path, old.nodes, old.jobs, old.workspaces,
                           new.error, new.fetched_at)

"""A new cluster's seed: the founding member that `mtgpu-setup restore` gave a backup
(STATE_DIR/cluster-seed.json, setup/restore.py) proposes it as one command
(`state.seed.v1`) once it leads and its own node is registered, while its replicated
state holds no jobs and no tenants. The state machine takes it or refuses it (it never
overwrites a live cluster's state); once taken the file is renamed
cluster-seed.applied.json, and the log says so in one line."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from ...state import commands as C
from ...state.backup import BackupError, decode
from ...state.store import ReplicationError, commit

log = logging.getLogger(__name__)

SEED = "cluster-seed.json"
APPLIED = "cluster-seed.applied.json"


class ClusterSeed:
    def __init__(self, state_dir: Path, node_name: str) -> None:
        self.path = Path(state_dir) / SEED
        self.node_name = node_name
        self.pending = self.path.is_file()

    def step(self, store) -> None:
        """Call while this member leads (cheap when there is no seed)."""
        if not self.pending or store.applied_index() < store.commit_index():
            return
        with store.lock:
            machine = store.machine
            busy = (len(machine.jobs), len(machine.tenants))
            registered = self.node_name in machine.nodes
        if not registered:
            # this member first: a node of the seed with its name is then left out (the
            # scheduler never marks its own node up again), it does not come in as down
            return
        if any(busy):
            self._give_up(f"the cluster's state holds {busy[0]} jobs and {busy[1]} tenants already; a seed is taken "
                          f"only by a new, empty cluster (if this member took it before a restart cut it short, the "
                          f"state is the seed's: rename the file to {APPLIED})")
            return
        try:
            doc = decode(self.path.read_bytes(), str(self.path))
        except (OSError, BackupError) as e:
            self._give_up(str(e))
            return
        try:
            result = commit(store, C.STATE_SEED, state=doc["state"], at=time.time(), source=f"the backup of node "
                            f"{doc.get('node')} taken at {doc.get('created_at', 0):.0f}")
        except ReplicationError as e:
            log.warning("the seed %s could not be proposed now (%s); trying again", self.path, e)
            return
        if not result.get("ok"):
            self._give_up(result.get("error", "refused"))
            return
        self.pending = False
        applied = self.path.with_name(APPLIED)
        self.path.replace(applied)
        log.info("took the seed %s (node %s's backup): %d jobs, %d tenants; kept as %s", self.path, doc.get("node"),
                 result.get("jobs", 0), result.get("tenants", 0), applied)

    def _give_up(self, why: str) -> None:
        self.pending = False
        log.error("the seed %s is not taken: %s (it is left where it is)", self.path, why)

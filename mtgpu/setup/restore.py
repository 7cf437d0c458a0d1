"""`mtgpu-setup restore FILE`: a backup (`mtgpu-admin backup`, state/backup.py) becomes the
state of a stopped standalone node, on this machine or a new one (docs/INSTALL.md
"Backup and restore"). Refused, naming why and the fix: a damaged file, one from a newer
mtgpu, a node that runs, a STATE_DIR that holds a state already (unless --force: it is then
moved aside, never deleted).

On a cluster member that founds its cluster alone (CLUSTER_MODE = "cluster", PEERS empty
or only itself) and holds no replicated state yet, the backup (its running jobs requeued,
as above) is written as STATE_DIR/cluster-seed.json instead: at its first start, once it
leads, the member proposes it as one command (`state.seed.v1`, server/cluster/seed.py).
A member that joins through PEERS is refused: it takes its state from its cluster."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..client.local import ClientError, LocalClient
from ..config import load_config
from ..config.loader import ConfigError
from ..server.cluster.addresses import advertised
from ..state.backup import BackupError, decode, encode, restored_machine
from ..state.journal import JournaledState
from .plan import SetupRefused


def _runs(socket_path: Path) -> bool:
    if not socket_path.exists():
        return False
    try:
        with LocalClient(str(socket_path), timeout_s=3) as c:
            return bool(c.health().get("ok"))
    except (ClientError, OSError):
        return False


def restore(backup: Path, config: Path, force: bool = False, now: float | None = None) -> list[str]:
    """Restore; returns what was done, in lines. Raises SetupRefused naming why not."""
    try:
        cfg = load_config(config)
    except (ConfigError, OSError) as e:
        raise SetupRefused(f"the config {config} cannot be used: {e}") from None
    seeding = cfg.CLUSTER_MODE == "cluster"
    if seeding and [advertised(p) for p in cfg.PEERS] not in ([], [advertised(cfg.LISTEN)]):
        raise SetupRefused(f"{config} is a cluster member's that joins through PEERS {list(cfg.PEERS)}: a joining "
                           "member takes its state from its cluster. Restore the backup on the member that founds "
                           "the new cluster alone (PEERS empty or only its own LISTEN), start it, then let the "
                           "others join")
    state_dir = Path(cfg.STATE_DIR)
    if _runs(state_dir / "mtgpu.sock"):
        raise SetupRefused(f"a node runs on {state_dir} (its socket answers): stop it first "
                           "(/etc/init.d/mtgpu stop, or systemctl stop mtgpu), then restore")
    try:
        data = backup.read_bytes()
    except OSError as e:
        raise SetupRefused(f"cannot read {backup}: {e.strerror or e}") from None
    try:
        doc = decode(data, str(backup))
        machine, changed = restored_machine(doc, time.time() if now is None else now, str(backup))
    except BackupError as e:
        raise SetupRefused(str(e)) from None
    if seeding:
        return _seed(doc, machine, backup, state_dir, force) + changed
    target = state_dir / "state"
    lines = []
    held = [p for p in (target / "snapshot.json", target / "journal.jsonl") if p.exists() and p.stat().st_size]
    if held:
        lines.append(_move_aside(target, force, f"{target} holds a state already ({', '.join(p.name for p in held)}): "
                                 "give --force to replace it (it is moved aside, not deleted)", "the state"))
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
    store = JournaledState(target)
    try:
        store.machine = machine
        store.snapshot()
    finally:
        store.close()
    lines.insert(0, f"restored {_said(doc, backup)} into {target}: {_counts(doc)}")
    return lines + changed


def _move_aside(folder: Path, force: bool, refusal: str, what: str) -> str:
    """A folder in the way of a restore: refused unless `force`, then renamed beside itself
    with the time (never deleted); says where it went."""
    if not force:
        raise SetupRefused(refusal)
    aside = folder.with_name(f"{folder.name}.before-restore-{time.strftime('%Y%m%d-%H%M%S')}")
    folder.rename(aside)
    return f"{what} that was there is kept in {aside}"


def _said(doc: dict, backup: Path) -> str:
    return (f"{backup} (node {doc['node']}, mtgpu {doc['mtgpu_version']}, taken at "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(doc['created_at']))})")


def _counts(doc: dict) -> str:
    return f"{doc['summary']['jobs']} jobs, {doc['summary']['tenants']} tenants"


def _seed(doc: dict, machine, backup: Path, state_dir: Path, force: bool) -> list[str]:
    """The founding member's seed (see the module): STATE_DIR/cluster-seed.json, root 0600."""
    lines = []
    replica = state_dir / "cluster"
    if replica.is_dir() and any(replica.iterdir()):
        lines.append(_move_aside(replica, force, f"{replica} holds this member's replicated state already: a backup "
                                 "seeds only a new cluster; give --force to move that state aside (it is not deleted) "
                                 "and start anew", "the replicated state"))
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
    seed = state_dir / "cluster-seed.json"
    tmp = seed.with_name(seed.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(encode({**doc, "state": machine.to_dict()}))
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o600)
    tmp.replace(seed)
    lines.insert(0, f"restored {_said(doc, backup)} as the seed of a new cluster in {seed}: {_counts(doc)}; the "
                    "member takes it when it first leads (its log then says \"took the seed\")")
    return lines

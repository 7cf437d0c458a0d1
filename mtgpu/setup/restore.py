"""`mtgpu-setup restore FILE`: a backup (`mtgpu-admin backup`, state/backup.py) becomes the
state of a stopped standalone node, on this machine or a new one (docs/INSTALL.md
"Backup and restore"). Refused, naming why and the fix: a damaged file, one from a newer
mtgpu, a node that runs, a STATE_DIR that holds a state already (unless --force: it is then
moved aside, never deleted), a cluster member (restoring the seed of a new cluster is not
done yet)."""

from __future__ import annotations

import time
from pathlib import Path

from ..client.local import ClientError, LocalClient
from ..config import load_config
from ..config.loader import ConfigError
from ..state.backup import BackupError, decode, restored_machine
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
    if cfg.CLUSTER_MODE == "cluster":
        raise SetupRefused(f"{config} is a cluster member's (CLUSTER_MODE = \"cluster\"): restoring a backup as the "
                           "seed of a new cluster is not done yet; restore it on a standalone node "
                           "(CLUSTER_MODE = \"standalone\")")
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
    target = state_dir / "state"
    lines = []
    held = [p for p in (target / "snapshot.json", target / "journal.jsonl") if p.exists() and p.stat().st_size]
    if held:
        if not force:
            raise SetupRefused(f"{target} holds a state already ({', '.join(p.name for p in held)}): give --force "
                               "to replace it (it is moved aside, not deleted)")
        aside = state_dir / f"state.before-restore-{time.strftime('%Y%m%d-%H%M%S')}"
        target.rename(aside)
        lines.append(f"the state that was there is kept in {aside}")
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
    store = JournaledState(target)
    try:
        store.machine = machine
        store.snapshot()
    finally:
        store.close()
    s = doc["summary"]
    lines.insert(0, f"restored {backup} (node {doc['node']}, mtgpu {doc['mtgpu_version']}, taken at "
                    f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(doc['created_at']))}) into {target}: "
                    f"{s['jobs']} jobs, {s['tenants']} tenants")
    return lines + changed

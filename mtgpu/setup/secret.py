"""The cluster secret at install (DESIGN §2 CLUSTER_SECRET_FILE).

The first member creates it; a member that joins through PEERS must have it already:
copied from the first member, or given with --secret-file. The rule for "first" is the
server's own (`server.cluster.link.open_cluster_member`): no PEERS, or PEERS naming only
this node's LISTEN; `--first` also makes a founding member named in a longer PEERS list
the one that creates it (then copy it to the other founders before they start).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from ..config import Config
from ..server.cluster.addresses import advertised
from .plan import Check, SetupRefused

MIN_SECRET_CHARS = 32


def is_first_member(config: Config, first_flag: bool) -> bool:
    peers = [advertised(p) for p in config.PEERS]
    return first_flag or not peers or peers == [advertised(config.LISTEN)]


def _read_secret(path: Path, what: str) -> str:
    try:
        value = path.read_text().strip()
    except OSError as e:
        raise SetupRefused(f"{what} {path} cannot be read ({e.strerror or e}); give a readable file") from None
    if len(value) < MIN_SECRET_CHARS:
        raise SetupRefused(f"{what} {path} holds {len(value)} characters; a cluster secret needs at least "
                           f"{MIN_SECRET_CHARS}: copy the first member's CLUSTER_SECRET_FILE (or make a new one "
                           "for a new cluster with `mtgpu-setup secret`)")
    return value


@dataclass
class SecretPlan:
    """What the secret step does: `create` a new one (first member), `copy` the one given
    with --secret-file, or nothing (the file is there)."""

    path: Path
    action: str  # "create", "copy" or "present"
    source: Path | None = None

    def check(self) -> Check:
        if self.path.exists():
            return Check(True, f"{self.path}")
        return Check(False, {"create": "this is the first member: a new one",
                             "copy": f"from {self.source}"}.get(self.action, ""))

    def apply(self) -> str:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        value = secrets.token_urlsafe(48) if self.action == "create" else _read_secret(self.source, "--secret-file")
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(value + "\n")
        if self.action == "create":
            return (f"created {self.path} (mode 0600); copy it to every member that joins "
                    f"(their CLUSTER_SECRET_FILE, or mtgpu-setup install --secret-file PATH there)")
        return f"copied {self.source} to {self.path} (mode 0600)"


def plan_secret(config: Config, first_flag: bool, secret_file: Path | None) -> SecretPlan | None:
    """None for a standalone node. Raises SetupRefused for a joiner without the secret, or a
    --secret-file that disagrees with the one already in place."""
    if not config.is_cluster:
        if secret_file is not None or first_flag:
            raise SetupRefused(f"{'--secret-file' if secret_file is not None else '--first'} is for cluster mode, and "
                               "this config is standalone: give --cluster-id ID (or set CLUSTER_MODE = \"cluster\" "
                               "and CLUSTER_ID in the config), or leave the flag out")
        return None
    path = Path(config.secret_file_path)
    if secret_file is not None:
        given = _read_secret(secret_file, "--secret-file")
        if path.exists():
            if _read_secret(path, "CLUSTER_SECRET_FILE") != given:
                raise SetupRefused(f"CLUSTER_SECRET_FILE {path} already holds a different secret than --secret-file "
                                   f"{secret_file}: remove {path} if this node is to join the other cluster, or "
                                   "leave --secret-file out")
            return SecretPlan(path, "present")
        return SecretPlan(path, "copy", secret_file)
    if path.exists():
        _read_secret(path, "CLUSTER_SECRET_FILE")
        return SecretPlan(path, "present")
    if is_first_member(config, first_flag):
        return SecretPlan(path, "create")
    raise SetupRefused(
        f"this node joins the cluster {config.CLUSTER_ID!r} through PEERS {list(config.PEERS)} and has no cluster "
        f"secret at {path} (CLUSTER_SECRET_FILE): copy that file from the first member (by default its "
        f"STATE_DIR/cluster.secret, e.g. scp FIRST:/var/lib/mtgpu/cluster.secret {path}; chmod 600 {path}) or pass "
        "--secret-file PATH with a copy of it; if this node is the cluster's first member, pass --first. "
        "Nothing was changed")

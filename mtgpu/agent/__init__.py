"""The node agent: GPU telemetry, job runners (native, rootless Podman) and the local agent."""

from __future__ import annotations

import hashlib
from pathlib import Path


def state_key(state_dir: str | Path) -> str:
    """Ten hex digits naming one node's state directory on this machine: what a member
    keeps outside it (its job cgroups' parent, its podman runtime folder, its CDI spec)
    is named with it, so two members on one machine never share it."""
    return hashlib.sha256(str(Path(state_dir).resolve()).encode()).hexdigest()[:10]

"""What the OS account database says of a tenant: its home and its groups."""

from __future__ import annotations

import grp
import os
import pwd
from pathlib import Path


def supplementary_groups(name: str, gid: int) -> tuple[int, ...]:
    """The OS groups of a tenant besides its primary group (for the job process)."""
    try:
        return tuple(sorted({g.gr_gid for g in grp.getgrall() if name in g.gr_mem} - {gid}))
    except OSError:
        return ()


def home_of(uid: int, default: str) -> str:
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return default


def tenant_home_of(home_root: str | os.PathLike, tenant: str, uid: int) -> str:
    """A tenant's home: the OS account's, else HOME_ROOT/TENANT (TENANT_HOME_ROOT's layout)."""
    return home_of(uid, str(Path(home_root) / tenant))

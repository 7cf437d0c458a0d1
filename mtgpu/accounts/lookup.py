"""What the OS account database says of a tenant: its home and its groups."""

from __future__ import annotations

import grp
import pwd


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

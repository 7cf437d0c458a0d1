"""A tenant's home (accounts/lookup.py): the OS account's when it has one, else its
folder under TENANT_HOME_ROOT."""

from __future__ import annotations

import pwd
from pathlib import Path

from mtgpu.accounts.lookup import tenant_home_of


def test_a_tenant_home_is_the_accounts_else_its_folder_under_the_home_root():
    root = pwd.getpwuid(0)
    assert tenant_home_of("/srv/homes", "anyone", 0) == root.pw_dir
    unused = next(u for u in range(2_000_000_000, 2_000_001_000) if not _exists(u))
    assert tenant_home_of("/srv/homes", "alice", unused) == "/srv/homes/alice"
    assert tenant_home_of(Path("/srv/homes/"), "alice", unused) == "/srv/homes/alice"


def _exists(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False

"""What accounts a node must create for its tenants: a pure plan, no I/O (STYLE: accounts/).

`allocate_ids` is called by the replicated state machine, so it must give every node the
same answer for the same state: it depends only on its arguments, never on the local
account database or a clock. `plan_accounts` compares the tenants the cluster knows with
one node's account database (read by apply.read_os_accounts) and says what to create.
Existing OS accounts are never changed: a clash is a conflict with a message, and that
tenant gets nothing on this node until the clash is resolved.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Literal, Mapping, Sequence

from ..model.tenant import (  # noqa: F401 - part of this module's API
    MAX_ID,
    MAX_NAME_LENGTH,
    RESERVED_NAMES,
    RESERVED_PREFIXES,
    IdRangeExhausted,
    allocate_ids,
    validate_tenant_name,
)

DEFAULT_TENANT_UID_RANGE: tuple[int, int] = (200_000, 299_999)

# Subordinate ids for rootless Podman: SUBID_COUNT ids per tenant, in one of SUBID_BLOCKS
# blocks from SUBID_BASE up to 2**32 - 2. The block is a function of the tenant's uid alone
# (never of its index in TENANT_UID_RANGE, which is 0 for every node's first tenant), so a
# tenant has the same range on every member and two nodes on one machine give their tenants
# different ones. SUBID_ANCHOR_UID (the default range's first uid) keeps the blocks the
# earlier index formula gave to clusters on the default range. The base sits above the
# distribution's own automatic ranges (login.defs SUB_UID_MAX = 600100000) and far above any
# tenant uid, so a tenant's container can never map onto another account's uid.
SUBID_BASE = 1_000_000_000
SUBID_COUNT = 65_536
SUBID_BLOCKS = (MAX_ID + 1 - SUBID_BASE) // SUBID_COUNT  # 50277
SUBID_ANCHOR_UID = 200_000

HOME_MODE = 0o700
KEYS_FILE = ".ssh/authorized_keys"
TENANT_SHELL = "/bin/bash"

HomeLayout = Literal["shared", "per-node"]


# ---------------------------------------------------------------- ids


def subordinate_range(uid: int, uid_range: tuple[int, int]) -> tuple[int, int] | None:
    """(first, count) of the subordinate uids/gids a tenant gets, or None when out of room.

    Keyed on the uid: uids SUBID_BLOCKS apart share a block, so a tenant more than
    SUBID_BLOCKS uids into its range gets none (it would share one with a tenant of the same
    cluster). Two clusters' tenants can still meet on one machine; the range is then refused
    under the files' lock (apply.add_subordinate_ids), never moved elsewhere."""
    lo, hi = uid_range
    if not lo <= uid <= hi or uid - lo >= SUBID_BLOCKS:
        return None
    block = (uid - SUBID_ANCHOR_UID) % SUBID_BLOCKS
    return SUBID_BASE + block * SUBID_COUNT, SUBID_COUNT


def _overlaps(a_first: int, a_count: int, b_first: int, b_count: int) -> bool:
    return a_first < b_first + b_count and b_first < a_first + a_count


def _span(first: int, count: int) -> str:
    return f"{first}-{first + count - 1}"


def subid_overlap(name: str, first: int, count: int,
                  table: Mapping[str, Sequence[tuple[int, int]]]) -> tuple[str, int, int] | None:
    """The first (owner, first, count) entry of another owner in a subuid/subgid table that
    overlaps [first, first + count), or None. Every owner counts: tenants of any node, an
    admin's own useradd ranges, names and numeric uids alike."""
    for other, ranges in sorted(table.items()):
        if other == name:
            continue
        for o_first, o_count in ranges:
            if _overlaps(first, count, o_first, o_count):
                return other, o_first, o_count
    return None


def subid_overlap_problem(name: str, kind: str, path: str, first: int, count: int,
                          other: tuple[str, int, int]) -> str:
    """The refusal when a tenant's range is taken on this machine: the file, the other owner,
    both ranges and the fix."""
    o_name, o_first, o_count = other
    return (f"tenant {name!r}: its subordinate {kind}s {_span(first, count)} overlap {o_name!r}'s "
            f"{_span(o_first, o_count)} in {path}; none added, so rootless containers will not run for "
            f"{name!r} on this machine. Every member gives a tenant the same range (files its containers "
            f"write must mean the same owner everywhere), so no other range is picked: remove or move "
            f"{o_name!r}'s range (usermod --del-sub{kind}s {_span(o_first, o_count)} {o_name}), then restart "
            f"mtgpu-server to add it")


# ---------------------------------------------------------------- names

# ---------------------------------------------------------------- inputs


@dataclass(frozen=True)
class TenantSpec:
    """A tenant as the replicated state knows it: its name, ids and registered public keys."""

    name: str
    uid: int
    gid: int
    keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class OsAccounts:
    """One node's account database: users name -> (uid, gid, home), groups name -> gid,
    and subordinate id ranges name -> ((first, count), ...)."""

    users: Mapping[str, tuple[int, int, str]] = field(default_factory=dict)
    groups: Mapping[str, int] = field(default_factory=dict)
    subuids: Mapping[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    subgids: Mapping[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)


# ---------------------------------------------------------------- plan items


@dataclass(frozen=True)
class GroupToCreate:
    name: str
    gid: int


@dataclass(frozen=True)
class UserToCreate:
    """A user with an unlocked, passwordless entry ('*'): keys-only SSH works, passwords never do."""

    name: str
    uid: int
    gid: int
    home: str
    shell: str = TENANT_SHELL


@dataclass(frozen=True)
class SubIdsToAdd:
    """Subordinate ids for rootless Podman; `uids`/`gids` say which of the two files need it."""

    name: str
    first: int
    count: int
    uids: bool = True
    gids: bool = True


@dataclass(frozen=True)
class HomeToCreate:
    path: str
    uid: int
    gid: int
    mode: int = HOME_MODE


@dataclass(frozen=True)
class HomeToCheck:
    """Shared layout on a node that does not own homes: the home must already be there."""

    path: str
    uid: int
    gid: int


@dataclass(frozen=True)
class KeysToWrite:
    tenant: str
    home: str
    uid: int
    gid: int
    keys: tuple[str, ...]

    @property
    def path(self) -> str:
        return posixpath.join(self.home, KEYS_FILE)


@dataclass(frozen=True)
class AccountPlan:
    create_groups: tuple[GroupToCreate, ...] = ()
    create_users: tuple[UserToCreate, ...] = ()
    add_subids: tuple[SubIdsToAdd, ...] = ()
    create_homes: tuple[HomeToCreate, ...] = ()
    check_homes: tuple[HomeToCheck, ...] = ()
    write_keys: tuple[KeysToWrite, ...] = ()
    conflicts: tuple[str, ...] = ()
    refused_tenants: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.create_groups or self.create_users or self.add_subids or self.create_homes
                    or self.check_homes or self.write_keys)


# ---------------------------------------------------------------- planning


def tenant_home(home_root: str, name: str) -> str:
    return posixpath.join(str(home_root), name)


def _tenant_conflicts(t: TenantSpec, home: str, os_accounts: OsAccounts) -> list[str]:
    """Why this tenant's account cannot be created or reused here ([] when it can)."""
    out: list[str] = []
    who = f"tenant {t.name!r}"
    fix = "choose another name or remove that account"
    user = os_accounts.users.get(t.name)
    if user is not None:
        uid, gid, os_home = user
        if uid != t.uid:
            out.append(f"{who}: the OS already has a user {t.name!r} with uid {uid}; {fix}")
        elif gid != t.gid:
            out.append(f"{who}: the OS already has a user {t.name!r} (uid {uid}) whose group is gid {gid}, "
                       f"not {t.gid}; {fix}")
        elif posixpath.normpath(os_home) != posixpath.normpath(home):
            out.append(f"{who}: the OS already has a user {t.name!r} (uid {uid}) with home {os_home}, "
                       f"not {home}; {fix}")
    for other, (uid, _gid, _home) in os_accounts.users.items():
        if uid == t.uid and other != t.name:
            out.append(f"{who}: uid {t.uid} is already the OS user {other!r}; "
                       "remove that account or reserve its id so the cluster allocates another")
    group_gid = os_accounts.groups.get(t.name)
    if group_gid is not None and group_gid != t.gid:
        out.append(f"{who}: the OS already has a group {t.name!r} with gid {group_gid}; {fix}")
    for other, gid in os_accounts.groups.items():
        if gid == t.gid and other != t.name:
            out.append(f"{who}: gid {t.gid} is already the OS group {other!r}; "
                       "remove that group or reserve its id so the cluster allocates another")
    return out


def _clean_keys(t: TenantSpec, warnings: list[str]) -> tuple[str, ...]:
    keys: list[str] = []
    for i, key in enumerate(t.keys):
        text = key.strip() if isinstance(key, str) else ""
        if not text:
            continue
        if any(c in text for c in "\r\n\0"):
            warnings.append(f"tenant {t.name!r}: key {i} contains a line break or NUL and was left out")
            continue
        if text not in keys:
            keys.append(text)
    return tuple(keys)


def _plan_subids(t: TenantSpec, uid_range: tuple[int, int], os_accounts: OsAccounts,
                 warnings: list[str]) -> SubIdsToAdd | None:
    """The tenant's range, for the files that have none of its: whether it is free is
    decided under the files' lock when it is written (apply.add_subordinate_ids)."""
    rng = subordinate_range(t.uid, uid_range)
    if rng is None:
        warnings.append(f"tenant {t.name!r}: no room for subordinate ids for uid {t.uid} "
                        f"({SUBID_BLOCKS} blocks of {SUBID_COUNT} from {SUBID_BASE}, at most {SUBID_BLOCKS} "
                        f"tenants into TENANT_UID_RANGE); rootless Podman will not work for it")
        return None
    first, count = rng
    need_uids = not os_accounts.subuids.get(t.name)
    need_gids = not os_accounts.subgids.get(t.name)
    for kind, table, needed in (("uid", os_accounts.subuids, need_uids), ("gid", os_accounts.subgids, need_gids)):
        if not needed and (first, count) not in table[t.name]:
            # Kept as it is: a tenant's containers already wrote files with it. Other members
            # give the tenant the cluster's range, which differs.
            have = [_span(f, c) for f, c in table[t.name]]
            dels = " ".join(f"--del-sub{kind}s {r}" for r in have)
            warnings.append(f"tenant {t.name!r}: keeps its subordinate {kind}s {', '.join(have)} of /etc/sub{kind}; "
                            f"members that add them now give it {_span(first, count)}, so with HOME_LAYOUT = "
                            f"\"shared\" files its containers write differ in owner between members. To align, "
                            f"with no container of it running: usermod {dels} --add-sub{kind}s "
                            f"{_span(first, count)} {t.name}")
    if not (need_uids or need_gids):
        return None
    return SubIdsToAdd(t.name, first, count, uids=need_uids, gids=need_gids)


def _foreign_subids_covering(t: TenantSpec, os_accounts: OsAccounts) -> list[str]:
    """Other accounts whose subordinate ids include the tenant's uid/gid could act as it."""
    out = []
    for kind, table, the_id in (("uid", os_accounts.subuids, t.uid), ("gid", os_accounts.subgids, t.gid)):
        for other, ranges in sorted(table.items()):
            if other == t.name:
                continue
            for first, count in ranges:
                if first <= the_id < first + count:
                    out.append(
                        f"tenant {t.name!r}: {other!r}'s subordinate {kind}s {first}-{first + count - 1} "
                        f"(/etc/sub{kind}) include the tenant's {kind} {the_id}, so {other!r}'s rootless "
                        f"containers could act as this tenant; move that range above TENANT_UID_RANGE"
                    )
    return out


def plan_accounts(
    tenants: Sequence[TenantSpec],
    os_accounts: OsAccounts,
    home_root: str,
    layout: HomeLayout,
    is_home_owner_node: bool,
    *,
    uid_range: tuple[int, int] = DEFAULT_TENANT_UID_RANGE,
) -> AccountPlan:
    """What this node must do so every tenant has its account, group, home and keys.

    Idempotent: accounts already present with the same ids and home are reused, so the
    plan of a node that is up to date only rewrites keys (apply skips unchanged ones).
    With `layout="shared"` homes live on shared storage: only the home-owner node creates
    them and writes keys; the others get a HomeToCheck per tenant."""
    if layout not in ("shared", "per-node"):
        raise ValueError(f"layout must be 'shared' or 'per-node', not {layout!r}")
    home_root = str(home_root)
    if not posixpath.isabs(home_root):
        raise ValueError(f"home_root must be an absolute path, not {home_root!r}")
    groups: list[GroupToCreate] = []
    users: list[UserToCreate] = []
    subids: list[SubIdsToAdd] = []
    homes: list[HomeToCreate] = []
    checks: list[HomeToCheck] = []
    keys: list[KeysToWrite] = []
    conflicts: list[str] = []
    refused: list[str] = []
    warnings: list[str] = []
    seen_names: set[str] = set()
    seen_uids: dict[int, str] = {}
    seen_gids: dict[int, str] = {}
    owns_homes = layout == "per-node" or is_home_owner_node

    for t in sorted(tenants, key=lambda t: t.name):
        problems: list[str] = []
        why = validate_tenant_name(t.name)
        if why:
            problems.append(why)
        elif t.name in seen_names:
            problems.append(f"tenant {t.name!r} is listed twice; it is planned once")
        else:
            for the_id, kind in ((t.uid, "uid"), (t.gid, "gid")):
                if not isinstance(the_id, int) or isinstance(the_id, bool) or not 0 < the_id <= MAX_ID:
                    problems.append(f"tenant {t.name!r}: {kind} {the_id!r} is not a valid id")
            if t.uid in seen_uids:
                problems.append(f"tenant {t.name!r}: uid {t.uid} is also tenant {seen_uids[t.uid]!r}'s")
            if t.gid in seen_gids:
                problems.append(f"tenant {t.name!r}: gid {t.gid} is also tenant {seen_gids[t.gid]!r}'s")
        home = tenant_home(home_root, t.name)
        if not problems:
            problems = _tenant_conflicts(t, home, os_accounts)
        if problems:
            conflicts.extend(problems)
            refused.append(t.name)
            continue
        seen_names.add(t.name)
        seen_uids[t.uid] = t.name
        seen_gids[t.gid] = t.name

        if t.name not in os_accounts.groups:
            groups.append(GroupToCreate(t.name, t.gid))
        if t.name not in os_accounts.users:
            users.append(UserToCreate(t.name, t.uid, t.gid, home))
        warnings.extend(_foreign_subids_covering(t, os_accounts))
        sub = _plan_subids(t, uid_range, os_accounts, warnings)
        if sub is not None:
            subids.append(sub)
        if owns_homes:
            homes.append(HomeToCreate(home, t.uid, t.gid))
            keys.append(KeysToWrite(t.name, home, t.uid, t.gid, _clean_keys(t, warnings)))
        else:
            checks.append(HomeToCheck(home, t.uid, t.gid))

    return AccountPlan(
        create_groups=tuple(groups),
        create_users=tuple(users),
        add_subids=tuple(subids),
        create_homes=tuple(homes),
        check_homes=tuple(checks),
        write_keys=tuple(keys),
        conflicts=tuple(conflicts),
        refused_tenants=tuple(refused),
        warnings=tuple(warnings),
    )

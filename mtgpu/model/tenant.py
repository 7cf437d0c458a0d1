"""Tenant names and ids: the pure rules the replicated state applies (every node gets
the same answer) and the account planner reuses."""

from __future__ import annotations

import re
from typing import Mapping

MAX_ID = 2**32 - 2  # (uid_t)-1 means "no user"
MAX_NAME_LENGTH = 32


class IdRangeExhausted(ValueError):
    """TENANT_UID_RANGE has no free id left for another tenant."""


def _lowest_free(lo: int, hi: int, used: set[int]) -> int | None:
    candidate = lo
    for x in sorted(u for u in used if lo <= u <= hi):
        if x == candidate:
            candidate += 1
        elif x > candidate:
            break
    return candidate if candidate <= hi else None


def allocate_ids(
    existing_tenants: Mapping[str, tuple[int, int]],
    uid_range: tuple[int, int],
    taken_os_ids: set[int] | frozenset[int] = frozenset(),
) -> tuple[int, int]:
    """(uid, gid) for a new tenant: the lowest id of `uid_range` free both as a uid and as
    a gid (so uid == gid), else the lowest free uid and the lowest free gid separately.

    Deterministic: only the arguments matter (not their order). `taken_os_ids` are ids the
    replicated state knows to be unusable (e.g. reported clashes, ids of removed tenants
    still held back); they are avoided as uid and as gid. Raises IdRangeExhausted."""
    lo, hi = uid_range
    if not (isinstance(lo, int) and isinstance(hi, int) and 0 < lo <= hi <= MAX_ID):
        raise ValueError(f"uid_range must be (first, last) with 0 < first <= last <= {MAX_ID}, not {uid_range!r}")
    used_uids = {uid for uid, _ in existing_tenants.values()} | set(taken_os_ids)
    used_gids = {gid for _, gid in existing_tenants.values()} | set(taken_os_ids)
    both = _lowest_free(lo, hi, used_uids | used_gids)
    if both is not None:
        return both, both
    uid = _lowest_free(lo, hi, used_uids)
    gid = _lowest_free(lo, hi, used_gids)
    if uid is None or gid is None:
        raise IdRangeExhausted(
            f"TENANT_UID_RANGE [{lo}, {hi}] has no free {'uid' if uid is None else 'gid'} left; "
            "widen TENANT_UID_RANGE or remove tenants that are no longer needed"
        )
    return uid, gid


_NAME_RE = re.compile(r"^[a-z_][a-z0-9_-]*$")

# Accounts and groups Debian, Ubuntu, RHEL and their usual packages create, plus words
# that would read as privileged; no tenant may take them even where they do not exist yet.
RESERVED_NAMES = frozenset(
    """root daemon bin sys sync games man lp mail news uucp proxy www-data backup list irc gnats
    nobody nogroup _apt messagebus sshd ntp chrony polkitd avahi dnsmasq tss uuidd tcpdump
    adm admin administrator wheel sudo staff users shadow tty disk kmem dialout fax voice cdrom
    floppy tape audio video plugdev netdev input render sgx kvm utmp operator src sasl scanner
    lpadmin docker podman containers libvirt lxd tmux ssh ftp postfix postgres mysql redis
    halt shutdown systemd-journal systemd-network systemd-resolve systemd-timesync
    """.split()
)
RESERVED_PREFIXES = ("mtgpu", "systemd-")


def validate_tenant_name(name: str) -> str | None:
    """None when `name` can be a tenant's account name on every node, else why not.

    The portable subset shadow's useradd accepts by default: lowercase letters, digits,
    '_' and '-', starting with a letter or '_', at most 32 characters; not a system name."""
    if not isinstance(name, str) or not name:
        return "a tenant name must not be empty; use lowercase letters, digits, '_' or '-', e.g. 'alice'"
    if len(name) > MAX_NAME_LENGTH:
        return f"tenant name {name!r} is {len(name)} characters; at most {MAX_NAME_LENGTH} are allowed"
    if not _NAME_RE.match(name):
        return (
            f"tenant name {name!r} is not allowed: use lowercase letters, digits, '_' or '-', "
            "starting with a letter or '_', e.g. 'alice' or 'bob-lab'"
        )
    if name in RESERVED_NAMES:
        return f"tenant name {name!r} is reserved for the system; choose another name"
    for prefix in RESERVED_PREFIXES:
        if name.startswith(prefix):
            return f"tenant name {name!r} is reserved (names starting with {prefix!r} are the system's); choose another name"
    return None


DEFAULT_SHARE = 1.0
SHARE_RANGE = (0.01, 1000.0)
SHARE_HELP = (f"a tenant's share is a number from {SHARE_RANGE[0]:g} to {SHARE_RANGE[1]:g} "
              f"(default {DEFAULT_SHARE:g}), e.g. 0.5, 2 or 10")


def validate_share(share: object) -> str | None:
    """None when `share` can be a tenant's fair-share weight, else why not (naming the value).

    The weight divides the tenant's recent usage in the fair-share term (docs/SCHEDULING.md);
    bounded so that neither a tenant nor its penalty can vanish or overflow."""
    if isinstance(share, bool) or not isinstance(share, (int, float)):
        return f"share {share!r} is not a number: {SHARE_HELP}"
    if not SHARE_RANGE[0] <= share <= SHARE_RANGE[1]:  # NaN fails both comparisons
        return f"share {share:g} is out of range: {SHARE_HELP}"
    return None

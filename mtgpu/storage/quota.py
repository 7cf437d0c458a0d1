"""USER_DISK_LIMIT: how much disk a tenant uses, and what a submission over the limit is told.

Two backends behind one small contract (`DiskUsage.usage(tenant, uid, now)`):

- `FsQuotaUsage`: the kernel's own per-uid accounting (quotactl(2), Q_GETQUOTA on the
  filesystem holding TENANT_HOME_ROOT). Exact, instant, counts everything the uid owns on
  that filesystem, and `set_limit` makes the kernel stop writes at the limit.
- `MeasuredUsage`: walks TENANT_HOME_ROOT/TENANT with os.scandir (no symlinks followed,
  other filesystems not entered, hard links counted once), adding st_blocks * 512, under a
  time budget; results are cached per tenant for `max_age_s`. It counts what is in the
  home, whoever owns it, and cannot stop writes: over the limit, new jobs are refused.

`detect_quota_backend` picks FsQuotaUsage only when a quotactl call on that filesystem
succeeds (quota support compiled in, quotas turned on for users); otherwise, as on
kernels without quota support, it falls back to MeasuredUsage and says why.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from mtgpu.model.units import format_size

WARN_FRACTION = 0.9
DEFAULT_MAX_AGE_S = 300.0
DEFAULT_TIME_BUDGET_S = 10.0


@dataclass(frozen=True)
class UsageReading:
    """A tenant's disk use. `complete` is False when a measurement ran out of time: then
    `used_bytes` is a lower bound (still enough to refuse when it is already over)."""

    tenant: str
    used_bytes: int
    measured_at: float
    source: str  # "measured" or "quota"
    complete: bool = True
    problems: tuple[str, ...] = ()


class DiskUsage(Protocol):
    name: str

    def usage(self, tenant: str, uid: int, now: float) -> UsageReading: ...


# ---------------------------------------------------------------- measured


def measure_tree(root: Path | str, *, time_budget_s: float = DEFAULT_TIME_BUDGET_S,
                 clock: Callable[[], float] = time.monotonic) -> tuple[int, bool, list[str]]:
    """(bytes allocated under root, complete?, problems): st_blocks * 512 of every entry,
    the root included, hard links once, symlinks not followed, one filesystem only."""
    problems: list[str] = []
    try:
        top = os.lstat(root)
    except FileNotFoundError:
        return 0, True, []
    except OSError as exc:
        return 0, True, [f"{root}: {exc.strerror or exc}"]
    total = top.st_blocks * 512
    if not stat.S_ISDIR(top.st_mode):
        return total, True, problems
    deadline = clock() + time_budget_s
    seen: set[tuple[int, int]] = set()
    stack = [os.fspath(root)]
    while stack:
        if clock() > deadline:
            return total, False, problems
        current = stack.pop()
        try:
            with os.scandir(current) as it:
                for entry in it:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError as exc:
                        problems.append(f"{entry.path}: {exc.strerror or exc}")
                        continue
                    if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                        key = (st.st_dev, st.st_ino)
                        if key in seen:
                            continue
                        seen.add(key)
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode) and st.st_dev == top.st_dev:
                        stack.append(entry.path)
        except OSError as exc:
            problems.append(f"{current}: cannot be listed: {exc.strerror or exc}")
    return total, True, problems


@dataclass
class MeasuredUsage:
    """Usage measured by walking each tenant's home, cached per tenant for max_age_s."""

    home_root: Path
    max_age_s: float = DEFAULT_MAX_AGE_S
    time_budget_s: float = DEFAULT_TIME_BUDGET_S
    clock: Callable[[], float] = time.monotonic  # bounds the walk only; cache age uses `now`
    name: str = "measured"
    _cache: dict[str, UsageReading] = field(default_factory=dict, repr=False)

    def usage(self, tenant: str, uid: int, now: float) -> UsageReading:
        cached = self._cache.get(tenant)
        if cached is not None and 0 <= now - cached.measured_at < self.max_age_s:
            return cached
        used, complete, problems = measure_tree(Path(self.home_root) / tenant,
                                                time_budget_s=self.time_budget_s, clock=self.clock)
        if not complete:
            problems.append(f"{Path(self.home_root) / tenant}: measuring stopped after {self.time_budget_s:g}s; "
                            "the figure is a lower bound")
        reading = UsageReading(tenant, used, now, self.name, complete, tuple(problems))
        self._cache[tenant] = reading
        return reading

    def invalidate(self, tenant: str | None = None) -> None:
        if tenant is None:
            self._cache.clear()
        else:
            self._cache.pop(tenant, None)


# ---------------------------------------------------------------- filesystem quotas

Q_GETQUOTA = 0x800007
Q_SETQUOTA = 0x800008
USRQUOTA = 0
QIF_BLIMITS = 1
QIF_DQBLKSIZE = 1024  # quota limits are in 1 KiB blocks; curspace is in bytes


def qcmd(cmd: int, kind: int = USRQUOTA) -> int:
    return (cmd << 8) | (kind & 0x00FF)


class IfDqblk(ctypes.Structure):
    """struct if_dqblk of <linux/quota.h>."""

    _fields_ = [
        ("dqb_bhardlimit", ctypes.c_uint64),
        ("dqb_bsoftlimit", ctypes.c_uint64),
        ("dqb_curspace", ctypes.c_uint64),
        ("dqb_ihardlimit", ctypes.c_uint64),
        ("dqb_isoftlimit", ctypes.c_uint64),
        ("dqb_curinodes", ctypes.c_uint64),
        ("dqb_btime", ctypes.c_uint64),
        ("dqb_itime", ctypes.c_uint64),
        ("dqb_valid", ctypes.c_uint32),
    ]


# (cmd, special device, id, struct or None) -> None; raises OSError. Injectable for tests.
Quotactl = Callable[[int, bytes, int, "IfDqblk | None"], None]


def _libc_quotactl(cmd: int, special: bytes, qid: int, dq: IfDqblk | None) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fn = libc.quotactl
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    if fn(cmd, special, qid, ctypes.byref(dq) if dq is not None else None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def block_device_of(path: Path | str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The mount source (e.g. /dev/sda1) of the filesystem holding `path`, from mountinfo."""
    try:
        dev = os.stat(path).st_dev
        text = Path(mountinfo).read_text()
    except OSError:
        return None
    wanted = f"{os.major(dev)}:{os.minor(dev)}"
    for line in text.splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] == wanted and " - " in line:
            after = line.split(" - ", 1)[1].split()
            if len(after) >= 2:
                return after[1]
    return None


@dataclass
class FsQuotaUsage:
    """Usage (and hard limits) from the kernel's user quotas on one filesystem."""

    device: str
    quotactl: Quotactl = _libc_quotactl
    name: str = "quota"

    def usage(self, tenant: str, uid: int, now: float) -> UsageReading:
        dq = IfDqblk()
        try:
            self.quotactl(qcmd(Q_GETQUOTA), self.device.encode(), uid, dq)
        except OSError as exc:
            return UsageReading(tenant, 0, now, self.name, False,
                                (f"quotactl(Q_GETQUOTA, {self.device}, uid {uid}): {exc.strerror or exc}",))
        return UsageReading(tenant, int(dq.dqb_curspace), now, self.name)

    def set_limit(self, uid: int, limit_bytes: int | None) -> str | None:
        """Make the kernel stop the uid's writes at limit_bytes (None: no limit); None or a problem."""
        blocks = 0 if limit_bytes is None else max(1, -(-limit_bytes // QIF_DQBLKSIZE))
        dq = IfDqblk(dqb_bhardlimit=blocks, dqb_bsoftlimit=blocks, dqb_valid=QIF_BLIMITS)
        try:
            self.quotactl(qcmd(Q_SETQUOTA), self.device.encode(), uid, dq)
        except OSError as exc:
            return f"quotactl(Q_SETQUOTA, {self.device}, uid {uid}): {exc.strerror or exc}"
        return None


@dataclass(frozen=True)
class QuotaBackendChoice:
    backend: DiskUsage
    reason: str


def detect_quota_backend(home_root: Path | str, *, quotactl: Quotactl = _libc_quotactl,
                         max_age_s: float = DEFAULT_MAX_AGE_S,
                         mountinfo: str = "/proc/self/mountinfo") -> QuotaBackendChoice:
    """FsQuotaUsage when user quotas are on for the filesystem of home_root, else MeasuredUsage.
    The reason says which was chosen and why (logged at start)."""
    home_root = Path(home_root)
    measured = MeasuredUsage(home_root, max_age_s=max_age_s)
    probe = home_root if home_root.exists() else home_root.parent
    device = block_device_of(probe, mountinfo)
    if device is None or not device.startswith("/"):
        return QuotaBackendChoice(measured, f"measured usage: {probe} is not on a block device with quotas ({device or 'unknown'})")
    try:
        quotactl(qcmd(Q_GETQUOTA), device.encode(), os.stat(probe).st_uid, IfDqblk())
    except OSError as exc:
        why = {
            errno.ENOSYS: "the kernel has no quota support",
            errno.ESRCH: "user quotas are not turned on for it",
            errno.ENOTBLK: "it is not a block device",
            errno.EPERM: "reading quotas needs root",
        }.get(exc.errno or 0, exc.strerror or str(exc))
        return QuotaBackendChoice(measured, f"measured usage: no filesystem quota on {device}: {why}")
    except AttributeError:
        return QuotaBackendChoice(measured, "measured usage: this C library has no quotactl")
    return QuotaBackendChoice(FsQuotaUsage(device, quotactl), f"filesystem quota on {device}")


# ---------------------------------------------------------------- what the tenant is told


def check_submission(tenant: str, usage_bytes: int, limit_bytes: int | None, home: str | Path | None = None) -> str | None:
    """The refusal for a new job of a tenant at or over USER_DISK_LIMIT (None: accepted).
    At the limit counts as over: nothing more can be written there."""
    if limit_bytes is None or usage_bytes < limit_bytes:
        return None
    where = f"under {home}" if home is not None else f"in {tenant}'s home"
    return (f"disk quota exceeded: {format_size(usage_bytes)} used of {format_size(limit_bytes)} "
            f"(USER_DISK_LIMIT); delete files {where} to submit again")


def quota_warning(tenant: str, usage_bytes: int, limit_bytes: int | None, home: str | Path | None = None,
                  *, warn_fraction: float = WARN_FRACTION) -> str | None:
    """A warning once usage reaches warn_fraction of the limit but is still under it."""
    if limit_bytes is None or usage_bytes >= limit_bytes or usage_bytes < warn_fraction * limit_bytes:
        return None
    where = f" under {home}" if home is not None else ""
    percent = int(100 * usage_bytes / limit_bytes)
    return (f"disk nearly full: {format_size(usage_bytes)} used of {format_size(limit_bytes)} ({percent}%, "
            f"USER_DISK_LIMIT); new jobs are refused at the limit; delete files{where} to make room")

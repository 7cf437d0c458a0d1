"""The machine's process table, read through psutil: is a process (still the same one)
alive, and which processes belong to a job, a tenant, a parent or a process group.

A process is identified by its PID plus its start time, so a reused PID is never taken
for the process that had it before. Start times are kept as seconds since boot (as the
kernel keeps them), not since the epoch: a step of the wall clock moves psutil's
create_time of every process, and would make a live process look like another one. The
job shim (stdlib only) records clock ticks since boot; `ticks_to_since_boot` converts.
"""

from __future__ import annotations

import os
from typing import Iterator

import psutil

# One clock tick apart is another process.
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str:
    """This boot of the machine ("" where the kernel does not say): a pid, a start time
    since boot or a monotonic moment means something only within one boot."""
    try:
        with open(BOOT_ID_PATH) as f:
            return f.read().strip()
    except OSError:
        return ""


def ticks_to_since_boot(ticks: int | float) -> float:
    """A start time in clock ticks since boot (field 22 of /proc/PID/stat), in seconds."""
    return float(ticks) * _TICK_S


def alive(pid: int | None) -> bool:
    """The process exists and is not a zombie (a zombie cannot be killed, only reaped)."""
    if not pid:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def started_since_boot(pid: int | None) -> float | None:
    """When a live, non-zombie process started, in seconds since boot; else None."""
    if not pid:
        return None
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        # psutil's create_time is boot time + start; both read now, so the difference is
        # the kernel's start time whatever the wall clock did meanwhile.
        return p.create_time() - psutil.boot_time()
    except psutil.Error:
        return None


def same_process(pid: int | None, started: float | None) -> bool:
    """The process `pid` that started `started` seconds after boot is still running."""
    now = started_since_boot(pid)
    return now is not None and started is not None and abs(now - started) < _TICK_S / 2


def _iter(attrs: list[str]) -> Iterator[psutil.Process]:
    me = os.getpid()
    for p in psutil.process_iter(attrs):
        if p.pid != me:
            yield p


def pids_with_env(wanted: dict[str, str]) -> set[int]:
    """Live processes whose environment holds every one of these variables (other users' too: run as root)."""
    found = set()
    for p in _iter(["environ"]):
        env = p.info.get("environ") or {}
        if all(env.get(k) == v for k, v in wanted.items()):
            found.add(p.pid)
    return found


def pids_of_uid(uid: int) -> set[int]:
    """Processes whose real uid is `uid`."""
    return {p.pid for p in _iter(["uids"]) if p.info.get("uids") and p.info["uids"].real == uid}


def children_of(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def pgroup_pids(pgid: int) -> set[int]:
    """Live (non-zombie) processes of a process group."""
    found = set()
    for p in _iter(["status"]):
        if p.info.get("status") == psutil.STATUS_ZOMBIE:
            continue
        try:
            if os.getpgid(p.pid) == pgid:
                found.add(p.pid)
        except OSError:
            continue
    return found


def find_by_cmdline(tail: list[str]) -> tuple[int, float] | None:
    """(pid, start in seconds since boot) of a live process whose command line ends with `tail`."""
    n = len(tail)
    for p in _iter(["cmdline", "status"]):
        cmd = p.info.get("cmdline") or []
        if cmd[-n:] == tail and p.info.get("status") != psutil.STATUS_ZOMBIE:
            started = started_since_boot(p.pid)
            if started is not None:
                return p.pid, started
    return None


def cmdline(pid: int) -> list[str] | None:
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return None

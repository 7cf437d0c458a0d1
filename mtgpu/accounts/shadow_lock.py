"""The shadow tools' lock on an account file, taken exactly the way they take it.

useradd, usermod and userdel (shadow-utils, checked on Debian 12's 4.13 with strace) lock a
file FILE by writing their pid and a NUL into FILE.PID and hard-linking that to FILE.lock:
the link succeeds for one process only. A FILE.lock whose pid is no longer alive is stale:
they remove it and link again; a live one makes them wait (15 tries, a second apart). With
`--prefix ROOT` the files are ROOT/etc/FILE and ROOT/etc/FILE.lock. Holding the same lock
while reading and writing /etc/subuid means no shadow tool (an admin's useradd giving a new
user its automatic range) and no other mtgpu node on the machine changes the file between
our read and our write.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

LOCK_TIMEOUT_S = 30.0
LOCK_POLL_S = 0.05

# One process holds a lock once: the tools tell holders apart by pid only, so two threads of
# ours would both see "our pid, alive" and neither would ever take it from the other.
_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


class ShadowLockTimeout(Exception):
    """FILE.lock stayed held by a live process; the message names the file, the pid and the fix."""


def lock_path(path: str | os.PathLike) -> Path:
    return Path(f"{os.fspath(path)}.lock")


def _pid_in(lock: Path) -> int | None:
    """The pid a lock file names, or None when it names none (empty, garbage)."""
    text = lock.read_bytes().split(b"\0", 1)[0].strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _link_once(tmp: Path, lock: Path) -> bool:
    """link(tmp, lock) as shadow's do_lock_file does it: taken when the link is made and the
    file then has exactly two names."""
    try:
        os.link(tmp, lock)
    except FileExistsError:
        return False
    if os.stat(tmp).st_nlink == 2:
        return True
    with contextlib.suppress(FileNotFoundError):
        os.unlink(lock)
    return False


def try_lock(path: str | os.PathLike) -> tuple[bool, str]:
    """One attempt at FILE.lock: (True, "") when taken, else (False, who holds it)."""
    lock = lock_path(path)
    pid = os.getpid()
    tmp = Path(f"{os.fspath(path)}.{pid}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, f"{pid}\0".encode())
    finally:
        os.close(fd)
    try:
        if _link_once(tmp, lock):
            return True, ""
        try:
            holder = _pid_in(lock)
        except FileNotFoundError:  # released between our link and our read: try again
            return _link_once(tmp, lock), "a process that just released it"
        if holder is None:
            # The tools refuse such a lock too and never remove it: someone must look.
            return False, f"no valid pid (its content: {lock.read_bytes()[:40]!r}); remove {lock} if no useradd, " \
                          "usermod or mtgpu node is changing the file"
        if _alive(holder):
            return False, f"pid {holder}"
        with contextlib.suppress(FileNotFoundError):  # stale: its holder is gone
            os.unlink(lock)
        return _link_once(tmp, lock), f"pid {holder}"
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def unlock(path: str | os.PathLike) -> None:
    """Remove FILE.lock if it is still ours (names our pid)."""
    lock = lock_path(path)
    with contextlib.suppress(FileNotFoundError, ValueError):
        if _pid_in(lock) == os.getpid():
            os.unlink(lock)


@contextlib.contextmanager
def shadow_lock(path: str | os.PathLike, *, timeout_s: float = LOCK_TIMEOUT_S, poll_s: float = LOCK_POLL_S,
                clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> Iterator[None]:
    """Hold FILE.lock for the block, waiting up to timeout_s for a live holder to let go.
    Raises ShadowLockTimeout (naming the lock file, its holder and the fix) when it does not."""
    key = os.path.abspath(os.fspath(path))
    with _thread_locks_guard:
        thread_lock = _thread_locks.setdefault(key, threading.Lock())
    deadline = clock() + timeout_s
    if not thread_lock.acquire(timeout=max(timeout_s, 0.0)):
        raise ShadowLockTimeout(f"{lock_path(path)} is held by another thread of this process "
                                f"for more than {timeout_s:g}s")
    try:
        while True:
            taken, holder = try_lock(path)
            if taken:
                break
            if clock() >= deadline:
                raise ShadowLockTimeout(
                    f"{lock_path(path)} is held by {holder} for more than {timeout_s:g}s (useradd, usermod "
                    f"or another mtgpu node changing {path}); nothing was written. If no such process runs, "
                    f"remove {lock_path(path)}")
            sleep(poll_s)
        try:
            yield
        finally:
            unlock(path)
    finally:
        thread_lock.release()

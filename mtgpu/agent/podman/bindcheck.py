"""What runc really mounted, checked before the tenant's process runs (docs/ISOLATION.md,
"Bind mounts of workspaces").

The member checks a workspace's bind sources on its own file system before podman runs
(workspaces/homepath.py), but runc looks the source up again, later and in the tenant's
rootless mount namespace: a folder swapped for a symlink in between, or a mount the tenant
made in its own namespace over a plain folder of its home, would be what the container
gets. So a container with tenant binds is made in steps: `podman create`, `podman init`
(runc has made every mount; the container's first process waits, nothing of the image has
run), then this check, then `podman start`. For each bind mount the container holds, the
inode at its target, walked from the waiting process's own root (/proc/PID/root, in the
container's mount namespace, no symlink followed), must be the very inode its source
resolves to on the member's file system: inside the home for the tenant's sources
(resolve_in_home, as at every check), a regular file for the node's own files in the
job folder (root's, so not swappable, but checked all the same; the node's other sources, read-only roots an admin set, are not
the tenant's to swap, and podman's own, /etc/hosts and the like, come from the tenant's own
store, as everything its own podman does: docs/ISOLATION.md). Anything else
names the mount, what runc mounted there (its file system and path, from mountinfo) and
the fix, and the container does not start.

What is compared is the inode at each bind's target, the top of what was mounted there.
A recursive bind (runArgs' `--mount`, recursive unless `bind-nonrecursive`, or
`-v SRC:DST:rbind`) carries a mount the tenant made in its own namespace *below* its
source unseen, as does the home itself, which is not checked: that is what the tenant
reaches there anyway, and a device node it brings is still refused by the container's
device cgroup (docs/ISOLATION.md).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

from mtgpu.workspaces.homepath import OutsideHome, resolve_in_home

_FIX = ("point the source at a real folder of your home (a symlink or a mount swapped in while the "
        "container was made is not followed)")


class BindMismatch(ValueError):
    """A bind mount whose target is not the inode its source names; the message says which."""


@dataclass(frozen=True)
class Bind:
    source: str
    target: str


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def _strictly_below(path: str, top: str) -> bool:
    """Whether `path` names something below `top`, read by component as the home rule
    (homepath.py) reads it: '/home//alice/x' and '/home/alice/./x' are below /home/alice."""
    p, t = _parts(path), _parts(top)
    return len(p) > len(t) and p[:len(t)] == t


def _mounted(root_fd: int, target: str) -> os.stat_result:
    """The inode at `target` as the container sees it: each component opened from the
    container's root without following a symlink (a symlink in the image's path is refused,
    never followed out of the container)."""
    fd = os.dup(root_fd)
    try:
        for name in (p for p in target.split("/") if p not in ("", ".")):
            if name == "..":
                raise BindMismatch(f"the target {target} has '..'")
            try:
                nxt = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as e:
                raise BindMismatch(f"its target {target} cannot be walked in the container ({e.strerror})") from None
            os.close(fd)
            fd = nxt
            st = os.fstat(fd)
            if stat.S_ISLNK(st.st_mode):
                raise BindMismatch(f"its target {target} goes through a symlink of the image ({name}); "
                                   "mount at a real folder of the image")
        return os.fstat(fd)
    finally:
        os.close(fd)


def _swappable(source: str, home: str, node_files: str | None) -> bool:
    """A source the tenant can swap: below its home (the home itself is the node's path),
    or the node's file in the job folder (root's: checked all the same). The node's other sources (its
    read-only roots) and podman's own (/etc/hosts, ...: the tenant's store) are not checked."""
    homes = (home, os.path.realpath(home))
    return (any(_strictly_below(source, h) for h in homes)
            or (node_files is not None and _strictly_below(source, node_files)))


def _expected(source: str, home: str, node_files: str | None) -> os.stat_result:
    """The inode the source names, resolved as the member resolves it."""
    if node_files is not None and _strictly_below(source, node_files):  # the job folder (root's): no link taken
        st = os.lstat(source)
        if not stat.S_ISREG(st.st_mode):
            raise BindMismatch(f"the node's file {source} is no longer a regular file")
        return st
    with resolve_in_home(source, home) as p:  # OutsideHome when it leaves the home now
        return os.fstat(p.fd)


def _what(pid: int, target: str) -> str:
    """What mountinfo says is mounted at `target` in the container: 'FSTYPE ROOT (DEV)'."""
    found = ""
    try:
        with open(f"/proc/{pid}/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, tail = left.split(), right.split()
                if len(fields) >= 5 and tail and _unescape(fields[4]) == (target.rstrip("/") or "/"):
                    found = f"{tail[0]} {_unescape(fields[3])} (device {fields[2]})"  # the last: the top one
    except OSError:
        pass
    return found or "something else"


def _unescape(s: str) -> str:
    return s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def check_binds(pid: int, binds: Iterable[Bind], home: str, node_files: str | None = None) -> None:
    """Raise BindMismatch (or OutsideHome) unless every bind of the container whose first
    process is `pid` (waiting, after `podman init`) mounts at its target the inode its
    source resolves to (see the module's text)."""
    root_fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for b in binds:
            if not _swappable(b.source, home, node_files):
                continue
            try:
                want = _expected(b.source, home, node_files)
                got = _mounted(root_fd, b.target)
            except OutsideHome as e:
                raise OutsideHome(f"the container's mount of {b.source} at {b.target}: bind source {b.source} {e}; "
                                  f"{_FIX}") from None
            except BindMismatch as e:
                raise BindMismatch(f"the container's mount of {b.source} at {b.target}: {e}; {_FIX}") from None
            except OSError as e:
                raise BindMismatch(f"the container's mount of {b.source} at {b.target} could not be checked "
                                   f"({e.strerror or e}); {_FIX}") from None
            if (got.st_dev, got.st_ino) != (want.st_dev, want.st_ino):
                raise BindMismatch(
                    f"the container's mount of {b.source} at {b.target} is not {b.source}: runc mounted "
                    f"{_what(pid, b.target)} there (the source was swapped, or mounted over in your own "
                    f"namespace, after it was checked); {_FIX}")
    finally:
        os.close(root_fd)


__all__ = ["Bind", "BindMismatch", "check_binds"]

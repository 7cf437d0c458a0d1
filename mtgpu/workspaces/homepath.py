"""Bind sources resolved on the real file system, as the kernel would resolve them, and
kept inside the tenant's home (docs/ISOLATION.md, "Bind mounts").

The rule in mounts.py reads the text of a path; this module walks it. Starting from a
descriptor of the home, each component is opened with O_PATH | O_NOFOLLOW relative to the
one before (openat), so no path is ever looked up from "/" again and a component swapped
while the walk runs is seen as what it is at that moment. A symlink is read from its own
descriptor and followed only while it stays in the home (a relative target is walked on
from where it is; an absolute one must be written under the home); `..` may climb back up
to the home, never above it. The end must be a folder or a regular file: a device node, a
socket or a FIFO is refused, whatever its folder.

Hard links need no rule of their own: a hard link is one more name of an inode on the same
file system (never /dev's devtmpfs; a device node anywhere is refused at the end of the
walk), a tenant may link only files it owns or can read and write where
fs.protected_hardlinks is on (systemd turns it on; the kernel's own default is off), and
either way the inode's own owner and mode still decide who reads it in the container,
where the tenant is its own uid.

`resolve_in_home` returns the resolved path with its descriptor held; `source_problems`
turns a list of sources into the devcontainer.json problems (key, value, fix) a tenant sees.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

from mtgpu.workspaces.errors import Problem
from mtgpu.workspaces.mounts import HomeFolder, Mount
from mtgpu.workspaces.runargs import host_sources

MAX_SYMLINKS = 40  # the kernel's own limit (ELOOP)
PATH_MAX = 4096  # Linux's, with the terminating NUL: no longer path can be handed to podman (ENAMETOOLONG)
_KINDS = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket",
          stat.S_IFIFO: "a FIFO (named pipe)"}
_MOUNT_FIX = ("a workspace mounts only folders and regular files of your home: point the source at the "
              "real folder in your home, or use a named volume (type=volume)")


class OutsideHome(ValueError):
    """A source that does not resolve to a folder or regular file inside the home; the
    message says where the walk left (or what it found) and is shown after the source."""


@dataclass
class HomePath:
    """A source resolved inside the home: `real` has no symlink, `..` or `.` left; `fd`
    (O_PATH) holds the very inode that was checked until close()."""

    written: str
    real: str
    is_dir: bool
    fd: int

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "HomePath":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _below(path: str, home: str) -> list[str] | None:
    """The components of absolute `path` below `home` (both as written: no `..` folded,
    duplicate slashes and `.` dropped); None when the text does not start with the home."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    top = [p for p in home.split("/") if p not in ("", ".")]
    if parts[: len(top)] != top:
        return None
    return parts[len(top):]


def _open(name: str, dir_fd: int) -> int:
    return os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def resolve_in_home(path: str, home: str) -> HomePath:
    """Resolve absolute `path` component by component from the home; raise OutsideHome when
    it leaves the home (a symlink, `..`), is missing, ends at anything but a folder or a
    regular file, or grows past PATH_MAX (every folder of the walk is held open for `..`).
    Run as the tenant, a folder the tenant cannot search stops the walk as it would stop
    the tenant's own podman. `home` is the tenant's home (its own path is the
    node's, not the tenant's to change)."""
    if not path.startswith("/"):
        raise OutsideHome("is not an absolute path")
    home_real = os.path.realpath(home)
    spelled = home.spellings if isinstance(home, HomeFolder) else ()  # HOME through a symlink, too
    homes = tuple(dict.fromkeys((home.rstrip("/") or "/", home_real, *(h.rstrip("/") or "/" for h in spelled))))
    todo = next((rest for h in homes if (rest := _below(path, h)) is not None), None)
    if todo is None:
        raise OutsideHome(f"is outside your home {home}")
    stack: list[int] = []
    names: list[str] = []
    links = 0
    try:
        try:
            stack.append(os.open(home_real, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        except OSError as e:
            raise OutsideHome(f"cannot be resolved: your home {_printable(home)} cannot be opened "
                              f"({e.strerror})") from None
        while todo:
            name = todo.pop(0)
            if name == "..":
                if not names:
                    raise OutsideHome(f"leaves your home through '..' (above {_shown(home_real, names)})")
                os.close(stack.pop())
                names.pop()
                continue
            here = _shown(home_real, names + [name])
            try:
                fd = _open(name, stack[-1])
            except FileNotFoundError:
                raise OutsideHome(f"does not exist: {here} is missing; create it first") from None
            except PermissionError:
                raise OutsideHome(f"cannot be reached: {_shown(home_real, names)} is not searchable by you") from None
            except NotADirectoryError:
                raise OutsideHome(f"goes through {_shown(home_real, names)}, which is not a folder") from None
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                try:
                    target = os.readlink("", dir_fd=fd)  # readlinkat(fd, ""): this very link
                finally:
                    os.close(fd)
                links += 1
                if links > MAX_SYMLINKS:
                    raise OutsideHome(f"follows more than {MAX_SYMLINKS} symlinks (a loop?) at {here}")
                if target.startswith("/"):
                    rest = next((r for h in homes if (r := _below(target, h)) is not None), None)
                    if rest is None:
                        raise OutsideHome(f"leaves your home through the symlink {here} -> {_printable(target)}")
                    while len(stack) > 1:
                        os.close(stack.pop())
                    names.clear()
                    todo[:0] = rest
                else:
                    todo[:0] = [p for p in target.split("/") if p not in ("", ".")]
                continue
            stack.append(fd)
            names.append(name)
            if len(os.fsencode(_joined(home_real, names))) >= PATH_MAX:  # each folder held open: bounded here
                raise OutsideHome(f"is longer than the {PATH_MAX - 1} bytes a path may have once resolved "
                                  f"(Linux's PATH_MAX), at {here[:200]}...")
            if todo and not stat.S_ISDIR(mode):
                raise OutsideHome(f"goes through {here}, which is not a folder")
        mode = os.fstat(stack[-1]).st_mode
        kind = _KINDS.get(stat.S_IFMT(mode))
        if kind is not None:
            raise OutsideHome(f"is {kind} ({_shown(home_real, names)}); only folders and regular files are mounted")
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            raise OutsideHome(f"is neither a folder nor a regular file ({_shown(home_real, names)})")
        fd = stack.pop()
        return HomePath(path, _joined(home_real, names), stat.S_ISDIR(mode), fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OutsideHome("is a symlink loop") from None
        raise OutsideHome(f"cannot be resolved: {e.strerror}") from None
    except OutsideHome:
        raise
    except ValueError as e:  # a NUL, or a lone surrogate no file name encodes to
        raise OutsideHome(f"holds a character no file name can ({_printable(str(e))})") from None
    finally:
        for fd in stack:
            os.close(fd)


def _joined(home_real: str, names: list[str]) -> str:
    return "/".join([home_real.rstrip("/"), *names]) if names else home_real


def _shown(home_real: str, names: list[str]) -> str:
    return _printable(_joined(home_real, names))


def _printable(text: str) -> str:
    """`text` as UTF-8 can carry it: the bytes of a name that is not UTF-8 (a symlink's
    target read back as surrogates) written as \\xNN, so that a refusal naming it can be
    sent as JSON, logged, and kept as a job's reason."""
    try:
        return os.fsencode(text).decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate not from a byte (json's "\\ud800")
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def check_source(key: str, written: object, source: str, home: str, what: str = "bind source") -> Problem | None:
    """The problem with one source (None when it resolves inside the home)."""
    try:
        with resolve_in_home(source, home):
            return None
    except OutsideHome as e:
        return Problem(key, written, f"{what} {_printable(source)} {e}; {_MOUNT_FIX}")


def source_problems(sources: Iterable[tuple[str, object, str]], home: str) -> list[Problem]:
    """Every (key, value as written, host path) that does not resolve inside `home`."""
    found = (check_source(key, written, source, home) for key, written, source in sources)
    return [p for p in found if p is not None]


def resolved_source(source: str, home: str) -> str:
    """The real path of a source inside `home` (OutsideHome otherwise): what podman is handed,
    so no symlink of the tenant's is left for it to follow."""
    with resolve_in_home(source, home) as p:
        return p.real


def mount_sources(workspace_mount: Mount | None, mounts: Iterable[Mount], run_args: Iterable[str],
                  ) -> list[tuple[str, object, str]]:
    """(key, value, host path) of every host path a devcontainer.json has podman open:
    `workspaceMount`, the bind `mounts`, and `-v`/`--mount`/`--env-file` in `runArgs`."""
    found: list[tuple[str, object, str]] = []
    if workspace_mount is not None and workspace_mount.type == "bind" and workspace_mount.source:
        found.append(("workspaceMount", workspace_mount.to_mount_arg(), workspace_mount.source))
    for i, m in enumerate(mounts):
        if m.type == "bind" and m.source:
            found.append((f"mounts[{i}]", m.to_mount_arg(), m.source))
    found += host_sources(list(run_args))
    return found


def checked_mounts(mounts: Iterable[tuple[str, str, bool]], run_args: Iterable[str], home: str,
                   ) -> tuple[tuple[str, str, bool], ...]:
    """A workspace's (source, target, read-only) mounts with each source resolved inside the
    home, as the member hands them to podman, after its `runArgs` host paths are checked the
    same way; OutsideHome names the first mount that is not, and the fix."""
    out = []
    for source, target, ro in mounts:
        try:
            out.append((resolved_source(source, home), target, ro))
        except OutsideHome as e:
            shown = _printable(source)
            raise OutsideHome(f"the mount of {shown} at {_printable(target)}: bind source {shown} {e}; "
                              f"{_MOUNT_FIX}") from None
    for key, written, source in host_sources(list(run_args)):
        problem = check_source(key, written, source, home, "host path")
        if problem is not None:
            raise OutsideHome(problem.render())
    return tuple(out)


def recheck_stored_sources(sources: Iterable[str], home: str) -> None:
    """Before a stopped workspace's container starts again (podman mounts its sources anew
    at each start, following what they are then): each stored bind source written under
    the home must still resolve inside it; OutsideHome names the first that does not."""
    for source in sources:
        if _below(source, home) is None and _below(source, os.path.realpath(home)) is None:
            continue  # the node's own mounts (entry script, datasets, ...), never the tenant's
        try:
            resolve_in_home(source, home).close()
        except OutsideHome as e:
            raise OutsideHome(f"the container's mount of {source}: bind source {source} {e}; {_MOUNT_FIX}") from None

"""Publishing DATASETS_DIRECTORIES and PYTHON_INTERPRETERS read-only (DESIGN §2, issue 5 item 4).

Published means: owned by root, readable by everyone (directories also searchable,
executables executable), writable by nobody but root, no setuid/setgid files. Making a
tree so is recursive and changes owners, so it is guarded: system directories (/, /usr,
/home, ...) are refused, symlinks are never followed below the top (a link's target is
not ours to change), other filesystems mounted inside are not entered, and the walk
stops after `max_entries` entries (run it again to continue). Problems of the parents
(a non-root parent, or one group/other-writable without the sticky bit, lets someone
swap the published tree) are reported, never changed: the parents are not ours.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

DEFAULT_MAX_ENTRIES = 200_000

# Refused as a published root: chowning these recursively to root would break the system.
PROTECTED_ROOTS = frozenset(
    Path(p) for p in (
        "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/media", "/mnt",
        "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/usr/bin",
        "/usr/lib", "/usr/local", "/usr/local/bin", "/usr/sbin", "/var", "/var/lib", "/var/tmp",
    )
)

_WRITE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH
_SET_ID = stat.S_ISUID | stat.S_ISGID


@dataclass
class _Walk:
    limit: int
    count: int = 0
    truncated: bool = False
    problems: list[str] = field(default_factory=list)


def wanted_mode(mode: int) -> int:
    """The permission bits a published entry should have, given its current st_mode."""
    bits = stat.S_IMODE(mode)
    if stat.S_ISDIR(mode):
        return (bits | 0o555) & ~_WRITE_BY_OTHERS
    if stat.S_ISREG(mode):
        bits = (bits | 0o444) & ~_WRITE_BY_OTHERS & ~_SET_ID
        if bits & stat.S_IXUSR:
            bits |= 0o111
        return bits
    return bits


def interpreter_publish_root(path: Path) -> Path:
    """What to publish for a PYTHON_INTERPRETERS entry: an environment directory as is; for
    an executable inside ENV/bin with ENV/pyvenv.cfg, the environment; else the file alone
    (so `/usr/bin/python3` never publishes /usr)."""
    if path.is_dir():
        return path
    if path.parent.name == "bin" and (path.parent.parent / "pyvenv.cfg").is_file():
        return path.parent.parent
    return path


def _refusal(path: Path) -> str | None:
    if not path.is_absolute():
        return f"{path}: not an absolute path; a published directory must be given in full"
    real = Path(os.path.realpath(path))
    if real in PROTECTED_ROOTS or path in PROTECTED_ROOTS:
        return f"{path}: refused to publish a system directory ({real}); publish a directory of its own, e.g. /srv/datasets"
    return None


def _entries(top: Path, walk: _Walk) -> Iterator[tuple[str, os.stat_result]]:
    """(path, lstat) of `top` and everything below it, not following symlinks nor entering
    other filesystems; bounded by walk.limit."""
    top = Path(os.path.realpath(top))  # the configured path itself may be a link to the real tree
    try:
        top_st = os.lstat(top)
    except OSError as exc:
        walk.problems.append(f"{top}: {exc.strerror or exc}")
        return
    walk.count += 1
    yield str(top), top_st
    if not stat.S_ISDIR(top_st.st_mode):
        return
    stack = [str(top)]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as it:
                for entry in it:
                    if walk.count >= walk.limit:
                        walk.truncated = True
                        return
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError as exc:
                        walk.problems.append(f"{entry.path}: {exc.strerror or exc}")
                        continue
                    walk.count += 1
                    yield entry.path, st
                    if stat.S_ISDIR(st.st_mode) and st.st_dev == top_st.st_dev:
                        stack.append(entry.path)
        except OSError as exc:
            walk.problems.append(f"{current}: cannot be listed: {exc.strerror or exc}")


def _parent_problems(path: Path) -> list[str]:
    out = []
    real = Path(os.path.realpath(path))
    for parent in real.parents:
        try:
            st = os.stat(parent)
        except OSError as exc:
            out.append(f"{parent}: {exc.strerror or exc}")
            continue
        if st.st_uid != 0:
            out.append(f"{parent} (a parent of {path}) belongs to uid {st.st_uid}, who can replace what is "
                       "published; make it root's or publish from elsewhere")
        elif st.st_mode & _WRITE_BY_OTHERS and not st.st_mode & stat.S_ISVTX:
            out.append(f"{parent} (a parent of {path}) is writable by group or others (mode "
                       f"{stat.S_IMODE(st.st_mode):04o}), so they can replace what is published; chmod go-w {parent}")
        if st.st_mode & 0o001 == 0:
            out.append(f"{parent} (a parent of {path}) is not searchable by others (mode "
                       f"{stat.S_IMODE(st.st_mode):04o}), so tenants cannot reach it; chmod o+x {parent}")
    return out


def publish_read_only(paths: Iterable[Path | str], *, max_entries: int = DEFAULT_MAX_ENTRIES) -> list[str]:
    """Make each path (recursively) root-owned, readable by all and writable by none but
    root. Returns one line per thing fixed ("fixed: ...") and per problem left; entries are
    checked before they are changed, so a published tree costs one walk and no writes."""
    lines: list[str] = []
    for raw in paths:
        path = Path(raw)
        why = _refusal(path)
        if why:
            lines.append(why)
            continue
        if not os.path.lexists(path):
            lines.append(f"{path}: does not exist; create it or remove it from the config")
            continue
        walk = _Walk(limit=max_entries)
        for entry, st in _entries(path, walk):
            if stat.S_ISLNK(st.st_mode):
                if st.st_uid != 0 or st.st_gid != 0:
                    try:
                        os.lchown(entry, 0, 0)
                        lines.append(f"fixed: {entry}: symlink owner {st.st_uid}:{st.st_gid} -> root")
                    except OSError as exc:
                        lines.append(f"{entry}: cannot give the symlink to root: {exc.strerror or exc}")
                continue
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                lines.append(f"{entry}: not a file or directory (a device, socket or fifo); remove it")
                continue
            changes = []
            if st.st_uid != 0 or st.st_gid != 0:
                try:
                    os.chown(entry, 0, 0, follow_symlinks=False)  # clears setuid/setgid bits
                    changes.append(f"owner {st.st_uid}:{st.st_gid} -> root")
                except OSError as exc:
                    lines.append(f"{entry}: cannot give it to root: {exc.strerror or exc}")
                    continue
            mode = wanted_mode(st.st_mode)
            if changes or stat.S_IMODE(st.st_mode) != mode:
                try:
                    os.chmod(entry, mode, follow_symlinks=False)
                except OSError as exc:
                    lines.append(f"{entry}: cannot set mode {mode:04o}: {exc.strerror or exc}")
                    continue
                if stat.S_IMODE(st.st_mode) != mode:
                    changes.append(f"mode {stat.S_IMODE(st.st_mode):04o} -> {mode:04o}")
            if changes:
                lines.append(f"fixed: {entry}: {', '.join(changes)}")
        lines.extend(walk.problems)
        if walk.truncated:
            lines.append(f"{path}: stopped after {max_entries} entries; run again to publish the rest")
        lines.extend(_parent_problems(path))
    return lines


def check_read_only(path: Path | str, *, max_entries: int = DEFAULT_MAX_ENTRIES) -> list[str]:
    """What keeps `path` from being published read-only ([] when it is): entries not owned
    by root, writable by group/others, setuid/setgid, unreadable by others, and parents."""
    path = Path(path)
    why = _refusal(path)
    if why:
        return [why]
    if not os.path.lexists(path):
        return [f"{path}: does not exist"]
    out: list[str] = []
    walk = _Walk(limit=max_entries)
    for entry, st in _entries(path, walk):
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid != 0:
                out.append(f"{entry}: symlink belongs to uid {st.st_uid}")
            continue
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            out.append(f"{entry}: not a file or directory")
            continue
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid != 0:
            out.append(f"{entry}: belongs to uid {st.st_uid}, not root")
        if mode & _WRITE_BY_OTHERS:
            out.append(f"{entry}: writable by group or others (mode {mode:04o})")
        if stat.S_ISREG(st.st_mode) and mode & _SET_ID:
            out.append(f"{entry}: setuid/setgid (mode {mode:04o})")
        if mode != wanted_mode(st.st_mode) and not mode & _WRITE_BY_OTHERS and not (
                stat.S_ISREG(st.st_mode) and mode & _SET_ID):
            out.append(f"{entry}: not readable{' and searchable' if stat.S_ISDIR(st.st_mode) else ''} "
                       f"by everyone (mode {mode:04o})")
    out.extend(walk.problems)
    if walk.truncated:
        out.append(f"{path}: checked only the first {max_entries} entries")
    out.extend(_parent_problems(path))
    return out


def fixed_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("fixed: ")]


def problem_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if not line.startswith("fixed: ")]

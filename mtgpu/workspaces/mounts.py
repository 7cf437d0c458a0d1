"""Mounts of a devcontainer.json (`mounts`, `workspaceMount`, `--mount`/`-v` in `runArgs`):
read from the string form (`type=bind,source=/a,target=/b`, Docker's `--mount`
syntax) and the object form (`{"type": "bind", "source": ..., "target": ...}`), and
kept inside the tenant's home.

Here the home is checked as written (`..` folded, no symlink followed: this reader does no
I/O), so a source the text already puts outside the home is reported with the file's other
problems. What a source really is, symlinks and `..` followed on the node's file system, is
checked by homepath.py where the file is read and where the container is made."""

from __future__ import annotations

import csv
import io
import posixpath
from dataclasses import dataclass

from mtgpu.workspaces.errors import DevContainerError

MOUNT_TYPES = ("bind", "volume", "tmpfs")
_SOURCE_KEYS = ("source", "src")
_TARGET_KEYS = ("target", "destination", "dst")
_READONLY_KEYS = ("readonly", "ro")
_OBJECT_KEYS = ("type", "source", "target")
_TRUE = ("", "1", "true")
_FALSE = ("0", "false")


@dataclass(frozen=True)
class Mount:
    """One mount. `source` is a host path for `bind`, a volume name (or None: anonymous)
    for `volume`, None for `tmpfs`. `options` keeps any other `--mount` keys as written."""

    type: str
    target: str
    source: str | None = None
    read_only: bool = False
    options: tuple[tuple[str, str], ...] = ()

    def to_mount_arg(self) -> str:
        """The value of `podman run --mount`."""
        parts = [f"type={self.type}"]
        if self.source is not None:
            parts.append(f"source={self.source}")
        parts.append(f"target={self.target}")
        if self.read_only:
            parts.append("readonly")
        parts += [f"{k}={v}" if v else k for k, v in self.options]
        return mount_fields(parts)


def mount_fields(fields: list[str]) -> str:
    """`fields` as one `--mount` value: podman 4.3 reads it as a line of CSV (Go's
    encoding/csv), so a field holding `,` or `"` is quoted, its `"` doubled (a path with
    a comma would otherwise be cut there; `:` needs nothing, unlike in `-v`)."""
    line = io.StringIO()
    csv.writer(line, lineterminator="").writerow(fields)
    return line.getvalue()


def bind_mount_arg(source: str, target: str, read_only: bool = False) -> str:
    """`--mount`'s value binding host path `source` at `target`: any folder name holds,
    where `-v SOURCE:TARGET` is cut at each `:` of either."""
    return Mount("bind", target, source, read_only).to_mount_arg()


class HomeFolder(str):
    """A tenant's home as the text checks read it: its real path (which it prints as), also
    written as each of `spellings`. With HOME reached through a symlink (/home -> /var/home),
    `${localEnv:HOME}` expands to /home/alice while the real path is /var/home/alice: a text
    check against one spelling alone refused every mount written with the other. What a
    source really is, is decided by the walk on the file system (homepath.py), which reads
    the same spellings."""

    spellings: tuple[str, ...]

    def __new__(cls, real: str, *also: str) -> "HomeFolder":
        self = super().__new__(cls, real)
        self.spellings = tuple(dict.fromkeys(posixpath.normpath(h) for h in (real, *also)))
        return self


def inside(path: str, folder: str) -> bool:
    """Whether absolute `path`, with `..` resolved, is `folder` or below it (any of a
    HomeFolder's spellings)."""
    p = posixpath.normpath(path)
    for f in folder.spellings if isinstance(folder, HomeFolder) else (posixpath.normpath(folder),):
        if p == f or p.startswith(f.rstrip("/") + "/"):
            return True
    return False


def parse_mount(value: object, key: str) -> Mount:
    """A mount from its string or object form (already variable-substituted)."""
    if isinstance(value, str):
        return _parse_mount_string(value, key)
    if isinstance(value, dict):
        return _parse_mount_object(value, key)
    raise DevContainerError.one(
        key, value, 'a mount is a string "type=bind,source=...,target=..." or an object {"type", "source", "target"}'
    )


def _parse_mount_string(text: str, key: str) -> Mount:
    if "\n" in text or "\r" in text:  # csv.reader raised its own Error: a 500, a traceback
        raise DevContainerError.one(key, text, "a mount holds no line break; write it on one line")
    try:
        fields = next(csv.reader([text]), [])
    except csv.Error as e:
        raise DevContainerError.one(key, text, f"cannot be read as comma-separated key=value fields ({e})") from None
    mount_type, source, target, read_only = "volume", None, None, False
    options: list[tuple[str, str]] = []
    for field in fields:
        name, _, val = field.partition("=")
        name = name.strip().lower()
        if name == "type":
            mount_type = val
        elif name in _SOURCE_KEYS:
            source = val
        elif name in _TARGET_KEYS:
            target = val
        elif name in _READONLY_KEYS:
            if val.lower() not in _TRUE + _FALSE:
                raise DevContainerError.one(key, text, f"{name}={val} is not a boolean; write {name} or {name}=false")
            read_only = val.lower() in _TRUE
        elif name:
            options.append((name, val))
    return _checked(Mount(mount_type, target or "", source or None, read_only, tuple(options)), text, key)


def _parse_mount_object(obj: dict, key: str) -> Mount:
    unknown = sorted(set(obj) - set(_OBJECT_KEYS))
    if unknown:
        raise DevContainerError.one(
            key, obj, f"unknown key {unknown[0]!r} in a mount object; it takes {', '.join(_OBJECT_KEYS)} "
            '(use the string form "type=bind,source=...,target=...,readonly" for more)'
        )
    for k in _OBJECT_KEYS:
        if k in obj and not isinstance(obj[k], str):
            raise DevContainerError.one(key, obj, f"{k} must be a string")
    if "type" not in obj:
        raise DevContainerError.one(key, obj, f"a mount object needs a type ({', '.join(MOUNT_TYPES)})")
    return _checked(Mount(obj["type"], obj.get("target", ""), obj.get("source") or None), obj, key)


def _checked(m: Mount, written: object, key: str) -> Mount:
    if m.type not in MOUNT_TYPES:
        raise DevContainerError.one(key, written, f"mount type {m.type!r} is not supported; use {', '.join(MOUNT_TYPES)}")
    if not m.target:
        raise DevContainerError.one(key, written, "the mount has no target; add target=/path/in/container")
    if not m.target.startswith("/"):
        raise DevContainerError.one(key, written, f"target {m.target!r} is not an absolute path in the container")
    if m.type == "bind" and not m.source:
        raise DevContainerError.one(key, written, "a bind mount needs a source; add source=${localWorkspaceFolder}/...")
    if m.type == "bind" and not m.source.startswith("/"):
        raise DevContainerError.one(
            key, written, f"bind source {m.source!r} is not an absolute path; write it from ${{localWorkspaceFolder}} "
            "or ${localEnv:HOME}"
        )
    if m.type == "volume" and m.source and "/" in m.source:
        raise DevContainerError.one(
            key, written, f"volume source {m.source!r} looks like a path; a volume takes a name (for a folder use type=bind)"
        )
    if m.type == "tmpfs" and m.source:
        raise DevContainerError.one(key, written, "a tmpfs mount has no source; remove source=")
    return m


def check_in_home(m: Mount, home: str, key: str, written: object) -> None:
    """Refuse a bind mount whose source is outside the tenant's home."""
    if m.type == "bind" and m.source and not inside(m.source, home):
        resolved = posixpath.normpath(m.source)
        shown = m.source if resolved == m.source else f"{m.source} (that is {resolved})"
        raise DevContainerError.one(
            key, written, f"bind source {shown} is outside your home {home}; a workspace mounts only folders in "
            "your home: move the data under it, or use a named volume (type=volume)"
        )

"""Feature archives an admin stages (`[CONTAINERS] features`, docs/CONTAINERS.md): what a
registry serves for a Dev Container Feature, a tar (gzip, bzip2, xz or none) of the
Feature's folder with `devcontainer-feature.json` and `install.sh` at its root.

The node reads each archive once, at start, as root (`read_staged`): root's file, written by
root alone, checked whole; it keeps the bytes it checked and hands them to the tenant's
`mt-container` (POST /v1/podman/env, `features`), which unpacks them (`unpack`) into a fresh
folder of its own, checked again: no absolute path, no `..`, no link that leaves the folder
(a symlink's target is relative and holds no `..`; a hard link names an earlier file of the
archive), no member through a symlink, nothing but folders, regular files and links.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
import zlib
from dataclasses import dataclass

METADATA = "devcontainer-feature.json"
INSTALL = "install.sh"
MAX_ARCHIVE_BYTES = 16 * 1024 * 1024
MAX_UNPACKED_BYTES = 64 * 1024 * 1024
MAX_MEMBERS = 10_000


class FeatureArchiveError(ValueError):
    """A staged Feature archive that cannot be used; the message names the file."""


@dataclass(frozen=True)
class StagedArchive:
    """A staged Feature's archive as the node read and checked it at start."""

    path: str
    data: bytes
    sha256: str


@dataclass(frozen=True)
class _Member:
    path: str  # normalized, relative to the Feature's folder
    info: tarfile.TarInfo


def read_staged(path: str) -> StagedArchive:
    """The archive at `path`, read as root and checked: a regular file of root's that no one
    else may write (what the node hands tenants is what root put there), at most
    MAX_ARCHIVE_BYTES, a Feature's folder (check)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise FeatureArchiveError(f"{path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FeatureArchiveError(f"{path} is not a regular file")
        if st.st_uid != 0 or st.st_mode & 0o022:
            raise FeatureArchiveError(
                f"{path} is not root's alone to write (owner uid {st.st_uid}, mode {st.st_mode & 0o777:o}): what runs "
                f"as root in tenants' builds must be root's; chown root {path} && chmod go-w {path}")
        if st.st_size > MAX_ARCHIVE_BYTES:
            raise FeatureArchiveError(f"{path} is larger than {MAX_ARCHIVE_BYTES // (1024 * 1024)} MiB")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_ARCHIVE_BYTES + 1)
    except OSError as e:
        raise FeatureArchiveError(f"{path}: {e.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_ARCHIVE_BYTES:
        raise FeatureArchiveError(f"{path} is larger than {MAX_ARCHIVE_BYTES // (1024 * 1024)} MiB")
    check(data, path)
    return StagedArchive(path, data, hashlib.sha256(data).hexdigest())


def _normalized(name: str, where: str) -> str:
    if name.startswith("/"):
        raise FeatureArchiveError(f"{where}: the member {name!r} has an absolute path; a Feature archive holds its "
                                  "folder's files by relative paths")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise FeatureArchiveError(f"{where}: the member {name!r} climbs out with '..'")
    return "/".join(parts)


def check(data: bytes, where: str) -> list[_Member]:
    """The archive's members, each safe to unpack into a fresh folder; FeatureArchiveError
    naming `where` (the file) for a damaged archive or any member that is not."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            infos = []
            for info in tar:
                infos.append(info)
                if len(infos) > MAX_MEMBERS:
                    raise FeatureArchiveError(f"{where} holds more than {MAX_MEMBERS} files")
    except (tarfile.TarError, EOFError, zlib.error, OSError, ValueError) as e:
        if isinstance(e, FeatureArchiveError):
            raise
        raise FeatureArchiveError(f"{where} is not a readable tar or tar.gz archive (damaged?): {e}") from None
    members: list[_Member] = []
    kinds: dict[str, str] = {}  # path -> "dir", "file", "link"
    total = 0
    for info in infos:
        path = _normalized(info.name, where)
        if not path:
            if not info.isdir():
                raise FeatureArchiveError(f"{where}: the member {info.name!r} names the folder itself")
            continue
        parents = path.split("/")[:-1]
        for i in range(1, len(parents) + 1):
            above = "/".join(parents[:i])
            if kinds.get(above) == "link":
                raise FeatureArchiveError(f"{where}: the member {info.name!r} goes through the symlink {above}")
            if kinds.get(above) == "file":
                raise FeatureArchiveError(f"{where}: the member {info.name!r} goes through the file {above}")
            kinds.setdefault(above, "dir")
        if info.isdir():
            if kinds.get(path, "dir") != "dir":
                raise FeatureArchiveError(f"{where}: {path} is in the archive twice")
            kinds[path] = "dir"
        elif path in kinds:
            raise FeatureArchiveError(f"{where}: {path} is in the archive twice")
        elif info.issym():
            target = info.linkname
            if target.startswith("/") or ".." in target.split("/") or not target:
                raise FeatureArchiveError(f"{where}: the symlink {path} -> {target} may leave the Feature's folder; a "
                                          "symlink here points to a relative path without '..'")
            kinds[path] = "link"
        elif info.islnk():
            target = _normalized(info.linkname, where)
            if kinds.get(target) != "file":
                raise FeatureArchiveError(f"{where}: the hard link {path} -> {info.linkname} names no earlier file "
                                          "of the archive")
            kinds[path] = "file"
        elif info.isfile():
            kinds[path] = "file"
            total += info.size
            if total > MAX_UNPACKED_BYTES:
                raise FeatureArchiveError(f"{where} unpacks to more than {MAX_UNPACKED_BYTES // (1024 * 1024)} MiB")
        else:
            raise FeatureArchiveError(f"{where}: the member {info.name!r} is a device, FIFO or other special file; "
                                      "a Feature's folder holds folders, files and links")
        members.append(_Member(path, info))
    for need in (METADATA, INSTALL):
        if kinds.get(need) != "file":
            raise FeatureArchiveError(f"{where} has no {need} at its root: a Feature archive is the Feature's "
                                      f"folder ({METADATA} and {INSTALL} at the top, as a registry serves it)")
    return members


def unpack(data: bytes, dest: str, where: str) -> None:
    """Unpack the checked archive into `dest`, a fresh, empty folder of the caller's; files
    get mode 0644 (0755 where the archive has an execute bit), folders 0755."""
    members = check(data, where)
    if os.listdir(dest):
        raise FeatureArchiveError(f"{dest} is not empty; a Feature is unpacked into a fresh folder")
    written: dict[str, str] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        for m in members:
            target = os.path.join(dest, m.path)
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
            if m.info.isdir():
                os.makedirs(target, mode=0o755, exist_ok=True)
            elif m.info.issym():
                os.symlink(m.info.linkname, target)
            else:
                source = written[_normalized(m.info.linkname, where)] if m.info.islnk() else None
                mode = 0o755 if (m.info.mode & 0o111) else 0o644
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
                with os.fdopen(fd, "wb") as out:
                    if source is not None:
                        with open(source, "rb") as f:
                            out.write(f.read())
                    else:
                        f = tar.extractfile(m.info)
                        if f is None:
                            raise FeatureArchiveError(f"{where}: {m.path} cannot be read")
                        out.write(f.read())
                os.chmod(target, mode)  # not the umask's
                written[m.path] = target


def read_all_staged(features: dict[str, str]) -> dict[str, StagedArchive]:
    """`[CONTAINERS] features` as written (a Feature -> its archive's path), each read and
    checked, at node start, by the spelling devcontainer.json is matched by (feature_key);
    FeatureArchiveError naming the key, the value and the fix for the first that cannot be
    used (the node does not start with it)."""
    from .features import feature_key

    out = {}
    for ref, path in features.items():
        try:
            out[feature_key(ref) or ref] = read_staged(str(path))
        except FeatureArchiveError as e:
            raise FeatureArchiveError(
                f'[CONTAINERS] features: "{ref}" = "{path}": {e}; stage the Feature as root with the archive its '
                f"registry serves (a tar or tar.gz of its folder, {METADATA} and {INSTALL} at the top; chown root FILE "
                "&& chmod 644 FILE), or remove the entry") from None
    return out

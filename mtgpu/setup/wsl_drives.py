"""The Windows drives of a WSL2 host, hidden from tenants (docs/INSTALL.md, "WSL2 hosts").

WSL mounts each Windows drive under /mnt (drvfs: `/mnt/c`, ...) owned by the
distribution's default user and, unless /etc/wsl.conf says otherwise, open to everyone
(drvfs's default umask is 000): every tenant of a node could read (and often write) the
Windows user's files. `mtgpu-setup install` makes them owner-only, in two places:

- `/etc/wsl.conf`: owner-only masks (`umask=077`, and `fmask`/`dmask` where the options
  set them) merged into `[automount] options`, the rest of the file kept; a comment above
  the line records what was there before, so that undoing it takes out exactly what was
  put in. WSL reads the file when it starts the distribution;
- the drives mounted now: each open one is unmounted and mounted again with the same
  owner (uid=/gid=) and the owner-only masks (Microsoft's documented `umount` + `mount -t
  drvfs C: /mnt/c -o ...`), then checked with stat.

The owner (the mount's uid, normally the admin's own WSL account) keeps full access;
every other uid, tenants included, gets none. The pure parts (the mount table, the
judgement, the wsl.conf edits) are separate from `WindowsDrives`, which reads and acts,
and which a test gives its own idea of what a Windows drive is (a stand-in mount).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .plan import Check, SetupRefused, Step, StepFailed

Runner = Callable[..., subprocess.CompletedProcess]
CHOICES = ("hidden", "open")
DEFAULT_CHOICE = "hidden"
MASK_KEYS = ("umask", "fmask", "dmask")
OWNER_ONLY = "077"
# drvfs options a mount keeps when it is mounted again (its owner and masks are set anew)
KEPT_DRVFS_OPTIONS = ("metadata", "case")
MARK = "# mtgpu-setup made the Windows drives owner-only (docs/INSTALL.md, WSL2 hosts); before:"
NO_SECTION = "no [automount] section"
NO_OPTIONS = "no options line"
RESTART_FIX = ("from Windows run `wsl --shutdown` (or `wsl --terminate DISTRIBUTION`) and start the distribution "
               "again: WSL then mounts the drives with /etc/wsl.conf's owner-only options")


def check_choice(value: str | None) -> str:
    """The --windows-drives setting (None: the default), or SetupRefused naming the flag."""
    if value is None:
        return DEFAULT_CHOICE
    if value not in CHOICES:
        raise SetupRefused(f"--windows-drives {value!r}: give one of {', '.join(CHOICES)} (hidden, the default, makes "
                           "the Windows drives of a WSL2 host owner-only; open leaves them as WSL mounts them)")
    return value


# ---------------------------------------------------------------- the mount table (pure)


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as \\ooo (C:\\ is `C:\\134`)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _options(text: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for item in text.split(","):
        if item:
            key, sep, value = item.partition("=")
            out[key] = value if sep else None
    return out


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo."""

    root: str  # the folder of its filesystem mounted here ("/": the whole filesystem)
    target: str
    mount_options: dict[str, str | None]  # per mount (rw, noatime)
    fstype: str
    source: str
    super_options: dict[str, str | None]  # the filesystem's (9p's aname=drvfs;path=C:\;uid=1000;...)

    @property
    def drvfs_options(self) -> dict[str, str | None]:
        """drvfs's own options (uid, gid, umask, metadata, ...): a `drvfs` mount's, or those
        inside a 9p mount's `aname=drvfs;...`; empty for anything else (virtiofs shows none)."""
        if self.fstype == "drvfs":
            return dict(self.super_options)
        aname = self.super_options.get("aname") or ""
        parts = aname.split(";")
        if self.fstype != "9p" or parts[0] != "drvfs":
            return {}
        return _options(",".join(parts[1:]))


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        if "-" not in fields[6:]:
            continue
        dash = fields.index("-", 6)
        if len(fields) < dash + 3:
            continue
        mounts.append(Mount(root=_unescape(fields[3]), target=_unescape(fields[4]),
                            mount_options=_options(fields[5]), fstype=fields[dash + 1],
                            source=_unescape(fields[dash + 2]),
                            super_options=_options(_unescape(" ".join(fields[dash + 3:])))))
    return mounts


def is_windows_drive(m: Mount) -> bool:
    """WSL's ways of mounting a Windows drive: drvfs (WSL1's name, kept by mount -t drvfs),
    9p with aname=drvfs (WSL2), virtiofs whose source starts with drvfs (WSL2's newer form)."""
    return (m.fstype == "drvfs"
            or (m.fstype == "9p" and (m.super_options.get("aname") or "").split(";")[0] == "drvfs")
            or (m.fstype == "virtiofs" and m.source.startswith("drvfs")))


def drive_letter(m: Mount) -> str | None:
    """"C:" for the drive mounted at `m`, from drvfs's path=, the source, or a one-letter
    mount point (/mnt/c); None when none says it (a share WSL mounted some other way)."""
    path = m.drvfs_options.get("path") or ""
    for text in (path, m.source):
        found = re.match(r"^([A-Za-z]):", text)
        if found:
            return found.group(1).upper() + ":"
    name = os.path.basename(m.target.rstrip("/"))
    if m.root == "/" and re.fullmatch(r"[A-Za-z]", name):
        return name.upper() + ":"
    return None


def drvfs_remount_as(m: Mount) -> tuple[str, str] | None:
    """How WSL mounts the drive again: (`drvfs`, `C:`), as Microsoft documents it."""
    letter = drive_letter(m)
    return ("drvfs", letter) if letter else None


def _mask(value: str | None) -> int | None:
    try:
        return int(value, 8) if value is not None else None
    except ValueError:
        return None


def folder_mask(options: dict[str, str | None]) -> int:
    """The mask drvfs (or a FAT-like filesystem) applies to folders: dmask where given, else
    umask, else none (drvfs's default, 000). dmask is taken over umask because on some
    filesystems it replaces umask rather than adding to it: the weaker reading is assumed."""
    for key in ("dmask", "umask"):
        mask = _mask(options.get(key))
        if mask is not None:
            return mask
    return 0


def judge(m: Mount, mode: int | None, reachable: bool) -> tuple[bool, str]:
    """(open to tenants, why): open when others may list or enter the drive's root (its mode
    as stat shows it, or, for drvfs, what its masks leave others) and can reach its folder."""
    reasons = []
    if mode is not None and mode & 0o005:
        reasons.append(f"its root is mode {mode & 0o7777:04o}: every user may "
                       + ("list and enter it" if mode & 0o001 else "list it"))
    if m.fstype in ("drvfs", "9p") and is_windows_drive(m):
        o = m.drvfs_options
        mask = folder_mask(o)
        if mask & 0o005 != 0o005:
            said = ", ".join(f"{k}={o[k]}" for k in MASK_KEYS if k in o) or "no umask or dmask (drvfs's default 000)"
            reasons.append(f"its options ({said}) leave folders open to every user")
    if not reasons:
        shown = f"mode {mode & 0o7777:04o}" if mode is not None else "no access for others"
        return False, f"owner-only ({shown})"
    if not reachable:
        return False, f"{'; '.join(reasons)}, but others cannot reach {m.target} (a folder above it is not o+x)"
    return True, "; ".join(reasons)


def remount_options(m: Mount, uid: int | None, gid: int | None) -> list[str]:
    """The options to mount `m` again with: its kept drvfs options, read-only if it was,
    the same owner, and owner-only masks."""
    o = m.drvfs_options
    kept = [k if o[k] is None else f"{k}={o[k]}" for k in KEPT_DRVFS_OPTIONS if k in o]
    if "ro" in m.mount_options:
        kept.insert(0, "ro")
    owner = [f"uid={uid}"] if uid is not None else []
    owner += [f"gid={gid}"] if gid is not None else []
    return kept + owner + [f"{k}={OWNER_ONLY}" for k in MASK_KEYS]


# ---------------------------------------------------------------- /etc/wsl.conf (pure)


def _section(line: str) -> str | None:
    s = line.strip()
    return s[1:-1].strip().lower() if s.startswith("[") and s.endswith("]") else None


def _find(lines: list[str]) -> tuple[int | None, int, int | None, int | None]:
    """(the [automount] header's index, the end of that section, the options line's index,
    our marker's index); None where there is none."""
    header = options = marker = None
    end = len(lines)
    for i, line in enumerate(lines):
        name = _section(line)
        if name is not None:
            if header is not None:
                end = i
                break
            if name == "automount":
                header = i
        elif header is not None:
            if re.match(r"^\s*options\s*=", line):
                options = i
            elif line.startswith(MARK):
                marker = i
    return header, end, options, marker


def _split_value(line: str) -> tuple[list[str], bool]:
    """The comma list of an `options = "..."` line (WSL reads it quoted) and whether it was quoted."""
    value = line.split("=", 1)[1].strip()
    quoted = len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'"
    if quoted:
        value = value[1:-1]
    return [item.strip() for item in value.split(",") if item.strip()], quoted


def _join(items: list[str], quoted: bool = True) -> str:
    text = ",".join(items)
    return f'options = "{text}"' if quoted else f"options = {text}"


def _as_dict(items: list[str]) -> dict[str, str | None]:
    return _options(",".join(items))


def options_hide(items: list[str]) -> bool:
    """Do these [automount] options keep others out of the drives (files and folders)?"""
    o = _as_dict(items)
    file_mask = _mask(o.get("fmask"))
    file_mask = file_mask if file_mask is not None else (_mask(o.get("umask")) or 0)
    return folder_mask(o) & 0o007 == 0o007 and file_mask & 0o007 == 0o007


def wsl_conf_hides(text: str) -> bool:
    lines = text.splitlines()
    _, _, options, _ = _find(lines)
    return options is not None and options_hide(_split_value(lines[options])[0])


def wsl_conf_with_drive_masks(text: str) -> str:
    """wsl.conf whose [automount] options make the drives owner-only: umask=077 added
    (or raised), fmask and dmask raised where set; every other option, line and section
    kept. Unchanged when the options hide the drives already (ours or the admin's)."""
    if wsl_conf_hides(text):
        return text
    lines = text.splitlines()
    header, end, options, marker = _find(lines)
    if header is None:
        if lines and lines[-1].strip():
            lines.append("")
        lines += ["[automount]", f"{MARK} {NO_SECTION}", _join([f"umask={OWNER_ONLY}"])]
        return "\n".join(lines) + "\n"
    if options is None:
        new = [f"{MARK} {NO_OPTIONS}"] if marker is None else []
        new.append(_join([f"umask={OWNER_ONLY}"]))
        lines[header + 1:header + 1] = new
        return "\n".join(lines) + "\n"
    items, _ = _split_value(lines[options])
    before = lines[options].strip()
    present = _as_dict(items)
    out = []
    for item in items:
        key = item.partition("=")[0]
        mask = _mask(present.get(key)) if key in MASK_KEYS else None
        out.append(f"{key}={OWNER_ONLY}" if key in MASK_KEYS and (mask is None or mask & 0o077 != 0o077) else item)
    if "umask" not in present:
        out.append(f"umask={OWNER_ONLY}")
    lines[options] = _join(out)
    if marker is None:
        lines.insert(options, f"{MARK} {before}")
    return "\n".join(lines) + "\n"


def wsl_conf_without_drive_masks(text: str) -> str:
    """wsl.conf with what wsl_conf_with_drive_masks put in taken out again: each mask still
    at 077 goes back to its value before (or goes, if it was not there), an options line or
    [automount] section it added goes when nothing else is left in it, and its comment goes.
    Options the admin changed since are kept. Unchanged when the comment is not there."""
    lines = text.splitlines()
    header, end, options, marker = _find(lines)
    if marker is None or header is None:
        return text
    drop = {marker}
    before = lines[marker][len(MARK):].strip()
    if options is not None:
        had = re.match(r"^options\s*=", before) is not None
        old = _as_dict(_split_value(before)[0]) if had else {}
        items, quoted = _split_value(lines[options])
        quoted = _split_value(before)[1] if had else quoted  # written back as the admin wrote it
        out = []
        for item in items:
            key, _, value = item.partition("=")
            if key in MASK_KEYS and value == OWNER_ONLY:
                if key in old:
                    out.append(key if old[key] is None else f"{key}={old[key]}")
                continue
            out.append(item)
        if out or before not in (NO_SECTION, NO_OPTIONS):
            lines[options] = _join(out, quoted)
        else:
            drop.add(options)
    if before == NO_SECTION and not any(lines[i].strip() for i in range(header + 1, end) if i not in drop):
        drop |= set(range(header, end))
        if header > 0 and not lines[header - 1].strip():
            drop.add(header - 1)
    kept = [line for i, line in enumerate(lines) if i not in drop]
    return "\n".join(kept) + "\n" if kept else ""


def wsl_conf_has_our_masks(text: str) -> bool:
    return _find(text.splitlines())[3] is not None


# ---------------------------------------------------------------- the machine (I/O)


@dataclass(frozen=True)
class Drive:
    """A Windows drive mounted now, as found: its mount, its root's mode and owner, and the judgement."""

    mount: Mount
    mode: int | None
    uid: int | None  # the owner: drvfs's uid= where given, else the root's owner
    gid: int | None
    open: bool
    why: str

    @property
    def name(self) -> str:
        letter = drive_letter(self.mount)
        return f"{self.mount.target} ({letter})" if letter else self.mount.target


def _reachable(target: str) -> bool:
    """Can a user that is not the owner walk to `target`: every folder above it o+x?"""
    for parent in Path(target).parents:
        try:
            if not os.stat(parent).st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


class WindowsDrives:
    """The Windows drives of this WSL host and the steps that hide them. `wsl_conf` is the
    file to edit (ROOT/etc/wsl.conf); `live` says whether the drives mounted now are this
    install's to change (not under --root, where only the image's wsl.conf is). `is_drive`
    says which mounts are Windows drives and `remount_as` how one is mounted again
    ((fstype, source), or None when it cannot be): WSL's by default, a stand-in's in tests."""

    def __init__(self, wsl_conf: Path, live: bool = True, is_drive: Callable[[Mount], bool] = is_windows_drive,
                 remount_as: Callable[[Mount], tuple[str, str] | None] = drvfs_remount_as,
                 mountinfo: Path = Path("/proc/self/mountinfo"), run: Runner = subprocess.run) -> None:
        self.wsl_conf = wsl_conf
        self.live = live
        self.is_drive = is_drive
        self.remount_as = remount_as
        self.mountinfo = mountinfo
        self.run = run

    # -------------------------------------------------------- what is there
    def drives(self) -> list[Drive]:
        try:
            table = parse_mountinfo(self.mountinfo.read_text())
        except OSError:
            return []
        top: dict[str, Mount] = {}
        for m in table:  # the last mount on a folder is the one seen there
            top[m.target] = m
        found = []
        for m in top.values():
            if not self.is_drive(m):
                continue
            try:
                st = os.stat(m.target)
                mode, st_uid, st_gid = st.st_mode, st.st_uid, st.st_gid
            except OSError:
                mode = st_uid = st_gid = None
            said_uid, said_gid = m.drvfs_options.get("uid") or "", m.drvfs_options.get("gid") or ""
            uid = int(said_uid) if said_uid.isdigit() else st_uid
            gid = int(said_gid) if said_gid.isdigit() else st_gid
            is_open, why = judge(m, mode, _reachable(m.target))
            found.append(Drive(m, mode, uid, gid, is_open, why))
        return found

    def conf_text(self) -> str:
        try:
            return self.wsl_conf.read_text()
        except OSError:
            return ""

    def status(self) -> dict:
        """For `mtgpu-setup status`: the drives mounted now (when live) and wsl.conf's masks."""
        drives = self.drives() if self.live else []
        return {"live": self.live, "wsl_conf": str(self.wsl_conf), "wsl_conf_hides": wsl_conf_hides(self.conf_text()),
                "ours_in_wsl_conf": wsl_conf_has_our_masks(self.conf_text()),
                "drives": [{"target": d.mount.target, "letter": drive_letter(d.mount), "open": d.open,
                            "why": d.why, "owner_uid": d.uid} for d in drives],
                "open": [d.mount.target for d in drives if d.open]}

    # -------------------------------------------------------- the steps
    def hide_steps(self) -> list[Step]:
        steps = [Step(f"Windows drives owner-only from WSL's next start ([automount] options in {self.wsl_conf})",
                      self._conf_check, self._conf_apply)]
        if self.live:
            steps.append(Step("Windows drives mounted now: mount the open ones again owner-only", self._live_check,
                              self._live_apply))
        return steps

    def unhide_steps(self, why: str) -> list[Step]:
        """Take our masks back out of wsl.conf (the drives mounted now stay as they are until
        WSL starts the distribution again). Already done when they are not there."""
        return [Step(f"take mtgpu-setup's Windows-drive masks out of {self.wsl_conf} ({why})",
                     lambda: Check(not wsl_conf_has_our_masks(self.conf_text()), "none there"), self._conf_undo)]

    def _conf_check(self) -> Check:
        text = self.conf_text()
        if wsl_conf_hides(text):
            return Check(True, "owner-only masks there" if wsl_conf_has_our_masks(text)
                         else "its own options keep others out already")
        return Check(False, "its options leave the drives open to every user" if text else
                     "no wsl.conf yet: WSL mounts the drives open to every user")

    def _conf_apply(self) -> str:
        new = wsl_conf_with_drive_masks(self.conf_text())
        _write(self.wsl_conf, new)
        lines = new.splitlines()
        options = _find(lines)[2]
        line = lines[options].strip() if options is not None else ""
        return f"[automount] {line}; what was there before is recorded in a comment above it"

    def _conf_undo(self) -> str:
        _write(self.wsl_conf, wsl_conf_without_drive_masks(self.conf_text()))
        return ("taken out; the drives mounted now stay owner-only until WSL starts the distribution again "
                "(`wsl --shutdown` from Windows)")

    def _live_check(self) -> Check:
        drives = self.drives()
        if not drives:
            return Check(True, "no Windows drives are mounted")
        opened = [d for d in drives if d.open]
        if not opened:
            return Check(True, "owner-only: " + ", ".join(d.name for d in drives))
        return Check(False, "open to every user: " + "; ".join(f"{d.name}: {d.why}" for d in opened))

    def _live_apply(self) -> str:
        done, failed = [], []
        for d in [d for d in self.drives() if d.open]:
            try:
                done.append(self._remount(d))
            except StepFailed as e:
                failed.append(str(e))
        if failed:
            raise StepFailed("; ".join(failed) + (f" (done: {'; '.join(done)})" if done else ""))
        return "; ".join(done)

    def _call(self, cmd: list[str]) -> subprocess.CompletedProcess:
        try:
            return self.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            return subprocess.CompletedProcess(cmd, 127, "", f"{cmd[0]} is not installed")
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(cmd, 124, "", "did not finish within 60s")

    def _remount(self, d: Drive) -> str:
        m = d.mount
        how = self.remount_as(m) if m.root == "/" else None
        if how is None:
            raise StepFailed(f"{d.name} is open to every user ({d.why}) and is not a whole drive mount that can be "
                             f"mounted again here: {RESTART_FIX}")
        fstype, source = how
        options = remount_options(m, d.uid, d.gid)
        umount = self._call(["umount", m.target])
        lazy = ""
        if umount.returncode != 0:
            umount = self._call(["umount", "-l", m.target])  # busy: detached now, freed when its users let go
            lazy = " (busy: detached lazily; a process that had a file open there keeps it until it closes it)"
        if umount.returncode != 0:
            raise StepFailed(f"{d.name}: `umount {m.target}` failed: {(umount.stderr or umount.stdout).strip()}; "
                             f"{RESTART_FIX}")
        cmd = ["mount", "-t", fstype, source, m.target, "-o", ",".join(options)]
        mounted = self._call(cmd)
        if mounted.returncode != 0:
            raise StepFailed(f"{d.name} was unmounted but `{' '.join(cmd)}` failed "
                             f"({(mounted.stderr or mounted.stdout).strip()}): it is not mounted now (so hidden); "
                             f"to get it back owner-only, {RESTART_FIX}")
        now = next((x for x in self.drives() if x.mount.target == m.target), None)
        if now is None:
            raise StepFailed(f"{d.name}: `{' '.join(cmd)}` succeeded but no Windows drive is mounted on {m.target} "
                             f"now; {RESTART_FIX}")
        if now.open:
            raise StepFailed(f"{d.name} is still open to every user after `{' '.join(cmd)}` ({now.why}); {RESTART_FIX}")
        return f"{d.name} mounted again: {now.why}, owner uid {now.uid}{lazy}"

"""Carry out an AccountPlan on this node's OS: with the lock it takes (shadow_lock), the only
module of accounts/ that touches it.

Accounts are made with the distribution's shadow tools (groupadd, useradd, usermod), so
their locking and file formats are the distribution's. Subordinate ids are written here,
under the lock those tools take on /etc/subuid and /etc/subgid (shadow_lock), because the
range must be checked against every entry of the file when it is written: `usermod
--add-subuids` adds a range that overlaps another user's without a word (shadow 4.13).
`prefix_root` passes `--prefix ROOT` to each tool (and puts the files under ROOT), which
edits ROOT/etc/{passwd,group,shadow,...} instead of the machine's own: tests use it to
simulate nodes with separate account databases.

apply_plan never raises for an OS failure: every step that fails is a line in the report
naming the command (or path) and what the OS said, and the steps that do not depend on
it still run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from mtgpu.accounts.plan import (
    KEYS_FILE,
    AccountPlan,
    GroupToCreate,
    HomeToCheck,
    HomeToCreate,
    KeysToWrite,
    OsAccounts,
    SubIdsToAdd,
    UserToCreate,
    subid_overlap,
    subid_overlap_problem,
)
from mtgpu.accounts.shadow_lock import LOCK_TIMEOUT_S, ShadowLockTimeout, shadow_lock

COMMAND_TIMEOUT_S = 60.0
# The shadow tools already wait ~15 s for a held lock themselves; one more try covers a
# lock freed just after they gave up, without multiplying that wait.
LOCK_RETRIES = 2
KEYS_HEADER = "# Managed by mtgpu: the keys registered for this tenant. Changes here are replaced.\n"

Runner = Callable[..., subprocess.CompletedProcess]


class OsAccountsError(Exception):
    """The account database could not be read; the message names the file and the reason."""


@dataclass
class ApplyReport:
    """What applying a plan did (`done`) and what failed (`problems`), one line each."""

    done: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


# ---------------------------------------------------------------- reading the database


def _etc(prefix_root: str | os.PathLike | None, name: str) -> Path:
    return Path(prefix_root or "/") / "etc" / name


def _colon_lines(path: Path, *, required: bool) -> list[list[str]]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        if required:
            raise OsAccountsError(f"{path}: does not exist") from None
        return []
    except OSError as exc:
        raise OsAccountsError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    rows = []
    for line in text.splitlines():
        if not line or line.startswith("#") or line[0] in "+-":  # skip NIS compat entries
            continue
        rows.append(line.split(":"))
    return rows


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def read_os_accounts(prefix_root: str | os.PathLike | None = None) -> OsAccounts:
    """Parse ROOT/etc/{passwd,group,subuid,subgid} (ROOT is / by default).
    Raises OsAccountsError when passwd or group is missing or unreadable."""
    users: dict[str, tuple[int, int, str]] = {}
    for row in _colon_lines(_etc(prefix_root, "passwd"), required=True):
        if len(row) >= 6:
            uid, gid = _int(row[2]), _int(row[3])
            if uid is not None and gid is not None:
                users.setdefault(row[0], (uid, gid, row[5]))
    groups: dict[str, int] = {}
    for row in _colon_lines(_etc(prefix_root, "group"), required=True):
        if len(row) >= 3 and _int(row[2]) is not None:
            groups.setdefault(row[0], int(row[2]))
    subs = [{k: tuple(v) for k, v in _read_subid_table(_etc(prefix_root, name)).items()}
            for name in ("subuid", "subgid")]
    return OsAccounts(users=users, groups=groups, subuids=subs[0], subgids=subs[1])


def _read_subid_table(path: Path) -> dict[str, list[tuple[int, int]]]:
    table: dict[str, list[tuple[int, int]]] = {}
    for row in _colon_lines(path, required=False):
        if len(row) >= 3 and _int(row[1]) is not None and _int(row[2]) is not None:
            table.setdefault(row[0], []).append((int(row[1]), int(row[2])))
    return table


# ---------------------------------------------------------------- running the shadow tools


def _prefix_args(prefix_root: str | os.PathLike | None) -> list[str]:
    return ["--prefix", str(prefix_root)] if prefix_root else []


def _show(cmd: Sequence[str]) -> str:
    return " ".join(a if a and not any(c in a for c in " '*\"") else repr(a) for a in cmd)


def run_tool(cmd: list[str], run: Runner = subprocess.run) -> tuple[bool, str]:
    """Run one shadow tool, retrying while another process holds the database lock.
    Returns (ok, text): on failure the text names the command, its status and stderr."""
    result: subprocess.CompletedProcess | None = None
    for attempt in range(LOCK_RETRIES):
        try:
            result = run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            return False, f"`{_show(cmd)}` failed: {cmd[0]} is not installed"
        except subprocess.TimeoutExpired:
            return False, f"`{_show(cmd)}` did not finish within {COMMAND_TIMEOUT_S:g}s"
        except OSError as exc:
            return False, f"`{_show(cmd)}` could not run: {exc.strerror or exc}"
        stderr = (result.stderr or "").strip()
        contended = "lock" in stderr.lower() and "No such file or directory" not in stderr
        if result.returncode == 0 or not contended or attempt == LOCK_RETRIES - 1:
            break
        time.sleep(0.2)
    assert result is not None
    if result.returncode == 0:
        return True, _show(cmd)
    stderr = (result.stderr or "").strip() or (result.stdout or "").strip() or "(no output)"
    return False, f"`{_show(cmd)}` failed with status {result.returncode}: {stderr}"


# ---------------------------------------------------------------- subordinate ids


class SubIdsRefused(Exception):
    """The range overlaps another owner's in /etc/subuid or /etc/subgid; nothing was written.
    `problems` has one line per file (subid_overlap_problem)."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def _append_line(path: Path, line: str) -> None:
    """Add a line to an account file as the shadow tools rewrite one: the old content kept as
    FILE-, the new one written to FILE+ (same mode and owner), synced and renamed over FILE."""
    try:
        old = path.read_bytes()
        st = os.stat(path)
        mode, owner = stat.S_IMODE(st.st_mode), (st.st_uid, st.st_gid)
    except FileNotFoundError:
        old, mode, owner = b"", 0o644, None
    if old and not old.endswith(b"\n"):
        old += b"\n"
    for suffix, data in (("-", old), ("+", old + line.encode())):
        tmp = path.with_name(path.name + suffix)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
        try:
            os.write(fd, data)
            if owner is not None:
                os.fchown(fd, *owner)
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
    os.replace(path.with_name(path.name + "+"), path)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def add_subordinate_ids(name: str, first: int, count: int, *, uids: bool = True, gids: bool = True,
                        prefix_root: str | os.PathLike | None = None,
                        timeout_s: float = LOCK_TIMEOUT_S) -> list[str]:
    """Give `name` the subordinate ids first..first+count-1 in ROOT/etc/subuid and/or subgid,
    holding both files' shadow locks (subuid's first, as usermod takes them) from the read
    to the write, so the check sees every entry there is, of any owner. A file where `name`
    already has an entry is left as it is. Returns the kinds written ("uids", "gids").
    Raises SubIdsRefused (nothing written) when the range overlaps another owner's entry,
    ShadowLockTimeout when a lock stays held, OSError when a file cannot be written."""
    files = [(kind, _etc(prefix_root, f"sub{kind}")) for kind, wanted in (("uid", uids), ("gid", gids)) if wanted]
    with contextlib.ExitStack() as locks:
        for _kind, path in files:
            locks.enter_context(shadow_lock(path, timeout_s=timeout_s))
        to_write: list[tuple[str, Path]] = []
        refusals: list[str] = []
        for kind, path in files:
            table = _read_subid_table(path)
            if table.get(name):
                continue
            other = subid_overlap(name, first, count, table)
            if other is not None:
                refusals.append(subid_overlap_problem(name, kind, str(path), first, count, other))
            else:
                to_write.append((kind, path))
        if refusals:
            raise SubIdsRefused(refusals)
        for _kind, path in to_write:
            _append_line(path, f"{name}:{first}:{count}\n")
    return [f"{kind}s" for kind, _path in to_write]


# ---------------------------------------------------------------- the steps


def _create_group(g: GroupToCreate, prefix_root, run: Runner, report: ApplyReport) -> bool:
    ok, text = run_tool(["groupadd", "-g", str(g.gid), *_prefix_args(prefix_root), g.name], run)
    (report.done if ok else report.problems).append(text if not ok else f"created group {g.name} ({g.gid})")
    return ok


def _create_user(u: UserToCreate, prefix_root, run: Runner, report: ApplyReport) -> bool:
    # -M: the home is made by us (mode, owner, no skeleton); -p '*': no password but not
    # locked ('!'), so key-only SSH logins work (sshd refuses locked accounts without PAM);
    # SUB_*_COUNT=0: subordinate ids are added by us, from the tenant's range (add_subordinate_ids).
    cmd = ["useradd", "-u", str(u.uid), "-g", str(u.gid), "-M", "-d", u.home, "-s", u.shell, "-p", "*",
           "-K", "SUB_UID_COUNT=0", "-K", "SUB_GID_COUNT=0", *_prefix_args(prefix_root), u.name]
    ok, text = run_tool(cmd, run)
    (report.done if ok else report.problems).append(text if not ok else f"created user {u.name} ({u.uid}:{u.gid})")
    return ok


def _add_subids(s: SubIdsToAdd, prefix_root, report: ApplyReport) -> None:
    try:
        added = add_subordinate_ids(s.name, s.first, s.count, uids=s.uids, gids=s.gids, prefix_root=prefix_root)
    except SubIdsRefused as exc:
        report.problems.extend(exc.problems)
        return
    except (ShadowLockTimeout, OSError) as exc:
        report.problems.append(f"subordinate ids {s.first}-{s.first + s.count - 1} for {s.name} not added: {exc}")
        return
    if added:
        report.done.append(f"gave {s.name} subordinate {' and '.join(added)} {s.first}-{s.first + s.count - 1}")


def _ensure_home_root(path: Path, report: ApplyReport) -> bool:
    if path.is_dir():
        return True
    try:
        path.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(path, 0o755)  # reachable by every tenant; each home below is 0700
        report.done.append(f"created {path} (0755)")
        return True
    except OSError as exc:
        report.problems.append(f"cannot create the home root {path}: {exc.strerror or exc}")
        return False


def _create_home(h: HomeToCreate, report: ApplyReport) -> None:
    path = Path(h.path)
    if not _ensure_home_root(path.parent, report):
        return
    try:
        os.mkdir(path, h.mode)
    except FileExistsError:
        try:
            st = os.lstat(path)
        except OSError as exc:
            report.problems.append(f"home {path}: cannot be examined: {exc.strerror or exc}")
            return
        if not stat.S_ISDIR(st.st_mode):
            report.problems.append(f"home {path} exists but is not a directory (a symlink or file); "
                                   "it was left alone: remove it so the home can be created")
        elif st.st_uid != h.uid:
            report.problems.append(f"home {path} exists but belongs to uid {st.st_uid}, not {h.uid}; "
                                   "it was left alone: move it away or give it to the tenant")
        return  # an existing home of the tenant is the tenant's: its mode is not reset
    except OSError as exc:
        report.problems.append(f"cannot create home {path}: {exc.strerror or exc}")
        return
    try:
        os.chown(path, h.uid, h.gid)
        os.chmod(path, h.mode)  # mkdir's mode went through the umask
        report.done.append(f"created home {path} ({h.mode:04o}, {h.uid}:{h.gid})")
    except OSError as exc:
        report.problems.append(f"home {path}: cannot set owner {h.uid}:{h.gid} and mode {h.mode:04o}: "
                               f"{exc.strerror or exc}")


def _keys_text(k: KeysToWrite) -> bytes:
    return (KEYS_HEADER + "".join(key + "\n" for key in k.keys)).encode()


def _write_keys(k: KeysToWrite, report: ApplyReport) -> None:
    """Write HOME/.ssh/authorized_keys as the tenant's file, without following links the
    tenant could have planted (every step is relative to a directory fd opened O_NOFOLLOW)."""
    where = k.path
    home_fd = ssh_fd = -1
    tmp_name = f".authorized_keys.mtgpu-{os.getpid()}"
    try:
        home_fd = os.open(k.home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        if os.fstat(home_fd).st_uid != k.uid:
            report.problems.append(f"{where}: not written, the home does not belong to uid {k.uid}")
            return
        created = False
        try:
            os.mkdir(".ssh", 0o700, dir_fd=home_fd)
            created = True
        except FileExistsError:
            pass
        ssh_fd = os.open(".ssh", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=home_fd)
        st = os.fstat(ssh_fd)
        if created:
            os.fchown(ssh_fd, k.uid, k.gid)
            os.fchmod(ssh_fd, 0o700)
        elif st.st_uid != k.uid:
            report.problems.append(f"{where}: not written, {k.home}/.ssh belongs to uid {st.st_uid}, not {k.uid}")
            return
        wanted = _keys_text(k)
        with contextlib.suppress(OSError):
            fd = os.open("authorized_keys", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=ssh_fd)
            try:
                current_st = os.fstat(fd)
                current = os.read(fd, len(wanted) + 1)
            finally:
                os.close(fd)
            if current == wanted and current_st.st_uid == k.uid and stat.S_IMODE(current_st.st_mode) == 0o600:
                return  # already up to date
        fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=ssh_fd)
        try:
            os.write(fd, wanted)
            os.fchown(fd, k.uid, k.gid)
            os.fchmod(fd, 0o600)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_name, "authorized_keys", src_dir_fd=ssh_fd, dst_dir_fd=ssh_fd)
        report.done.append(f"wrote {where} ({len(k.keys)} key{'s' if len(k.keys) != 1 else ''})")
    except OSError as exc:
        report.problems.append(f"{where}: cannot be written: {exc.strerror or exc}")
        if ssh_fd >= 0:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name, dir_fd=ssh_fd)
    finally:
        for fd in (ssh_fd, home_fd):
            if fd >= 0:
                os.close(fd)


def _check_home(h: HomeToCheck, report: ApplyReport) -> None:
    try:
        st = os.lstat(h.path)
    except FileNotFoundError:
        report.problems.append(f"shared home {h.path} is missing: the home-owner node creates it; "
                               "check that the shared storage is mounted at the same path here")
        return
    except OSError as exc:
        report.problems.append(f"shared home {h.path}: cannot be examined: {exc.strerror or exc}")
        return
    if not stat.S_ISDIR(st.st_mode):
        report.problems.append(f"shared home {h.path} is not a directory")
    elif st.st_uid != h.uid or st.st_gid != h.gid:
        report.problems.append(f"shared home {h.path} belongs to {st.st_uid}:{st.st_gid}, not {h.uid}:{h.gid}; "
                               "do the nodes mount the same storage, with the same ids (no root squash of ids)?")
    else:
        report.done.append(f"checked shared home {h.path}")


def apply_plan(plan: AccountPlan, *, prefix_root: str | os.PathLike | None = None,
               run: Runner = subprocess.run) -> ApplyReport:
    """Create what the plan says, in order: groups, users, subordinate ids, homes, keys;
    then the checks. A user whose group failed is not attempted, nor is anything of a
    tenant whose user failed. Conflicts and warnings of the plan are carried into the report."""
    report = ApplyReport()
    report.problems.extend(plan.conflicts)
    failed: set[str] = set()
    for g in plan.create_groups:
        if not _create_group(g, prefix_root, run, report):
            failed.add(g.name)
    for u in plan.create_users:
        if u.name in failed:
            report.problems.append(f"user {u.name} not created: its group could not be created")
        elif not _create_user(u, prefix_root, run, report):
            failed.add(u.name)
    for s in plan.add_subids:
        if s.name not in failed:
            _add_subids(s, prefix_root, report)
    homes_done: set[str] = set()
    for h in plan.create_homes:
        if Path(h.path).name in failed:
            continue
        before = len(report.problems)
        _create_home(h, report)
        if len(report.problems) == before:
            homes_done.add(h.path)
    for k in plan.write_keys:
        if k.tenant not in failed and k.home in homes_done:
            _write_keys(k, report)
    for c in plan.check_homes:
        if Path(c.path).name not in failed:
            _check_home(c, report)
    report.done.extend(f"warning: {w}" for w in plan.warnings)
    return report


# ---------------------------------------------------------------- removal (retention)


def remove_account(name: str, *, uid_range: tuple[int, int], prefix_root: str | os.PathLike | None = None,
                   home: str | os.PathLike | None = None, run: Runner = subprocess.run) -> ApplyReport:
    """Remove a tenant's user, group, subordinate ids and (if given) home. Refuses any
    account whose uid is outside TENANT_UID_RANGE: an OS account is never ours to remove.
    Processes still running as the tenant must be stopped first (userdel refuses otherwise)."""
    report = ApplyReport()
    try:
        os_accounts = read_os_accounts(prefix_root)
    except OsAccountsError as exc:
        report.problems.append(str(exc))
        return report
    lo, hi = uid_range
    user = os_accounts.users.get(name)
    if user is not None:
        uid, gid, _ = user
        if not lo <= uid <= hi:
            report.problems.append(f"user {name!r} has uid {uid}, outside TENANT_UID_RANGE [{lo}, {hi}]: "
                                   "not a tenant account, left alone")
            return report
        for table, flag in ((os_accounts.subuids, "--del-subuids"), (os_accounts.subgids, "--del-subgids")):
            for first, count in table.get(name, ()):
                ok, text = run_tool(["usermod", flag, f"{first}-{first + count - 1}",
                                     *_prefix_args(prefix_root), name], run)
                if not ok:
                    report.problems.append(text)
        ok, text = run_tool(["userdel", *_prefix_args(prefix_root), name], run)
        (report.done if ok else report.problems).append(f"removed user {name}" if ok else text)
        if not ok:
            return report
    gid = os_accounts.groups.get(name)
    if gid is not None:
        if lo <= gid <= hi:
            ok, text = run_tool(["groupdel", *_prefix_args(prefix_root), name], run)
            if ok or "does not exist" in text:  # userdel may already have removed the user's group
                report.done.append(f"removed group {name}")
            else:
                report.problems.append(text)
        else:
            report.problems.append(f"group {name!r} has gid {gid}, outside TENANT_UID_RANGE: left alone")
    if home is not None and user is not None:
        try:
            st = os.lstat(home)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            report.problems.append(f"home {home}: cannot be examined: {exc.strerror or exc}")
            st = None
        if st is not None:
            if stat.S_ISDIR(st.st_mode) and st.st_uid == user[0]:
                errors: list[str] = []
                shutil.rmtree(home, onerror=lambda _f, p, e: errors.append(f"{p}: {e[1]}"))
                if errors:
                    report.problems.append(f"home {home} not fully removed: {errors[0]}")
                else:
                    report.done.append(f"removed home {home}")
            else:
                report.problems.append(f"home {home} is not a directory of uid {user[0]}: left alone")
    return report


__all__ = [
    "ApplyReport",
    "SubIdsRefused",
    "add_subordinate_ids",
    "OsAccountsError",
    "apply_plan",
    "read_os_accounts",
    "remove_account",
    "run_tool",
    "KEYS_FILE",
]

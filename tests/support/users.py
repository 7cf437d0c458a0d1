"""Temporary real Linux users for tests that run processes as tenants.

    with temp_user("mtt") as u:          # u.name, u.uid, u.gid, u.home
        subprocess.run(["id"], user=u.uid, group=u.gid)

Needs root and `useradd`/`userdel`. UIDs/GIDs come from a range above the
distribution's (250000-259999 by default, inside TENANT_UID_RANGE's default) so they
never collide with real accounts. The user, its group and its home are removed on
exit even when the test fails; processes still running as the user are killed first
(by PID) so that userdel can succeed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from mtgpu.accounts.apply import SubIdsRefused, add_subordinate_ids, remove_account
from mtgpu.accounts.plan import subordinate_range

UID_RANGE = (250_000, 259_999)


@dataclass(frozen=True)
class TempUser:
    name: str
    uid: int
    gid: int
    home: str


ACCOUNT_FILES = ("passwd", "group", "shadow", "gshadow", "login.defs")


def account_db(root: Path) -> Path:
    """A separate account database (useradd --prefix ROOT), as another machine would have:
    ROOT/etc with copies of the machine's passwd, group, shadow, gshadow and login.defs
    (modes kept; an empty file where the machine has none), so that the shadow tools never
    edit the machine's own. Its subuid and subgid start empty: the machine's hold the ranges
    of other nodes' tenants, which a test must not depend on (issue 23.6). Returns ROOT."""
    etc = Path(root) / "etc"
    etc.mkdir(parents=True)
    for name in ACCOUNT_FILES:
        src = Path("/etc") / name
        if src.exists():
            shutil.copy2(src, etc / name)
        else:
            (etc / name).touch()
    for name in ("subuid", "subgid"):
        (etc / name).write_text("")
    return Path(root)


def can_create_users() -> str | None:
    """None when temp_user works here, else why not (for pytest.skip)."""
    if os.geteuid() != 0:
        return "creating Linux users needs root"
    for tool in ("useradd", "userdel"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def _retry_locked(cmd: list[str], attempts: int = 20) -> subprocess.CompletedProcess:
    """Run useradd/userdel, retrying while another process holds /etc/passwd's lock."""
    for i in range(attempts):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode == 0 or "lock" not in (r.stderr or "").lower() or i == attempts - 1:
            return r
        time.sleep(0.05 * (i + 1))
    return r


def _kill_processes_of(uid: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    if os.stat(f"/proc/{name}").st_uid == uid:
                        pids.append(int(name))
                except OSError:
                    pass
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


@contextlib.contextmanager
def temp_user(prefix: str = "mtt", *, uid_range: tuple[int, int] = UID_RANGE,
              home_parent: str | None = None) -> Iterator[TempUser]:
    """Create a uniquely named user with a private group and home; remove it on exit."""
    why = can_create_users()
    if why:
        raise RuntimeError(why)
    name = f"{prefix}{secrets.token_hex(4)}"[:32]
    own_parent = home_parent is None
    parent = tempfile.mkdtemp(prefix="mtgpu-homes-") if own_parent else home_parent
    os.chmod(parent, 0o755)  # the user must be able to reach its home
    home = os.path.join(parent, name)
    lo, hi = uid_range
    # No automatic subordinate ids: the distribution's (from 100000) would cover tenant uids,
    # which rootless podman refuses; the node's own formula is added below instead.
    cmd = ["useradd", "-m", "-d", home, "-s", "/bin/bash",
           "-K", f"UID_MIN={lo}", "-K", f"UID_MAX={hi}", "-K", f"GID_MIN={lo}", "-K", f"GID_MAX={hi}",
           "-K", "SUB_UID_COUNT=0", "-K", "SUB_GID_COUNT=0", name]
    r = _retry_locked(cmd)
    if r.returncode != 0:
        if own_parent:
            shutil.rmtree(parent, ignore_errors=True)
        raise RuntimeError(f"useradd {name} failed ({r.returncode}): {r.stderr.strip()}")
    try:
        out = subprocess.run(["id", "-u", name], capture_output=True, text=True, check=True).stdout
        uid = int(out)
        gid = int(subprocess.run(["id", "-g", name], capture_output=True, text=True, check=True).stdout)
        sub = subordinate_range(uid, uid_range)  # the node's own range for this uid
        if sub is not None:
            # Added as the node adds them (under /etc/subuid's lock, never over another's range).
            # A range taken by someone else on this machine is left out: only a test that runs
            # containers as this user needs it, and podman's setup then says whose it is.
            with contextlib.suppress(SubIdsRefused):
                add_subordinate_ids(name, *sub)
        yield TempUser(name, uid, gid, home)
    finally:
        with contextlib.suppress(Exception):
            _kill_processes_of(int(subprocess.run(["id", "-u", name], capture_output=True, text=True).stdout))
        r = _retry_locked(["userdel", "-r", name])
        if r.returncode not in (0, 12):  # 12: home could not be removed (removed below)
            _retry_locked(["userdel", "-f", "-r", name])
        if own_parent:
            shutil.rmtree(parent, ignore_errors=True)
        else:
            shutil.rmtree(home, ignore_errors=True)


# Every uid range a test gives to accounts it creates (temp users, the tenants tests'
# nodes, the cluster tests' nodes, the workspace SSH, authorization and fuzz nodes). Nothing else on a machine has uids here.
TEST_UID_RANGES = ((250_000, 259_999), (310_000, 429_999))


def sweep_leftover_accounts(passwd: str = "/etc/passwd") -> list[str]:
    """Remove accounts an earlier test run left behind when it was killed (SIGKILL skips
    every teardown): a uid in TEST_UID_RANGES whose home's parent folder is gone. A test
    that is still running keeps that folder (its node's base or its homes folder) until
    its teardown, so only the dead run's accounts match. Returns the names removed."""
    removed = []
    try:
        lines = open(passwd, encoding="utf-8").read().splitlines()
    except OSError:
        return removed
    for line in lines:
        parts = line.split(":")
        if len(parts) < 7 or not parts[2].isdigit():
            continue
        name, uid, home = parts[0], int(parts[2]), parts[5]
        if not any(lo <= uid <= hi for lo, hi in TEST_UID_RANGES):
            continue
        if not home.startswith("/") or os.path.isdir(os.path.dirname(home.rstrip("/"))):
            continue
        _kill_processes_of(uid)
        r = _retry_locked(["userdel", "-f", name])
        if r.returncode == 0:
            removed.append(name)
    return removed


def remove_tenant_accounts(names: Iterable[str | None], uid_range: tuple[int, int]) -> list[str]:
    """Remove the tenant accounts a test's node made (user, group, subordinate ids, home),
    after killing their processes by PID (e.g. the tmux server an SSH login left running,
    or userdel refuses). Names that are None or have no account are skipped; uids outside
    uid_range are left alone (remove_account refuses them). Returns the problems
    remove_account reported, for a caller that wants none."""
    import pwd

    from mtgpu.server.member.accounts_agent import kill_processes_of

    problems: list[str] = []
    for name in names:
        if not name:
            continue
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            continue
        kill_processes_of(pw.pw_uid)
        problems += remove_account(name, uid_range=uid_range, home=pw.pw_dir).problems
    return problems


def stop_node_and_remove_tenants(node, names: Iterable[str | None], uid_range: tuple[int, int]) -> list[str]:
    """At a test's end: cancel what the node runs, stop it, then remove the tenant accounts
    it made (their processes are gone by then). Returns remove_tenant_accounts' problems."""
    if node.proc is not None and node.proc.poll() is None:
        node.cancel_everything()
    node.terminate()
    return remove_tenant_accounts(names, uid_range)

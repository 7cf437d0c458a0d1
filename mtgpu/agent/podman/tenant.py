"""Each tenant's rootless Podman, prepared once by the node (as root) so that the tenant
never configures anything.

What a tenant's podman runs with (the environment `env()` returns; container jobs and
`mt-podman` both use it):

- `CONTAINERS_CONF`: the node's containers.conf (runc, cgroupfs, file events, ulimits: the
  settings checked on this kind of machine; TESTING.md "Podman").
- `CONTAINERS_STORAGE_CONF`: a storage.conf per tenant, written *before* its first podman
  call (else podman sticks to the slow vfs driver): the overlay driver, the graph root under
  STATE_DIR (node-local even when homes are on shared storage, where overlay cannot live and
  two nodes would share one store), the run root under the runtime directory.
- `XDG_RUNTIME_DIR`: a runtime directory the node makes (there is no logind to make
  /run/user/UID), per STATE_DIR, so two members on one machine never share one.

Subordinate ids come with the account (accounts/plan.py). The rootless pause process (it
holds the tenant's user namespace) is started by `ensure_pause()` from the server, never
from inside a job: a job's cgroup is killed when it ends, and the pause process with it
would take the namespace other jobs' storage mounts live in.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil

from ...accounts.apply import OsAccountsError, read_os_accounts
from ...accounts.plan import subid_overlap
from .. import state_key

PODMAN = shutil.which("podman") or "/usr/bin/podman"
RUNTIME_BASE = Path("/run/mtgpu-podman")

# No default_ulimits: a rootless container may not raise a limit above the tenant's hard
# limit, so it keeps the limits the job's process has (as a native job does).
CONTAINERS_CONF = """\
# Written by mtgpu for every tenant's rootless podman on this node; rewritten at start.
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


class PodmanSetupError(RuntimeError):
    """The node could not prepare a tenant's Podman; the message says what and why."""


def podman_available() -> str | None:
    """None when podman can run here, else why not."""
    if not os.access(PODMAN, os.X_OK):
        return f"podman is not installed ({PODMAN} missing): apt install podman uidmap slirp4netns"
    return None


@dataclass(frozen=True)
class TenantPodman:
    """One tenant's podman settings on this node."""

    uid: int
    gid: int
    home: str
    conf: Path
    storage_conf: Path
    graph_root: Path
    runtime_dir: Path

    def env(self) -> dict[str, str]:
        return {
            "HOME": self.home,
            "XDG_RUNTIME_DIR": str(self.runtime_dir),
            "CONTAINERS_CONF": str(self.conf),
            "CONTAINERS_STORAGE_CONF": str(self.storage_conf),
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "LANG": "C.UTF-8",
        }

    def run(self, args: list[str], *, timeout_s: float = 120.0, stdin=None,
            input: bytes | None = None) -> subprocess.CompletedProcess:
        """podman ARGS as the tenant (from root), output captured."""
        return subprocess.run([PODMAN, *args], env=self.env(), user=self.uid, group=self.gid, extra_groups=[],
                              cwd="/", capture_output=True, timeout=timeout_s, stdin=stdin, input=input)


class PodmanHost:
    """The node's side: where tenants' podman settings live, and making them."""

    def __init__(self, state_dir: Path, runtime_base: Path = RUNTIME_BASE):
        self.root = Path(state_dir) / "podman"
        self.key = state_key(state_dir)
        self.runtime_root = Path(runtime_base) / self.key
        self._ready: set[int] = set()

    def setup(self) -> None:
        """Once at start: the shared folders and containers.conf (root-owned, readable)."""
        for d in (self.root, self.root / "users", self.root / "jobs", self.runtime_root.parent, self.runtime_root):
            d.mkdir(parents=True, exist_ok=True)
            os.chown(d, 0, 0)
            os.chmod(d, 0o711)
        _write_if_changed(self.root / "containers.conf", CONTAINERS_CONF, 0o644)

    def tenant(self, uid: int, gid: int, home: str) -> TenantPodman:
        base = self.root / "users" / str(uid)
        return TenantPodman(uid, gid, home, self.root / "containers.conf", base / "storage.conf",
                            base / "storage", self.runtime_root / str(uid))

    def prepare(self, uid: int, gid: int, home: str) -> TenantPodman:
        """Make the tenant's folders and storage.conf (idempotent, cheap after the first)."""
        t = self.tenant(uid, gid, home)
        if uid in self._ready and t.runtime_dir.is_dir() and t.storage_conf.exists():
            return t
        if uid < 1000:
            raise PodmanSetupError(f"uid {uid} is a system account: containers run only as tenants")
        why = subid_problem(uid)
        if why:
            raise PodmanSetupError(why)
        base = t.storage_conf.parent
        base.mkdir(exist_ok=True)
        os.chown(base, 0, 0)
        os.chmod(base, 0o711)
        for d in (t.graph_root, t.runtime_dir):
            d.mkdir(exist_ok=True)
            st = d.lstat()
            if st.st_uid != uid or not d.is_dir() or d.is_symlink():
                os.chown(d, uid, gid, follow_symlinks=False)
            os.chmod(d, 0o700)
        # Rootless podman takes its store from rootless_storage_path (graphroot alone is ignored
        # for a non-root user, and the store would land in the home).
        storage = (f'# Written by mtgpu for uid {uid}; rewritten when needed.\n[storage]\ndriver = "overlay"\n'
                   f'graphroot = "{t.graph_root}"\nrootless_storage_path = "{t.graph_root}"\n'
                   f'runroot = "{t.runtime_dir / "containers"}"\n')
        _write_if_changed(t.storage_conf, storage, 0o644)
        self._ready.add(uid)
        return t

    def ready(self, uid: int, gid: int, home: str) -> TenantPodman:
        """The tenant's podman, prepared and with its pause process running: what every
        caller (a job's start, mt-podman, an image load) needs before a podman call."""
        t = self.prepare(uid, gid, home)
        self.ensure_pause(t)
        return t

    def ensure_pause(self, t: TenantPodman) -> None:
        """Start the tenant's rootless pause process from here (outside every job cgroup)
        when it is not running."""
        if pause_running(t):
            return
        r = t.run(["unshare", "true"], timeout_s=60)
        if r.returncode != 0:
            raise PodmanSetupError(f"podman could not start for uid {t.uid}: {last_error(r)}")


def pause_running(t: TenantPodman) -> bool:
    """The pid in the tenant's pause.pid is a live process of the tenant's (its real uid):
    a stale file, or a pid since taken by another user's process, is not."""
    try:
        pid = int((t.runtime_dir / "libpod" / "tmp" / "pause.pid").read_text().strip())
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE and p.uids().real == t.uid
    except (OSError, ValueError, psutil.Error):
        return False


def subid_problem(uid: int, root: str = "/") -> str | None:
    """Why rootless podman cannot run for `uid` with its subordinate ids, or None."""
    try:
        account = pwd.getpwuid(uid)
    except KeyError:
        return f"uid {uid} has no account on this node"
    name = account.pw_name
    try:
        accounts = read_os_accounts(root)
    except OsAccountsError as e:
        return f"the account database cannot be read: {e}"
    for kind, table, own in (("uid", accounts.subuids, uid), ("gid", accounts.subgids, account.pw_gid)):
        ranges = table.get(name, ()) + table.get(str(uid), ())  # the files may name the user or its uid
        if not ranges:
            return (f"{name} has no subordinate {kind}s in /etc/sub{kind}, which rootless podman needs; the node "
                    f"adds them to the accounts it creates (accounts/plan.py), or: usermod --add-sub{kind}s FIRST-LAST {name}")
        for first, count in ranges:
            if first <= own < first + count:
                return (f"{name}'s subordinate {kind}s {first}-{first + count - 1} in /etc/sub{kind} include its own "
                        f"{kind} {own}, which rootless podman refuses; give it a range above TENANT_UID_RANGE")
            other = subid_overlap(name, first, count, {k: v for k, v in table.items() if k != str(uid)})
            if other is not None:
                o_name, o_first, o_count = other
                return (f"{name}'s subordinate {kind}s {first}-{first + count - 1} in /etc/sub{kind} overlap "
                        f"{o_name!r}'s {o_first}-{o_first + o_count - 1}: its containers' files would be "
                        f"{o_name!r}'s too, so they do not run; remove one of the two ranges "
                        f"(usermod --del-sub{kind}s FIRST-LAST NAME) and restart mtgpu-server")
    return None


def _write_if_changed(path: Path, text: str, mode: int) -> None:
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def error_line(text: str) -> str | None:
    """Podman's own message in its output: the last line that starts with `Error:`."""
    for ln in reversed(text.splitlines()):
        if ln.strip().startswith("Error:"):
            return ln.strip()
    return None


def last_error(r: subprocess.CompletedProcess) -> str:
    """Podman's own message: its last `Error:` line, else the end of its output."""
    text = (r.stderr or b"").decode(errors="replace") if isinstance(r.stderr, bytes) else (r.stderr or "")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return error_line(text) or (lines[-1] if lines else f"exit status {r.returncode}")

"""The agent's accounts duty: make this machine's accounts match the tenants in the
replicated state, and run the tenant sshd once there is a tenant to serve.

On every change of the tenants (and at start) the agent plans (accounts.plan) and
applies (accounts.apply) the users, groups, homes and keys; the uid/gid come from
the state, so every node creates the same numbers. Existing OS accounts are never
changed: a clash is reported, not fixed. Accounts this node created for a tenant
that was removed are removed with their home (and their processes stopped). Tenant
logins seen in the sshd log are recorded as activity for TENANT_RETENTION_DAYS.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import time
from pathlib import Path
from typing import Callable

from ...accounts.apply import apply_plan, read_os_accounts, remove_account, run_tool
from ...accounts.plan import TenantSpec, plan_accounts, tenant_home
from ...agent import procs
from ...config import Config
from ...ssh.daemon import SshdError, TenantSshd, check_installed
from ...state import commands as C
from ...state.store import ReplicationError, Store, commit

log = logging.getLogger(__name__)

TENANT_GROUP = "mtgpu-tenants"
LOGIN_RE = re.compile(r"Accepted publickey for (\S+) from")
LOGIN_RECORD_EVERY_S = 600.0
SSHD_PLACE_CHECK_EVERY_S = 10.0  # the running tenant sshd is looked for in its sessions group this often


class AccountsAgent:
    def __init__(self, store: Store, config: Config, node_name: str, clock, cluster_id: str,
                 place_sshd: Callable[..., object] | None = None) -> None:
        self.store = store
        # place_sshd(pid): moves the tenant sshd as it starts (out of the member's services
        # cgroup); place_sshd(pid, True): checks that it is still there, moves it back if not
        self.place_sshd = place_sshd
        self._place_checked = 0.0
        self.config = config
        self.node_name = node_name
        self.clock = clock
        self.cluster_id = cluster_id
        self.state_dir = Path(config.STATE_DIR)
        self.prefix = None if str(config.ACCOUNTS_ROOT) == "/" else str(config.ACCOUNTS_ROOT)
        self._created_path = self.state_dir / "agent" / "accounts.json"
        self._last_seen_tenants: tuple | None = None
        self._sshd: TenantSshd | None = None
        self.sshd_problem = ""
        self.problems: list[str] = []
        self._log_offset = 0
        self._logins: dict[str, float] = {}

    # ------------------------------------------------------------ one pass
    def run_once(self) -> None:
        machine = self.store.machine
        with self.store.lock:
            managed = sorted((t.name, t.uid, t.gid, tuple(t.keys), tuple(t.clusters))
                             for t in machine.tenants.values() if t.managed)
        if tuple(managed) != self._last_seen_tenants:
            self._reconcile(managed)
            self._last_seen_tenants = tuple(managed)
        if self._sshd is not None:
            self._record_logins()
            self._check_sshd_place()

    def _check_sshd_place(self) -> None:
        """A CI run once found the tenant sshd in the member's services group (how it got there
        was not seen): tenants' sessions, born where it is, would get the member's CPU weight.
        Look every SSHD_PLACE_CHECK_EVERY_S and move it back (place_sshd logs what it found)."""
        now = time.monotonic()
        if self.place_sshd is None or now - self._place_checked < SSHD_PLACE_CHECK_EVERY_S:
            return
        self._place_checked = now
        pid = self._sshd.pid()
        if pid is not None:
            self.place_sshd(pid, True)

    def _reconcile(self, managed: list[tuple]) -> None:
        layout = self.config.HOME_LAYOUT
        owner = layout == "per-node" or self.store.machine.scheduler in ("", self.node_name)
        home_root = str(self.config.TENANT_HOME_ROOT)
        specs = [TenantSpec(name=n, uid=u, gid=g, keys=keys if self.cluster_id in clusters else ())
                 for n, u, g, keys, clusters in managed]
        try:
            os_accounts = read_os_accounts(self.prefix)
        except Exception as e:  # an unreadable account database: report, try again next change
            self.problems = [f"cannot read the account database: {e}"]
            log.error("%s", self.problems[0])
            return
        plan = plan_accounts(specs, os_accounts, home_root, layout, owner, uid_range=tuple(self.config.TENANT_UID_RANGE))
        report = apply_plan(plan, prefix_root=self.prefix)
        for line in report.done:
            log.info("accounts: %s", line)
        for line in report.problems:
            log.warning("accounts: %s", line)
        self.problems = list(report.problems)
        refused = set(plan.refused_tenants)
        created = self._created()
        for n, u, g, _keys, _clusters in managed:
            if n not in refused:
                created[n] = {"uid": u, "home": tenant_home(home_root, n)}
        self._join_tenant_group([n for n, *_ in managed if n not in refused])
        # Accounts we created for tenants that are gone.
        names = {n for n, *_ in managed}
        for gone in [n for n in created if n not in names]:
            self._remove(gone, created[gone])
            del created[gone]
        self._save_created(created)
        if managed:
            self._ensure_sshd()
            if self._sshd is not None:
                for n, _u, _g, keys, clusters in managed:
                    if n not in refused:
                        self._sshd.set_authorized_keys(n, list(keys) if self.cluster_id in clusters else [])

    def _join_tenant_group(self, names: list[str]) -> None:
        prefix = ["--prefix", self.prefix] if self.prefix else []
        ok, text = run_tool(["groupadd", "-f", "-r", *prefix, TENANT_GROUP])
        if not ok:
            self.problems.append(text)
            return
        members = set()
        try:
            for line in Path(self.prefix or "/", "etc/group").read_text().splitlines():
                parts = line.split(":")
                if parts[0] == TENANT_GROUP and len(parts) > 3:
                    members = set(filter(None, parts[3].split(",")))
        except OSError:
            pass
        for name in names:
            if name not in members:
                ok, text = run_tool(["usermod", "-a", "-G", TENANT_GROUP, *prefix, name])
                if not ok:
                    self.problems.append(text)

    def _remove(self, name: str, rec: dict) -> None:
        uid = rec.get("uid")
        if isinstance(uid, int) and self.prefix is None:
            kill_processes_of(uid)
        report = remove_account(name, uid_range=tuple(self.config.TENANT_UID_RANGE), prefix_root=self.prefix,
                                home=rec.get("home") if self.config.HOME_LAYOUT == "per-node" else None)
        for line in report.done:
            log.info("accounts: %s", line)
        for line in report.problems:
            log.warning("accounts: %s", line)
        if self._sshd is not None:
            try:
                (self._sshd.keys_dir / name).unlink()
            except FileNotFoundError:
                pass

    def _created(self) -> dict:
        try:
            return json.loads(self._created_path.read_text())
        except (OSError, ValueError):
            return {}

    def _save_created(self, created: dict) -> None:
        self._created_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self._created_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(created))
        os.replace(tmp, self._created_path)

    # ------------------------------------------------------------ sshd
    def _ensure_sshd(self) -> None:
        if self._sshd is not None and self._sshd.pid() is not None:
            return
        why = check_installed(self.config.PERSISTENT_TERMINALS)
        if why:
            self.sshd_problem = why
            return
        try:
            sshd = self._sshd or TenantSshd(self.state_dir, self.config.SSH_LISTEN, TENANT_GROUP,
                                            self.config.PERSISTENT_TERMINALS)
            sshd.prepare()
            if sshd.pid() is not None:  # left running by an earlier server process
                sshd.stop()
            sshd.start(place=self.place_sshd)
        except (SshdError, OSError, ValueError) as e:
            self.sshd_problem = f"the tenant sshd on {self.config.SSH_LISTEN} is not running: {e}"
            log.warning("%s", self.sshd_problem)
            return
        self._sshd = sshd
        self.sshd_problem = ""
        log.info("tenant sshd listening on %s", self.config.SSH_LISTEN)

    def _record_logins(self) -> None:
        path = self._sshd.log_path
        try:
            with open(path, "rb") as f:
                f.seek(self._log_offset)
                data = f.read()
        except OSError:
            return
        self._log_offset += len(data)
        now = self.clock()
        for name in LOGIN_RE.findall(data.decode(errors="replace")):
            if now - self._logins.get(name, 0.0) < LOGIN_RECORD_EVERY_S or name not in self.store.machine.tenants:
                continue
            self._logins[name] = now
            try:
                commit(self.store, C.TENANT_SEEN, name=name, at=now, login=True)
            except ReplicationError as e:  # activity is best effort
                log.debug("could not record a login of %s: %s", name, e)

    def stop(self) -> None:
        if self._sshd is not None:
            try:
                self._sshd.stop()
            except SshdError as e:
                log.warning("stopping the tenant sshd: %s", e)


def kill_processes_of(uid: int, timeout_s: float = 5.0) -> None:
    """Stop every process of a removed tenant, by PID, so its account can go."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = procs.pids_of_uid(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)

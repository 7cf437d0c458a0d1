"""`mtgpu-setup uninstall [--purge]`: stop the service and the node's tenant sshd, remove
autostart, the service definition, the command links and (when the install made it) the
environment. It keeps the config, STATE_DIR (journal, cluster secret, job records) and
the tenants' homes; `--purge` removes those too, and the tenants' accounts."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil

from ..accounts.apply import OsAccountsError, read_os_accounts, remove_account
from ..config import Config, ConfigError, load_config
from ..server.member.accounts_agent import TENANT_GROUP
from ..ssh.daemon import TenantSshd
from .environment import CommandLinks
from .install import check_root
from .layout import Layout
from .manifest import read_manifest
from .node import running_here
from .plan import Check, SetupRefused, Step, StepFailed
from .service import Platform, Runner, ServiceChoice, choose_service, make_service
from .wsl_drives import WindowsDrives, wsl_conf_has_our_masks


@dataclass
class UninstallOptions:
    root: Path = Path("/")
    config: Path | None = None
    venv: Path | None = None
    service: str = "auto"
    purge: bool = False
    force: bool = False


def tenant_accounts(config: Config) -> dict[str, tuple[int, int, str]]:
    """The accounts this node made for tenants: uid in TENANT_UID_RANGE and home under
    TENANT_HOME_ROOT, in ACCOUNTS_ROOT's account database."""
    lo, hi = config.TENANT_UID_RANGE
    home_root = Path(config.TENANT_HOME_ROOT)
    prefix = None if Path(config.ACCOUNTS_ROOT) == Path("/") else config.ACCOUNTS_ROOT
    try:
        users = read_os_accounts(prefix).users
    except OsAccountsError:
        return {}
    return {name: u for name, u in users.items() if lo <= u[0] <= hi and Path(u[2]).is_relative_to(home_root)}


def processes_of(uids: set[int]) -> list[int]:
    pids = []
    for p in psutil.process_iter(["uids"]):
        try:
            if p.info["uids"] and p.info["uids"].real in uids:
                pids.append(p.pid)
        except (psutil.Error, AttributeError):
            continue
    return sorted(pids)


def _rmtree(path: Path) -> str:
    shutil.rmtree(path)
    return f"removed {path}"


class Uninstaller:
    def __init__(self, options: UninstallOptions, platform: Platform | None = None,
                 run: Runner = subprocess.run) -> None:
        self.options = options
        self.platform = platform or Platform.probe()
        self.run = run
        self.kept: list[str] = []
        self.notes: list[str] = []

    def preflight(self) -> None:
        o = self.options
        if os.geteuid() != 0:
            raise SetupRefused("mtgpu-setup uninstall stops a service and removes system files: run it as root")
        root = check_root(o.root)
        self.manifest = read_manifest(Layout.make(root).manifest)
        m = self.manifest
        self.layout = Layout.make(root, o.config or (m.config if m else None), o.venv or (m.venv if m else None))
        if m is not None:
            self.choice = ServiceChoice(m.service, m.boot_hook, f"as installed ({m.service}, {m.boot_hook})")
        else:
            self.choice = choose_service(self.platform, o.service, self.layout.prefixed)
        self.service = make_service(self.choice, self.layout, self.run)
        try:
            self.config: Config | None = load_config(self.layout.config)
        except ConfigError as e:
            self.config = None
            if o.purge:
                raise SetupRefused(f"--purge needs the config to know STATE_DIR and the tenants' homes, and it cannot "
                                   f"be read:\n{e}\nfix it (or remove those folders by hand) and run again") from None
        if self.config is not None:
            busy = running_here(self.config.socket_path)
            if busy and (o.purge or not o.force):
                ids = ", ".join(str(j["id"]) for j in busy)
                fix = "cancel them (mt-job cancel / mtgpu-admin), or wait for them to end"
                if not o.purge:
                    fix += ", or pass --force to leave them running without their node"
                raise SetupRefused(f"{len(busy)} job(s) or workspace(s) run on this node ({ids}): {fix}; "
                                   "nothing was changed")
            if o.purge:
                accounts = tenant_accounts(self.config)
                pids = processes_of({u[0] for u in accounts.values()})
                if pids:
                    raise SetupRefused(f"--purge removes the tenants' accounts, and processes of theirs still run "
                                       f"(pids {', '.join(map(str, pids[:20]))}): stop them first (kill PID), then run "
                                       "again; nothing was changed")

    def summary(self) -> list[str]:
        return [f"service: {self.choice.why}"]

    def steps(self) -> list[Step]:
        L, s, o = self.layout, self.service, self.options
        steps = [Step("stop the service", lambda: Check(s.running_pid() is None, "not running"), s.stop)]
        if self.config is not None:
            sshd = TenantSshd(Path(self.config.STATE_DIR), self.config.SSH_LISTEN, TENANT_GROUP,
                              self.config.PERSISTENT_TERMINALS)
            steps.append(Step("stop the node's tenant sshd", lambda: Check(sshd.pid() is None, "not running"),
                              lambda: (sshd.stop(), "stopped")[1]))
        steps += [
            Step(f"autostart ({self.choice.boot_hook}) off",
                 lambda: Check(not s.autostart_enabled(), "off"),
                 s.disable_autostart),
            Step(f"remove {s.definition}", lambda: Check(not s.definition.exists(), "gone"),
                 lambda: (s.remove_definition(), "removed")[1]),
        ]
        links = CommandLinks(L.bin_dir, L.venv, lambda: ())
        if self.manifest is not None and self.manifest.venv_created:
            steps.append(Step(f"remove the command links in {L.bin_dir}", lambda: Check(not links.ours(), "none"),
                              lambda: self._unlink_all(links.ours())))
            steps.append(Step(f"remove the environment {L.venv}", lambda: Check(not L.venv.exists(), "gone"),
                              lambda: _rmtree(L.venv)))
        elif L.venv.exists():
            # its commands' links stay with it: they still work, and scripts/install.sh may have made them
            self.kept.append(f"the environment {L.venv} (not made by mtgpu-setup install) and its command links "
                             f"in {L.bin_dir}")
        steps.append(Step(f"remove {L.manifest}", lambda: Check(not L.manifest.exists(), "gone"),
                          lambda: (L.manifest.unlink(), "removed")[1]))
        if self.config is None:
            if L.config.exists():
                self.kept.append(f"the config {L.config} (it cannot be read, so STATE_DIR is not known)")
            return steps
        c = self.config
        state_dir, homes = Path(c.STATE_DIR), Path(c.TENANT_HOME_ROOT)
        drives = WindowsDrives(L.wsl_conf, live=False)
        ours = wsl_conf_has_our_masks(drives.conf_text())
        if not o.purge:
            self.kept += [f"the config {L.config}", f"STATE_DIR {state_dir} (journal, cluster secret, job records)",
                          f"the tenants' homes in {homes} and their accounts"]
            if ours:  # the tenants' accounts stay: the Windows drives stay hidden from them
                self.kept.append(f"the owner-only masks of the Windows drives in {L.wsl_conf} (the tenants' "
                                 "accounts stay; --purge takes both out)")
            return steps
        steps.append(Step("remove the tenants' accounts", lambda: Check(not tenant_accounts(c), "none"),
                          self._remove_accounts))
        if c.HOME_LAYOUT == "shared":
            self.kept.append(f"the tenants' homes in {homes}: HOME_LAYOUT = \"shared\", other nodes use them")
        else:
            steps.append(Step(f"remove the tenants' homes {homes}", lambda: Check(not homes.exists(), "gone"),
                              lambda: _rmtree(homes)))
        steps.append(Step(f"remove STATE_DIR {state_dir}", lambda: Check(not state_dir.exists(), "gone"),
                          lambda: _rmtree(state_dir)))
        secret = Path(c.secret_file_path)
        if not secret.is_relative_to(state_dir):
            steps.append(Step(f"remove the cluster secret {secret}", lambda: Check(not secret.exists(), "gone"),
                              lambda: (secret.unlink(), "removed")[1]))
        if ours or self.platform.wsl:  # no tenants left: the drives go back to what the admin had
            steps += drives.unhide_steps("--purge")
        steps += [
            Step(f"remove the log folder {L.log_dir}", lambda: Check(not L.log_dir.exists(), "gone"),
                 lambda: _rmtree(L.log_dir)),
            Step(f"remove the config {L.config}", lambda: Check(not L.config.exists(), "gone"), self._remove_config),
        ]
        return steps

    def _unlink_all(self, links: list[Path]) -> str:
        for p in links:
            p.unlink()
        return f"removed {', '.join(p.name for p in links)}"

    def _remove_accounts(self) -> str:
        c = self.config
        assert c is not None
        prefix = None if Path(c.ACCOUNTS_ROOT) == Path("/") else c.ACCOUNTS_ROOT
        names = sorted(tenant_accounts(c))
        problems = []
        for name in names:
            report = remove_account(name, uid_range=tuple(c.TENANT_UID_RANGE), prefix_root=prefix, run=self.run)
            problems += report.problems
        if problems:
            raise StepFailed("; ".join(problems))
        return f"removed {', '.join(names)}"

    def _remove_config(self) -> str:
        L = self.layout
        L.config.unlink()
        for d in {L.config.parent, L.etc_dir}:
            try:
                d.rmdir()  # only when empty: the admin's own files stay
            except OSError:
                pass
        return "removed"

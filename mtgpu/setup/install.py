"""`mtgpu-setup install`: everything found or checked first (nothing changes when
something is refused), then the steps: packages, the environment, the command links,
the config, STATE_DIR, the cluster secret, the service, autostart, start, and a wait
until the node answers. Each step checks whether it is already done, so a re-run finds
everything in place, changes nothing and says so."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .configfile import FLAG_KEYS, ConfigPlan, parse_set, plan_config, settings_from_flags
from .environment import CommandLinks, Environment, install_packages, missing_packages, package_list, \
    package_version, source_folder
from .layout import Layout
from .manifest import Manifest, ManifestStep, read_manifest
from .node import role_of, try_health, wait_until_answers
from .plan import Check, SetupRefused, Step
from .secret import SecretPlan, plan_secret
from .service import Platform, Runner, Service, ServiceChoice, check_service_path, choose_service, make_service
from .wsl_drives import WindowsDrives, check_choice

DEFAULT_WAIT_S = 90.0


@dataclass
class InstallOptions:
    """The install's flags. `flags` holds the config flags by name (FLAG_KEYS), None when not given."""

    root: Path = Path("/")
    config: Path | None = None
    venv: Path | None = None
    source: Path | None = None
    service: str = "auto"
    packages: bool = True
    flags: dict[str, Any] = field(default_factory=dict)
    sets: list[str] = field(default_factory=list)
    first: bool = False
    secret_file: Path | None = None
    wait_timeout_s: float | None = None
    windows_drives: str | None = None  # "hidden" (None: the default) or "open"; WSL2 hosts only


def check_root(root: Path) -> Path:
    if not root.is_absolute():
        raise SetupRefused(f"--root {str(root)!r}: give an absolute path, e.g. --root /srv/image")
    if not root.is_dir():
        raise SetupRefused(f"--root {str(root)!r} is not a folder: create it first, or leave --root out to "
                           "install on this machine")
    return root.resolve()


def _absolute(flag: str, path: Path | None) -> Path | None:
    if path is not None and not path.is_absolute():
        raise SetupRefused(f"{flag} {str(path)!r}: give an absolute path")
    return path


def _defaults_under_root(layout: Layout, settings: dict[str, Any]) -> None:
    """Under --root, STATE_DIR and TENANT_HOME_ROOT default to the root's own folders."""
    if layout.prefixed:
        settings.setdefault("STATE_DIR", str(layout.default_state_dir))
        settings.setdefault("TENANT_HOME_ROOT", str(layout.default_home_root))


class Installer:
    """The install of one machine (or one --root folder): `preflight()`, then `steps()`."""

    def __init__(self, options: InstallOptions, platform: Platform | None = None, run: Runner = subprocess.run) -> None:
        self.options = options
        self.platform = platform or Platform.probe()
        self.run = run
        self.restart_needed = False
        self.notes: list[str] = []  # lines for the admin (stderr), e.g. flags an existing config overrides
        self.kept: list[str] = []

    # ------------------------------------------------------------ everything checked before a change
    def preflight(self) -> None:
        o = self.options
        if os.geteuid() != 0:
            raise SetupRefused("mtgpu-setup install sets up a service that runs jobs as other users: run it as root")
        root = check_root(o.root)
        self.drives_choice = check_choice(o.windows_drives)
        self.layout = Layout.make(root, _absolute("--config", o.config), _absolute("--venv", o.venv))
        self.drives = WindowsDrives(self.layout.wsl_conf, live=not self.layout.prefixed) if self.platform.wsl else None
        for what, path in (("--root", root), ("--config", self.layout.config), ("--venv", self.layout.venv)):
            check_service_path(what, path)
        self.choice: ServiceChoice = choose_service(self.platform, o.service, self.layout.prefixed)
        self.service: Service = make_service(self.choice, self.layout, self.run)
        source = source_folder(_absolute("--source", o.source))
        if o.source is not None and source is None:
            raise SetupRefused(f"--source {str(o.source)!r} holds no pyproject.toml of mtgpu: give the folder of an "
                               "mtgpu checkout")
        self.environment = Environment(self.layout.venv, package_version(source), source, self.run)
        self.environment.preflight()
        self.links = CommandLinks(self.layout.bin_dir, self.layout.venv, self._scripts)
        self.packages = package_list(("node",)) if o.packages else []
        sets = [parse_set(s) for s in o.sets]
        settings = settings_from_flags(o.flags, sets)
        given = {k for k in settings if not isinstance(settings[k], dict)} | {f"{t}.{k}" for t, v in settings.items()
                                                                               if isinstance(v, dict) for k in v}
        _defaults_under_root(self.layout, settings)
        self.config_plan: ConfigPlan = plan_config(self.layout.config, settings, given)
        self.notes += self.config_plan.notes
        self.config = self.config_plan.config
        self.state_dir = Path(self.config.STATE_DIR)
        self.secret: SecretPlan | None = plan_secret(self.config, o.first, _absolute("--secret-file", o.secret_file))
        previous = read_manifest(self.layout.manifest)
        created = (previous is not None and previous.venv_created and previous.venv == str(self.layout.venv)) \
            or not (self.layout.venv / "bin" / "python").exists()
        self.manifest = Manifest(1, str(self.layout.config), str(self.layout.venv), created, self.choice.kind,
                                 self.choice.boot_hook, str(self.service.definition))
        if o.wait_timeout_s is not None and o.wait_timeout_s <= 0:
            raise SetupRefused(f"--wait-timeout {o.wait_timeout_s:g}: give a number of seconds above 0, e.g. 90")
        self.wait_s = o.wait_timeout_s or (DEFAULT_WAIT_S + self.config.JOIN_TIMEOUT_S if self.config.PEERS
                                            else DEFAULT_WAIT_S)

    def _scripts(self) -> tuple[str, ...]:
        info = self.environment.info()
        return info.scripts if info is not None else ()

    def summary(self) -> list[str]:
        lines = [f"service: {self.choice.why}"]
        if not getattr(self.service, "startable", True):
            lines.append(f"note: the node is not started here: {self.service.definition} is written and enabled for "
                         "the system under --root, whose systemd starts it at boot")
        if self.choice.caveat:
            lines.append(f"note: {self.choice.caveat}")
        if not self.options.packages:
            lines.append("distribution packages: not checked (--no-packages)")
        return lines + self._drives_summary()

    def _drives_summary(self) -> list[str]:
        """What happens to the Windows drives (docs/INSTALL.md, WSL2 hosts)."""
        if self.drives is None:
            if self.options.windows_drives is None:
                return []
            return [f"Windows drives: --windows-drives {self.drives_choice} has nothing to do: this is not a WSL2 "
                    "host (its kernel release names no Microsoft kernel), so there are no Windows drives here"]
        where = self.drives.wsl_conf
        if self.drives_choice == "open":
            opened = [d.name for d in self.drives.drives() if d.open] if self.drives.live else []
            return ["Windows drives: left as WSL mounts them (--windows-drives open)"
                    + (f"; open to every tenant now: {', '.join(opened)}" if opened else "")]
        line = (f"Windows drives: hidden from tenants (--windows-drives hidden, the default): owner-only masks in "
                f"{where} [automount] options")
        if self.drives.live:
            return [line + ", and the open drives mounted now are mounted again owner-only; the WSL account that "
                    "owns them keeps full access"]
        return [line + "; under --root the drives mounted on this machine are left as they are"]

    # ------------------------------------------------------------ the steps
    def steps(self) -> list[Step]:
        L, s = self.layout, self.service
        steps = []
        if self.packages:
            steps.append(Step(f"distribution packages ({len(self.packages)})", self._packages_check,
                              lambda: install_packages(missing_packages(self.packages, self.run), self.run)))
        m = ManifestStep(L.manifest, self.manifest)
        steps += [
            Step(f"record the install in {L.manifest}", m.check, m.apply),
            Step(f"environment {L.venv} with mtgpu {self.environment.version}", self.environment.check,
                 self._apply_environment),
            Step(f"command links in {L.bin_dir}", self.links.check, self.links.apply),
            Step(f"config {L.config}", self.config_plan.check, self.config_plan.apply),
            Step(f"STATE_DIR {self.state_dir}", self._state_dir_check, self._state_dir_apply),
        ]
        if self.secret is not None:
            steps.append(Step(f"cluster secret {self.secret.path}", self.secret.check, self.secret.apply))
        if self.drives is not None:  # a WSL2 host: before the service starts, so tenants never see the drives
            steps += (self.drives.hide_steps() if self.drives_choice == "hidden"
                      else self.drives.unhide_steps("--windows-drives open"))
        what = "systemd unit" if s.kind == "systemd" else "init script"
        steps += [
            Step(f"{what} {s.definition}", self._definition_check, self._definition_apply),
            Step(f"autostart ({self.choice.boot_hook})",
                 lambda: Check(s.autostart_enabled(), "enabled" if s.autostart_enabled() else ""),
                 s.enable_autostart),
        ]
        if getattr(s, "startable", True):  # a unit written into an image is started by its systemd, not here
            steps += [
                Step("start the service", self._start_check, self._start_apply),
                Step(f"the node answers on {self.config.socket_path}", self._answers_check, self._wait,
                     change=False),
            ]
        return steps

    def _packages_check(self) -> Check:
        missing = missing_packages(self.packages, self.run)
        return Check(not missing, f"missing: {' '.join(missing)}" if missing else "all installed")

    def _apply_environment(self) -> str:
        done = self.environment.apply()
        self.restart_needed = True  # a running server runs the old code
        return done

    def _state_dir_check(self) -> Check:
        return Check(self.state_dir.is_dir(), "exists" if self.state_dir.is_dir() else "")

    def _state_dir_apply(self) -> str:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state_dir, 0o755)  # world-traversable: tenants reach the socket and their logs
        return "made (mode 0755)"

    def _definition_check(self) -> Check:
        try:
            same = self.service.definition.read_text() == self.service.definition_text()
        except OSError:
            return Check(False, "")
        return Check(same, "unchanged" if same else "it differs from what this version writes")

    def _definition_apply(self) -> str:
        existed = self.service.definition.exists()
        running = existed and self.service.running_pid() is not None  # asked with the definition it was started by
        if running:
            self.service.stop()  # the new definition may not recognise the old server (another venv, config)
            self.restart_needed = True
        self.service.install_definition()
        if running:
            return "rewritten; the server was stopped for it and is started again below (its jobs keep running)"
        return "rewritten" if existed else "written"

    def _start_check(self) -> Check:
        pid = self.service.running_pid()
        if pid is None:
            return Check(False, "stopped to change its definition" if self.restart_needed else "not running")
        if self.restart_needed:
            return Check(False, f"running (pid {pid}), restarted for the new environment or definition")
        return Check(True, f"running, pid {pid}")

    def _start_apply(self) -> str:
        if self.service.running_pid() is not None:
            return self.service.restart() + "; its jobs and workspaces keep running"
        return self.service.start()

    def _answers_check(self) -> Check:
        got, _ = try_health(self.config.socket_path)
        if got is None or not got.get("ok"):
            return Check(False, "")
        return Check(True, describe_node(got))

    def _wait(self) -> str:
        waited = wait_until_answers(self.config.socket_path, self.wait_s,
                                    lambda: self.service.running_pid() is not None, self.service.log_tail)
        return f"{describe_node(waited.health)}, after {waited.waited_s:.1f}s"


def describe_node(health: dict) -> str:
    return (f"node {health.get('node')} (pid {health.get('pid')}), role {role_of(health)}, "
            f"version {health.get('version')}")


def flags_from(**values: Any) -> dict[str, Any]:
    """The config flags by their names (FLAG_KEYS), from the CLI's keyword arguments."""
    out: dict[str, Any] = {}
    for flag in FLAG_KEYS:
        value = values.get(flag.lstrip("-").replace("-", "_"))
        if value is not None:
            out[flag] = value
    if isinstance(out.get("--peers"), str):  # --peers A,B,C
        out["--peers"] = [p.strip() for p in out["--peers"].split(",") if p.strip()]
    return out

"""`mtgpu-setup upgrade --from PATH`: the mtgpu that `mtgpu-setup install` put on this
machine (its record, install.json, names the environment, the config and the service)
is replaced by the package in PATH (an mtgpu source folder, or a wheel with the client's
wheel beside it), keeping the node's jobs and workspaces running.

The steps, each said: check the new package; build the new environment beside the running
one (VENV.next: a copy made with `cp -a`, upgraded with pip) while the node still serves;
stop the server alone (both service paths signal its process only: jobs run under their
own supervisors); switch (VENV becomes VENV.previous, VENV.next becomes VENV: the server is
down for seconds, not for pip, which matters in a cluster, where a member silent for
MEMBER_DOWN_AFTER_S has its jobs requeued); start; wait until the node answers with the new
version; verify that it is healthy and that the jobs running before still run. A failure
after the stop puts VENV.previous back, starts the service again and says which version
the node runs; a failure before it changes nothing but VENV.next, which is removed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..client.local import ClientError, LocalClient
from ..config import ConfigError, load_config
from .environment import open_to_tenants, probe_venv, source_folder
from .install import check_root
from .layout import Layout
from .manifest import read_manifest
from .node import running_here, try_health, wait_until_answers
from .plan import SetupRefused, StepFailed
from .service import Runner, Service, ServiceChoice, make_service
from .status import install_command

DEFAULT_WAIT_S = 90.0
STEP_COUNT = 7
CLIENT_DIST = "mtgpu-client"
_FORMAT_RE = re.compile(r"^STATE_FORMAT\s*=\s*(\d+)", re.MULTILINE)
STATE_COMMANDS = "mtgpu/state/commands.py"  # where a package says its state format

# run by the environment's python: its mtgpu's state format (None: from before state formats)
_FORMAT_PROBE = ("import json\ntry:\n    from mtgpu.state.commands import STATE_FORMAT\nexcept Exception:\n"
                 "    STATE_FORMAT = None\nprint(json.dumps(STATE_FORMAT))")
# run by the environment's python: the requirements (argv[1], JSON) it does not satisfy
_DEPS_PROBE = """import json, sys
from importlib import metadata
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
unmet = []
for line in json.loads(sys.argv[1]):
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        have = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        unmet.append(line + " (not installed)")
        continue
    if req.specifier and not req.specifier.contains(have, prereleases=True):
        unmet.append(line + " (has " + have + ")")
print(json.dumps(unmet))
"""


def version_key(version: str) -> tuple[int, ...]:
    """The release numbers of a version ("0.1.2" -> (0, 1, 2)); a local part (+...) is ignored."""
    return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0]))


@dataclass(frozen=True)
class NewPackage:
    """What `--from` holds: the version, its requirements (Requires-Dist), its state format
    (None when it does not say) and the paths pip installs, the client first."""

    path: Path
    kind: str  # "source folder" or "wheel"
    version: str
    requires: tuple[str, ...]
    state_format: int | None
    pip_targets: tuple[str, ...]


def _not_mtgpu(path: Path, why: str) -> SetupRefused:
    return SetupRefused(f"--from {str(path)!r} {why}: give the folder of an mtgpu checkout (with its "
                        "pyproject.toml) or an mtgpu wheel (mtgpu-VERSION-py3-none-any.whl, with "
                        "mtgpu_client-VERSION-py3-none-any.whl beside it)")


def inspect_package(path: Path) -> NewPackage:
    """Read `path` without installing it; SetupRefused when it is no mtgpu package."""
    if not path.is_absolute():
        path = path.resolve()
    if path.is_dir():
        return _inspect_source(path)
    if path.is_file() and path.suffix == ".whl":
        return _inspect_wheel(path)
    if not path.exists():
        raise _not_mtgpu(path, "does not exist")
    raise _not_mtgpu(path, "is neither a folder nor a .whl file")


def _inspect_source(path: Path) -> NewPackage:
    if source_folder(path) is None:
        raise _not_mtgpu(path, "holds no pyproject.toml of mtgpu")
    try:
        project = tomllib.loads((path / "pyproject.toml").read_text())["project"]
        version = str(project["version"])
    except (KeyError, OSError, tomllib.TOMLDecodeError) as e:
        raise _not_mtgpu(path, f"has no readable version in pyproject.toml ({e})") from None
    client = path / "clients" / "python"
    if not (client / "pyproject.toml").is_file():
        raise _not_mtgpu(path, "has no clients/python (the client distribution mtgpu depends on)")
    fmt = _state_format((path / STATE_COMMANDS).read_text() if (path / STATE_COMMANDS).is_file() else "")
    return NewPackage(path, "source folder", version, tuple(project.get("dependencies", ())), fmt,
                      (str(client), str(path)))


def _inspect_wheel(path: Path) -> NewPackage:
    parts = path.name.split("-")
    if len(parts) < 3 or parts[0] != "mtgpu":
        raise _not_mtgpu(path, "is not a wheel of mtgpu (its name does not start with mtgpu-VERSION-)")
    try:
        with zipfile.ZipFile(path) as z:
            meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            meta = z.read(meta_name).decode()
            fmt = _state_format(z.read(STATE_COMMANDS).decode() if STATE_COMMANDS in z.namelist() else "")
    except (OSError, zipfile.BadZipFile, StopIteration) as e:
        raise _not_mtgpu(path, f"cannot be read as a wheel ({e or 'no METADATA in it'})") from None
    fields = [line.split(":", 1) for line in meta.splitlines() if ":" in line]
    version = next((v.strip() for k, v in fields if k == "Version"), None)
    if version is None:
        raise _not_mtgpu(path, "names no Version in its METADATA")
    requires = tuple(v.strip() for k, v in fields if k == "Requires-Dist")
    client = path.with_name(f"mtgpu_client-{version}-py3-none-any.whl")
    if not client.is_file():
        raise SetupRefused(f"--from {str(path)!r}: the client's wheel {client.name} is not beside it (mtgpu "
                           f"{version} depends on mtgpu-client {version}): build both with `pip wheel --no-deps "
                           "./clients/python .` in the checkout and put them in one folder")
    return NewPackage(path, "wheel", version, requires, fmt, (str(client), str(path)))


def _state_format(text: str) -> int | None:
    found = _FORMAT_RE.search(text)
    return int(found.group(1)) if found else None


@dataclass
class Installed:
    """What this machine runs now, from the install's record."""

    layout: Layout
    service: Service
    socket: Path
    version: str
    state_format: int | None


def find_installed(root: Path, config: Path | None, run: Runner = subprocess.run) -> Installed:
    root = check_root(root)
    manifest = read_manifest(Layout.make(root).manifest)
    if manifest is None:
        raise SetupRefused(f"no install record at {Layout.make(root).manifest}: this machine has no mtgpu that "
                           f"`mtgpu-setup install` made; install it with `{install_command(root, config)}`")
    layout = Layout.make(root, config or manifest.config, manifest.venv)
    service = make_service(ServiceChoice(manifest.service, manifest.boot_hook, ""), layout, run)
    if not getattr(service, "startable", True):
        raise SetupRefused(f"{service.definition} is a unit for the system under --root {root}, started by its own "
                           "systemd: upgrade that system's environment from inside it")
    try:
        cfg = load_config(layout.config)
    except ConfigError as e:
        raise SetupRefused(f"the installed config {layout.config} cannot be read ({e}): fix it first "
                           "(`mtgpu-setup status` shows the problem)") from None
    info = probe_venv(layout.venv, run)
    if info is None:
        raise SetupRefused(f"the environment {layout.venv} (from {layout.manifest}) holds no mtgpu: run "
                           "`mtgpu-setup install --yes` to repair the install, then upgrade")
    r = run([str(layout.venv / "bin" / "python"), "-I", "-c", _FORMAT_PROBE], capture_output=True, text=True,
            cwd="/", timeout=60)
    fmt = json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else None
    return Installed(layout, service, cfg.socket_path, info.version, fmt)


def check_upgrade(old: Installed, new: NewPackage) -> None:
    """Refuse what cannot work: the same version, or a downgrade below the state format the
    node runs (its journal may hold commands the older mtgpu cannot apply)."""
    if new.version == old.version:
        raise SetupRefused(f"--from {str(new.path)!r} is mtgpu {new.version}, which {old.layout.venv} holds "
                           "already: nothing to upgrade; give a package of another version")
    older_format = (old.state_format is not None and (new.state_format or 1) < old.state_format)
    if version_key(new.version) < version_key(old.version) and older_format:
        raise SetupRefused(f"--from {str(new.path)!r} is mtgpu {new.version} (state format {new.state_format or 1}),"
                           f" older than the {old.version} installed (state format {old.state_format}): its "
                           "journal may hold commands the older one cannot apply (docs/INSTALL.md, \"Versions "
                           "that mix\"); restore a backup taken under the older version instead")


def rewrite_scripts(venv: Path, final: Path) -> None:
    """pip writes the scripts of `venv`/bin (mt-job, mtgpu-server) with `#!VENV/bin/python`:
    the environment is built under another name than the one it will have, so their first
    line is made to name `final`, where they run."""
    built, wanted = f"#!{venv}/".encode(), f"#!{final}/".encode()
    for script in (venv / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        with open(script, "rb") as f:
            head = f.read(len(built))
        if head == built:
            data = script.read_bytes()
            script.write_bytes(wanted + data[len(built):])


@dataclass(frozen=True)
class UpgradeOptions:
    source: Path
    root: Path = Path("/")
    config: Path | None = None
    wait_timeout_s: float | None = None


class UpgradeFailed(Exception):
    """A step failed; the message says which, and what the node runs now (after a rollback
    when the server had been stopped)."""


class Upgrader:
    """`preflight()` (SetupRefused: nothing changed), then `run_steps()` (UpgradeFailed)."""

    def __init__(self, options: UpgradeOptions, out: Callable[[str], None], run: Runner = subprocess.run) -> None:
        self.options = options
        self.out = out
        self.run = run

    def preflight(self) -> None:
        if os.geteuid() != 0:
            raise SetupRefused("mtgpu-setup upgrade replaces the service's environment: run it as root")
        o = self.options
        if o.wait_timeout_s is not None and o.wait_timeout_s <= 0:
            raise SetupRefused(f"--wait-timeout {o.wait_timeout_s:g}: give a number of seconds above 0, e.g. 90")
        self.wait_s = o.wait_timeout_s or DEFAULT_WAIT_S
        self.new = inspect_package(o.source)
        self.old = find_installed(o.root, o.config, self.run)
        self.venv = self.old.layout.venv
        self.previous = self.venv.with_name(self.venv.name + ".previous")
        self.next = self.venv.with_name(self.venv.name + ".next")
        self.switched = False  # VENV was moved to VENV.previous (a rollback moves it back)
        check_upgrade(self.old, self.new)

    def question(self) -> str:
        return f"upgrade mtgpu {self.old.version} in {self.venv} to {self.new.version} from {self.new.path}?"

    def _say(self, number: int, title: str, what: str) -> None:
        self.out(f"[{number}/{STEP_COUNT}] {title}: {what}")

    def run_steps(self) -> None:
        """The seven steps; raises UpgradeFailed after a rollback (or a failed one)."""
        new, old = self.new, self.old
        self.no_deps, unmet = self._deps()
        fmt = f", state format {new.state_format}" if new.state_format else ""
        deps = "its requirements are met in the environment" if self.no_deps else \
            f"pip installs what is missing: {', '.join(unmet)}"
        self._say(1, "check the new package", f"mtgpu {new.version}{fmt}, a {new.kind} ({new.path}), replacing "
                  f"{old.version}; {deps}")
        try:
            self._say(2, f"install mtgpu {new.version} into {self.next} (a copy of {self.venv})", self._prepare())
        except (StepFailed, OSError, subprocess.SubprocessError) as e:
            shutil.rmtree(self.next, ignore_errors=True)
            self.out(f"[2/{STEP_COUNT}] install mtgpu {new.version}: FAILED: {e}")
            raise UpgradeFailed(f"upgrade to mtgpu {new.version} failed at step 2 (install it beside the running "
                                f"environment): {_short(e)}; nothing else was changed: the node still runs mtgpu "
                                f"{old.version}") from None
        before = running_here(old.socket)
        self.running_before = [j["id"] for j in before]
        number, title = 3, "stop the server alone"
        try:
            stopped = old.service.stop()
            self._say(number, title, f"{stopped}" + (f"; running here: {len(before)} job(s) or workspace(s) ("
                                                      f"{', '.join(map(str, self.running_before))})" if before else ""))
            number, title = 4, f"switch {self.venv} to mtgpu {new.version}"
            self._say(number, title, self._switch())
            number, title = 5, "start the service"
            self._say(number, title, old.service.start())
            number, title = 6, f"the node answers on {old.socket} with mtgpu {new.version}"
            self._say(number, title, self._wait(new.version))
            number, title = 7, "verify the node and the jobs that ran before"
            self._say(number, title, self._verify())
        except (StepFailed, OSError, subprocess.SubprocessError) as e:
            self.out(f"[{number}/{STEP_COUNT}] {title}: FAILED: {e}")
            raise UpgradeFailed(f"upgrade to mtgpu {new.version} failed at step {number} ({title}): "
                                f"{_short(e)}; {self._rollback()}") from None

    def _deps(self) -> tuple[bool, list[str]]:
        """Whether the new package's requirements (less the client, installed with it) are all
        met in the environment: then pip installs with --no-deps and needs no index for them."""
        wanted = [r for r in self.new.requires if not re.match(rf"{CLIENT_DIST}\b", r.replace("_", "-"))]
        r = self.run([str(self.venv / "bin" / "python"), "-I", "-c", _DEPS_PROBE, json.dumps(wanted)],
                     capture_output=True, text=True, cwd="/", timeout=120)
        if r.returncode != 0:
            return False, [f"(the requirements could not be checked: {r.stderr.strip()[-200:]})"]
        unmet = json.loads(r.stdout)
        return not unmet, unmet

    def _prepare(self) -> str:
        """The new environment, made beside the running one while the node still serves: a copy
        (cp -a) upgraded with pip. The server is then down only for the switch, seconds, well
        inside a cluster's MEMBER_DOWN_AFTER_S (a longer silence requeues the member's jobs)."""
        shutil.rmtree(self.next, ignore_errors=True)
        r = self.run(["cp", "-a", str(self.venv), str(self.next)], capture_output=True, text=True)
        if r.returncode != 0:
            raise StepFailed(f"could not copy {self.venv} to {self.next} ({r.stderr.strip()}): free disk space "
                             "there and run again")
        pip = [str(self.next / "bin" / "python"), "-m", "pip", "install", "-q"]
        client = self.new.pip_targets[0]
        for cmd in (pip + (["--no-deps"] if self.no_deps else []) + list(self.new.pip_targets),
                    # an mtgpu from before the client's split owned the client's files, and pip removes
                    # them when it replaces that one, after it installed the client (as install does)
                    pip + ["--no-deps", "--force-reinstall", client]):
            r = self.run(cmd, capture_output=True, text=True, cwd="/")
            if r.returncode != 0:
                raise StepFailed(f"`{' '.join(cmd)}` exited with {r.returncode}: "
                                 f"{(r.stderr or r.stdout).strip()[-800:]}")
        rewrite_scripts(self.next, self.venv)
        open_to_tenants(self.next)
        info = probe_venv(self.next, self.run)
        if info is None or info.version != self.new.version:
            raise StepFailed(f"after pip, {self.next} holds mtgpu {info.version if info else 'none'}, not "
                             f"{self.new.version}")
        return f"pip installed mtgpu {self.new.version} ({'--no-deps' if self.no_deps else 'with its requirements'})" \
               f"; the node keeps running {self.old.version} meanwhile"

    def _switch(self) -> str:
        shutil.rmtree(self.previous, ignore_errors=True)
        os.rename(self.venv, self.previous)
        self.switched = True
        os.rename(self.next, self.venv)
        return f"{self.venv} holds mtgpu {self.new.version}; {self.old.version} is kept as {self.previous}"

    def _wait(self, version: str) -> str:
        svc = self.old.service
        waited = wait_until_answers(self.old.socket, self.wait_s, lambda: svc.running_pid() is not None,
                                    svc.log_tail)
        got = waited.health.get("version")
        if got != version:
            raise StepFailed(f"the node answers with version {got}, not {version}")
        return f"node {waited.health.get('node')} (pid {waited.health.get('pid')}), version {got}, " \
               f"after {waited.waited_s:.1f}s"

    def _verify(self) -> str:
        health, why = try_health(self.old.socket)
        if health is None or not health.get("ok"):
            raise StepFailed(f"the node stopped answering ({why or 'health not ok'})")
        bad = []
        for job_id in self.running_before:
            state = self._job_state(job_id)
            if state not in ("running", "completed"):
                bad.append(f"{job_id} is {state}")
        if bad:
            raise StepFailed(f"jobs that ran before the upgrade did not survive it: {', '.join(bad)}")
        if not self.running_before:
            return "health ok; no jobs ran before"
        return f"health ok; the {len(self.running_before)} job(s) that ran before still run (re-attached)"

    def _job_state(self, job_id: int) -> str:
        try:
            with LocalClient(str(self.old.socket), timeout_s=5) as c:
                return str(c.job(job_id).get("state"))
        except ClientError as e:
            return f"unknown ({e})"

    def _rollback(self) -> str:
        """Put the kept environment back and start the service again; what the node runs now."""
        old, svc = self.old, self.old.service
        try:
            if svc.running_pid() is not None:
                svc.stop()
            if self.switched:  # the new one goes, the kept one comes back
                shutil.rmtree(self.venv, ignore_errors=True)
                os.rename(self.previous, self.venv)
            shutil.rmtree(self.next, ignore_errors=True)
            svc.start()
            waited = wait_until_answers(old.socket, self.wait_s, lambda: svc.running_pid() is not None,
                                        svc.log_tail)
        except (StepFailed, OSError, subprocess.SubprocessError) as e:
            kept = self.previous if self.switched and self.previous.exists() else self.venv
            return (f"the rollback to mtgpu {old.version} failed too ({_short(e)}): the previous environment is "
                    f"{kept}; `mtgpu-setup status` says what runs")
        self.out(f"rolled back: {self.venv} holds mtgpu {old.version} again; node {waited.health.get('node')} "
                 f"answers with version {waited.health.get('version')}")
        return f"rolled back to mtgpu {old.version}, which answers again"


def _short(e: BaseException) -> str:
    text = str(e).strip()
    return text if len(text) < 600 else text[:300] + " ... " + text[-280:]


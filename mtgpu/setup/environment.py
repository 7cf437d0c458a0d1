"""The machine's side of an install: distribution packages (the list in packages.txt,
shared with scripts/install.sh), the Python environment in /opt/mtgpu, and the command
links in /usr/local/bin."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path
from typing import Callable

from .plan import Check, SetupRefused, StepFailed

Runner = Callable[..., subprocess.CompletedProcess]
PACKAGE_ROLES = ("node", "test")


# ---------------------------------------------------------------- distribution packages


def package_list(roles: tuple[str, ...] = ("node",), text: str | None = None) -> list[str]:
    """The packages of `roles` from packages.txt (columns: role, package, why)."""
    if text is None:
        text = resources.files("mtgpu.setup").joinpath("packages.txt").read_text()
    names = []
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0].startswith("#"):
            continue
        if parts[0] not in PACKAGE_ROLES or len(parts) < 2:
            raise ValueError(f"packages.txt: {line!r}: each line is `ROLE PACKAGE WHY` with ROLE one of "
                             + ", ".join(PACKAGE_ROLES))
        if parts[0] in roles:
            names.append(parts[1])
    return names


def missing_packages(names: list[str], run: Runner = subprocess.run) -> list[str]:
    """The packages of `names` that dpkg does not show as installed. Raises SetupRefused
    where there is no dpkg (not a Debian-like system)."""
    if shutil.which("dpkg-query") is None:
        raise SetupRefused("dpkg-query is not installed, so the distribution packages cannot be checked; install "
                           f"these with your distribution's tool: {' '.join(names)}; then run again with --no-packages")
    # One query for all (status 1 when any is unknown to dpkg; the known ones are still listed).
    r = run(["dpkg-query", "-W", "-f=${Package} ${Status}\n", *names], capture_output=True, text=True)
    installed = {line.split()[0].split(":")[0] for line in r.stdout.splitlines()
                 if line.strip() and line.endswith("ok installed")}
    return [name for name in names if name not in installed]


def install_packages(names: list[str], run: Runner = subprocess.run) -> str:
    """apt-get install `names`, without starting the services they bring (the machine's own
    sshd stays as the admin has it; mtgpu runs its own tenant sshd)."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    policy = Path("/usr/sbin/policy-rc.d")
    own_policy = not policy.exists()
    if own_policy:
        policy.write_text("#!/bin/sh\n# mtgpu-setup install: services of new packages are not started\nexit 101\n")
        policy.chmod(0o755)
    try:
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *names]):
            r = run(cmd, capture_output=True, text=True, env=env)
            if r.returncode != 0:
                raise StepFailed(f"`{' '.join(cmd)}` exited with {r.returncode}: {(r.stderr or r.stdout).strip()[-800:]}")
    finally:
        if own_policy:
            policy.unlink(missing_ok=True)
    return f"installed {' '.join(names)}"


# ---------------------------------------------------------------- the Python environment


def source_folder(given: Path | None = None) -> Path | None:
    """The folder to pip-install mtgpu from: `given`, else the checkout this code runs from
    (the folder above the package, when it holds mtgpu's pyproject.toml)."""
    candidate = given if given is not None else Path(__file__).resolve().parents[2]
    project = candidate / "pyproject.toml"
    try:
        name = tomllib.loads(project.read_text())["project"]["name"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return None
    return candidate if name == "mtgpu" else None


def package_version(source: Path | None = None) -> str:
    """The mtgpu version this setup installs: the source folder's, else the installed one's."""
    if source is not None:
        return tomllib.loads((source / "pyproject.toml").read_text())["project"]["version"]
    try:
        return metadata.version("mtgpu")
    except metadata.PackageNotFoundError:
        return "unknown"


SYSTEM_PYTHON = Path("/usr/bin/python3")


def base_interpreter(system: Path = SYSTEM_PYTHON, which: Callable[[str], str | None] = shutil.which) -> Path:
    """The interpreter to make the environment with: the system's (as scripts/install.sh does),
    not the first python3 on root's PATH (pyenv's or conda's live under /root, which tenants
    cannot enter); that one only where the system has none."""
    if os.access(system, os.X_OK):
        return system
    found = which("python3")
    return Path(found) if found else system


def tenant_blocker(path: Path) -> tuple[Path, str] | None:
    """Where an unprivileged user (a tenant: not root, not in root's group) is stopped on the
    way to running `path`: (the folder or file, why), None when nothing stops it. Symbolic
    links are followed, each folder on the way needs search (o+x), the file o+rx."""
    seen: set[Path] = set()
    todo = [Path(os.path.abspath(path))]
    while todo:
        target = todo.pop()
        for parent in reversed(target.parents):
            if parent in seen:
                continue
            seen.add(parent)
            try:
                mode = parent.stat().st_mode
            except OSError:
                continue  # not made yet (the environment's own folders): made world-searchable
            if not mode & 0o001:
                return parent, f"mode {mode & 0o7777:04o}: others may not enter it"
        if target.is_symlink():
            todo.append(Path(os.path.abspath(target.parent / os.readlink(target))))
            continue
        try:
            mode = target.stat().st_mode
        except OSError:
            return None
        if mode & 0o005 != 0o005:
            return target, f"mode {mode & 0o7777:04o}: others may not read and run it"
    return None


# the commands: the server distribution's and the client's (remotegpu-cli, mtgpu-client's since the split)
_PROBE = ("import importlib.metadata as m, json; d = m.distribution('mtgpu'); "
          "print(json.dumps({'version': d.version, 'scripts': sorted(e.name for e in "
          "m.entry_points(group='console_scripts') if e.dist and e.dist.name in ('mtgpu', 'mtgpu-client'))}))")


@dataclass(frozen=True)
class VenvInfo:
    version: str
    scripts: tuple[str, ...]


def probe_venv(venv: Path, run: Runner = subprocess.run) -> VenvInfo | None:
    """What mtgpu the environment holds (None: no environment, or no mtgpu in it). Run
    isolated (-I) from /, so a checkout in the working folder is not what is found."""
    python = venv / "bin" / "python"
    if not python.exists():
        return None
    try:
        r = run([str(python), "-I", "-c", _PROBE], capture_output=True, text=True, cwd="/", timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    try:
        doc = json.loads(r.stdout)
        return VenvInfo(str(doc["version"]), tuple(doc["scripts"]))
    except (ValueError, KeyError, TypeError):
        return None


class Environment:
    """The environment step: `venv` holds this mtgpu version, or is made (or upgraded)
    with pip from `source`."""

    def __init__(self, venv: Path, version: str, source: Path | None, run: Runner = subprocess.run,
                 python: Path | None = None) -> None:
        self.venv = venv
        self.version = version
        self.source = source
        self.run = run
        self.python = python or base_interpreter()  # what makes the environment when there is none

    def info(self) -> VenvInfo | None:
        return probe_venv(self.venv, self.run)

    def check(self) -> Check:
        info = self.info()
        if info is None:
            what = "no environment there" if not (self.venv / "bin" / "python").exists() else "no mtgpu in it"
            return Check(False, what)
        if info.version != self.version:
            return Check(False, f"it has mtgpu {info.version}, this is {self.version}")
        if not (self.venv / "bin" / "mtgpu-server").exists():
            return Check(False, "mtgpu-server is missing from it")
        return Check(True, f"mtgpu {info.version}")

    def preflight(self) -> None:
        """Refuse before any change when the environment would need pip and nothing can be installed,
        or when tenants could not run its interpreter (every command of theirs would fail with
        'bad interpreter: Permission denied')."""
        if not self.check().done and self.source is None:
            raise SetupRefused(f"the environment {self.venv} does not hold mtgpu {self.version}, and there is no "
                               "source folder to install it from: pass --source DIR (a checkout of mtgpu, with its "
                               "pyproject.toml), or --venv PATH of an environment that has it")
        python = self.venv / "bin" / "python"
        made = python.exists() or python.is_symlink()
        checks = [(python, f"remove {self.venv} and run again so it is made with {SYSTEM_PYTHON}, or give --venv "
                           "PATH of an environment tenants can run")] if made else [
            (self.python, f"install the distribution's python3 and python3-venv, so that {SYSTEM_PYTHON} makes the "
                          "environment (as scripts/install.sh does)"),
            (python, "give --venv PATH in a folder tenants can enter")]
        for interpreter, fix in checks:
            blocked = tenant_blocker(interpreter)
            if blocked is None:
                continue
            where, why = blocked
            real = os.path.realpath(interpreter)
            shown = f"{interpreter}" + (f" (that is {real})" if real != str(interpreter) else "")
            bits = "o+x" if where.is_dir() else "o+rx"
            raise SetupRefused(f"tenants could not run the environment's interpreter {shown}: {where} stops them "
                               f"({why}), so every tenant command would fail with 'bad interpreter: Permission "
                               f"denied'; {fix}, or let others through with `chmod {bits} {where}`")

    def apply(self) -> str:
        made = False
        if not (self.venv / "bin" / "python").exists():
            self._run([str(self.python), "-m", "venv", str(self.venv)])
            made = True
        pip = [str(self.venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        client = str(self.source / "clients" / "python")
        # the client distribution (remotegpu-cli and what it imports) and the server, which depends
        # on it; the client once more alone: an mtgpu from before the split owned the client's files
        # too, and pip removes them when it replaces that one, after it installed the client
        self._run(pip + [client, str(self.source)])
        self._run(pip + ["--no-deps", "--force-reinstall", client])
        open_to_tenants(self.venv)
        return f"{'made' if made else 'upgraded'} {self.venv} with mtgpu {self.version} from {self.source}"

    def _run(self, cmd: list[str]) -> None:
        r = self.run(cmd, capture_output=True, text=True, cwd="/")
        if r.returncode != 0:
            raise StepFailed(f"`{' '.join(cmd)}` exited with {r.returncode}: {(r.stderr or r.stdout).strip()[-800:]}")


def open_to_tenants(venv: Path) -> None:
    """Tenants run the CLIs (mt-job, mt-container) from the environment: everything in it
    readable by all, and what its owner may run or enter, runnable and enterable by all."""
    for dirpath, dirnames, filenames in os.walk(venv):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                mode = os.stat(p).st_mode
                os.chmod(p, mode | 0o044 | (0o011 if mode & 0o100 else 0))


# ---------------------------------------------------------------- command links


class CommandLinks:
    """/usr/local/bin/NAME -> VENV/bin/NAME for every command of the package."""

    def __init__(self, bin_dir: Path, venv: Path, scripts: Callable[[], tuple[str, ...]]) -> None:
        self.bin_dir = bin_dir
        self.venv = venv
        self.scripts = scripts

    def _wanted(self) -> dict[Path, Path]:
        return {self.bin_dir / n: self.venv / "bin" / n for n in self.scripts()}

    def check(self) -> Check:
        wanted = self._wanted()
        wrong = [str(link) for link, target in wanted.items()
                 if not (link.is_symlink() and Path(os.readlink(link)) == target)]
        if wrong:
            return Check(False, f"{len(wrong)} of {len(wanted)} to make")
        return Check(True, f"{len(wanted)} commands")

    def apply(self) -> str:
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        made = []
        for link, target in self._wanted().items():
            if link.is_symlink() and Path(os.readlink(link)) == target:
                continue
            if link.exists() and not link.is_symlink():
                raise StepFailed(f"{link} is a file, not a link this setup made: move it away and run again")
            link.unlink(missing_ok=True)
            link.symlink_to(target)
            made.append(link.name)
        return f"linked {', '.join(made)} into {self.bin_dir}"

    def ours(self) -> list[Path]:
        """The links in bin_dir that point into this environment (what uninstall removes)."""
        if not self.bin_dir.is_dir():
            return []
        prefix = str(self.venv / "bin") + "/"
        return sorted(p for p in self.bin_dir.iterdir() if p.is_symlink() and os.readlink(p).startswith(prefix))

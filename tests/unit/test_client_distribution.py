"""The client distribution mtgpu-client (issue 27 point 8, clients/python): remotegpu-cli alone on
a laptop, Linux, macOS or Windows.

- What it holds (client_modules.txt) is exactly what remotegpu-cli imports, read from the
  sources (every import, also those inside functions: a command's lazy ones) and seen at run
  time (`remotegpu-cli --help` and every subcommand's): an import the manifest misses fails here.
- Those modules import where the POSIX-only modules do not exist (as on Windows), and they
  import nothing that is not the client's declared dependencies or theirs (none of the server's).
- The two wheels built from the tree hold every file of mtgpu/ once: the client's the
  manifest's, the server's the rest; the same version, the server depending on the client at
  it, remotegpu-cli the client's command alone. The client's sdist builds the same wheel.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "clients" / "python"
ENTRY = "mtgpu.cli.remotegpu"
POSIX_ONLY = ("fcntl", "termios", "tty", "pty", "pwd", "grp", "resource", "syslog", "posix")
# the server's own dependencies (their import names): none may load on the client's path; psutil,
# a client dependency too, only when DirectLink looks for this machine's LAN addresses
SERVER_ONLY = ("fastapi", "starlette", "uvicorn", "httptools", "uvloop", "pysyncobj", "numpy", "pynvml",
               "prometheus_client", "orjson", "psutil")


def manifest() -> list[str]:
    sys.path.insert(0, str(CLIENT))
    try:
        import mtgpu_client_build
    finally:
        sys.path.remove(str(CLIENT))
    return mtgpu_client_build.read_manifest(CLIENT / "client_modules.txt")


def module_file(name: str) -> str | None:
    """'mtgpu.cli.common' -> 'mtgpu/cli/common.py' (a package: its __init__.py), None if neither exists."""
    base = Path(*name.split("."))
    for rel in (base / "__init__.py", base.with_suffix(".py")):
        if (REPO / rel).is_file():
            return rel.as_posix()
    return None


def file_module(rel: str) -> str:
    parts = rel[:-len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_by(name: str) -> set[str]:
    """The mtgpu modules `name`'s source imports anywhere in it (a module-level import, one
    inside a function, `from . import x`), with the packages above each."""
    rel = module_file(name)
    package = name if rel.endswith("__init__.py") else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse((REPO / rel).read_text(), rel)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # a submodule, or a name in target
    out = set()
    for dotted in found:
        parts = dotted.split(".")
        if parts[0] == "mtgpu":
            out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1) if module_file(".".join(parts[:i])))
    return out


def static_closure(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(imported_by(name))
    return seen


# The client's path in an interpreter where the POSIX-only modules cannot be imported (as on
# Windows): every manifest module imported, then `remotegpu-cli [COMMAND...] --help` for the
# program and every command; what got imported is written to argv[1] as JSON.
PROBE = """
import contextlib, importlib, importlib.abc, io, json, sys
BLOCKED = set(sys.argv[2].split(","))
class Windows(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} does not exist on Windows")
for name in list(sys.modules):
    if name.split(".")[0] in BLOCKED:
        del sys.modules[name]
sys.meta_path.insert(0, Windows())
for name in sys.argv[3:]:
    importlib.import_module(name)
import typer.main
from mtgpu.cli.remotegpu import app
root = typer.main.get_command(app)
def walk(command, path):
    yield path
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from walk(sub, path + [name])
helped = []
for path in walk(root, []):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = root.main(args=path + ["--help"], prog_name="remotegpu-cli", standalone_mode=False)
    assert code in (0, None) and "Usage:" in out.getvalue(), (path, code, out.getvalue())
    helped.append(" ".join(path))
with open(sys.argv[1], "w") as f:
    json.dump({"modules": sorted(sys.modules), "helped": helped}, f)
"""


def probe(tmp: Path, blocked: set[str]) -> dict:
    """What the PROBE saw with `blocked` not importable: {"modules": every module imported,
    "helped": the commands asked --help}."""
    out = tmp / "seen.json"
    modules = [file_module(rel) for rel in manifest()]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp)}  # no HOME: pwd, not on Windows
    r = subprocess.run([sys.executable, "-c", PROBE, str(out), ",".join(sorted(blocked)), *modules],
                       capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def as_on_windows(tmp_path_factory):
    return probe(tmp_path_factory.mktemp("windows"), set(POSIX_ONLY))


def test_the_manifest_is_exactly_what_remotegpu_cli_imports_in_its_sources():
    listed = manifest()
    assert len(listed) == len(set(listed)), "a file is listed twice"
    missing = [rel for rel in listed if not (REPO / rel).is_file()]
    assert not missing, f"client_modules.txt names files the tree does not hold: {missing}"
    wanted = {module_file(m) for m in static_closure(ENTRY)}
    assert not wanted - set(listed), (f"remotegpu-cli imports modules client_modules.txt does not list (add them, "
                                      f"or the client wheel lacks them): {sorted(wanted - set(listed))}")
    assert not set(listed) - wanted, (f"client_modules.txt lists modules remotegpu-cli never imports (the client "
                                      f"wheel need not carry them): {sorted(set(listed) - wanted)}")


def test_what_remotegpu_cli_help_imports_for_every_command_is_in_the_manifest(as_on_windows):
    assert {"", "join", "servers", "submit", "logs", "ssh-config"} <= set(as_on_windows["helped"])
    loaded = {module_file(m) for m in as_on_windows["modules"] if m == "mtgpu" or m.startswith("mtgpu.")}
    assert loaded and not loaded - set(manifest()), sorted(loaded - set(manifest()))


def test_the_client_imports_without_posix_only_modules_and_without_the_servers_dependencies(as_on_windows):
    tops = {m.split(".")[0] for m in as_on_windows["modules"]}
    assert not tops & set(POSIX_ONLY), sorted(tops & set(POSIX_ONLY))
    assert not tops & set(SERVER_ONLY), sorted(tops & set(SERVER_ONLY))


def test_the_client_path_needs_nothing_but_the_clients_declared_dependencies_and_theirs(tmp_path):
    """Every installed module that no dependency of the client (or of theirs) provides is made
    unimportable, as in a clean environment with the client alone: the path still imports (a
    module some library tries and does without, such as rich's optional attrs, may be missing)."""
    allowed = requirement_closure(tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]["dependencies"])
    others = {top for top, dists in metadata.packages_distributions().items()
              if top not in sys.stdlib_module_names and top != "mtgpu"
              and not {canonical(d) for d in dists} & (allowed | {"mtgpu", "mtgpu-client"})}
    assert {"fastapi", "uvicorn", "numpy"} <= others and "httpx" not in others  # what this environment holds
    seen = probe(tmp_path, others | set(POSIX_ONLY))
    assert "" in seen["helped"]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


REQUIREMENT = re.compile(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?")


def requirement_closure(requirements: list[str]) -> set[str]:
    """The distributions `requirements` name, and theirs, as installed here: a requirement's
    extras bring the requirements marked with them (textual's markdown-it-py[linkify])."""
    seen: set[tuple[str, str]] = set()
    todo = [(req, ()) for req in requirements]
    while todo:
        req, extras = todo.pop()
        marked = re.search(r"""extra\s*==\s*["']([^"']+)["']""", req)
        if marked and marked.group(1) not in extras:
            continue
        m = REQUIREMENT.match(req)
        name = canonical(m.group(1))
        wants = tuple(e.strip() for e in (m.group(2) or "").split(",") if e.strip())
        if all((name, e) in seen for e in ("",) + wants):
            continue
        seen.update((name, e) for e in ("",) + wants)
        try:
            todo.extend((r, wants) for r in metadata.requires(name) or [])
        except metadata.PackageNotFoundError:
            pass
    return {name for name, _ in seen}


# ---------------------------------------------------------------- the two wheels


def tree_copy(dest: Path) -> Path:
    """What the two distributions build from (the repository's own build/ folder left alone)."""
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "mtgpu", dest / "mtgpu", ignore=skip)
    shutil.copytree(CLIENT, dest / "clients" / "python", ignore=skip)
    return dest


def wheel_files(path: Path) -> tuple[set[str], dict[str, str]]:
    """(the wheel's files under mtgpu/, its dist-info's texts by name)."""
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        info = {n.split("/", 1)[1]: z.read(n).decode() for n in names if ".dist-info/" in n}
    return {n for n in names if n.startswith("mtgpu/")}, info


def requires(info: dict[str, str]) -> list[str]:
    return [ln.split(":", 1)[1].strip() for ln in info["METADATA"].splitlines() if ln.startswith("Requires-Dist:")]


def test_the_two_wheels_hold_every_file_of_the_tree_once_and_the_client_sdist_builds_the_same(tmp_path):
    (tmp_path / "src").mkdir()
    src = tree_copy(tmp_path / "src")
    out = tmp_path / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), "./clients/python",
                        "."], cwd=src, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    client_files, client_info = wheel_files(out / f"mtgpu_client-{version}-py3-none-any.whl")
    server_files, server_info = wheel_files(out / f"mtgpu-{version}-py3-none-any.whl")
    tree = {p.relative_to(REPO).as_posix() for p in (REPO / "mtgpu").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}
    assert client_files == set(manifest())
    assert not client_files & server_files, sorted(client_files & server_files)
    assert client_files | server_files == tree, (sorted(tree - client_files - server_files),
                                                 sorted((client_files | server_files) - tree))
    # One version; the server needs the client at it; remotegpu-cli is the client's alone.
    assert f"Version: {version}" in client_info["METADATA"].splitlines()
    assert f"mtgpu-client=={version}" in requires(server_info)
    assert "remotegpu-cli" not in server_info["entry_points.txt"]
    assert client_info["entry_points.txt"].split() == ["[console_scripts]", "remotegpu-cli", "=",
                                                       "mtgpu.cli.remotegpu:main"]
    client_deps = {canonical(re.match(r"[A-Za-z0-9._-]+", d).group(0)) for d in requires(client_info)}
    assert not client_deps & {"fastapi", "uvicorn", "pysyncobj", "numpy", "nvidia-ml-py", "prometheus-client",
                              "orjson", "httptools"}, client_deps
    record = {ln.split(",")[0] for ln in client_info["RECORD"].splitlines()}
    assert client_files <= record and f"mtgpu_client-{version}.dist-info/RECORD" in record
    # The client's sdist, unpacked, builds a wheel with the same files (no checkout around it).
    build = [sys.executable, "-c", "import sys, mtgpu_client_build as b; print(getattr(b, sys.argv[1])(sys.argv[2]))"]
    r = subprocess.run(build + ["build_sdist", str(tmp_path)], cwd=src / "clients" / "python", capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    with tarfile.open(tmp_path / r.stdout.strip()) as tar:
        tar.extractall(tmp_path / "unpacked", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    [unpacked] = (tmp_path / "unpacked").iterdir()
    again = tmp_path / "again"
    again.mkdir()
    r = subprocess.run(build + ["build_wheel", str(again)], cwd=unpacked, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    files, info = wheel_files(again / r.stdout.strip())
    assert files == client_files and info["METADATA"] == client_info["METADATA"]


# ---------------------------------------------------------------- installs of a checkout


def test_a_checkout_is_installed_as_both_distributions_then_the_client_alone_again(tmp_path):
    """scripts/install.sh and mtgpu-setup's environment step: the client's folder and the server's in
    one pip command (pip finds mtgpu-client nowhere else), then the client again: pip removes its
    files when it replaces an mtgpu from before the split (whose RECORD names them too)."""
    from mtgpu.setup.environment import Environment
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    calls = []
    run = lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0, "", "")  # noqa: E731
    Environment(venv, "1.0", REPO, run).apply()
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    assert calls == [pip + [str(CLIENT), str(REPO)], pip + ["--no-deps", "--force-reinstall", str(CLIENT)]]
    script = (REPO / "scripts" / "install.sh").read_text()
    both = script.index('-m pip install -q ./clients/python ".$EXTRA"\n')
    assert script.index("-m pip install -q --no-deps --force-reinstall ./clients/python\n") > both

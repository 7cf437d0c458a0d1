"""mt-python: list and run the Python environments published on this node (PYTHON_INTERPRETERS).

    mt-python list [--json]
    mt-python run NAME -- ARGS...      e.g. mt-python run torch -- train.py --epochs 3

The interpreters come from the node's config (`MTGPU_CONFIG`, else /etc/mtgpu/mtgpu.toml).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Optional

import typer

from ..config import ConfigError, PythonInterpreter, load_config
from .common import EXIT_REFUSED, Col, err, fail, out, print_json, print_table

VERSION_TIMEOUT_S = 10.0
_VERSION_CODE = "import sys;print(sys.version)"

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)


def _interpreters() -> list[PythonInterpreter]:
    try:
        return list(load_config().PYTHON_INTERPRETERS)
    except ConfigError as e:
        fail(str(e), 1)


def executable_of(path: Path) -> Path | None:
    """The python executable of a PYTHON_INTERPRETERS entry: the path itself when it is a
    file, else DIR/bin/python3 or DIR/bin/python (an environment's directory)."""
    if path.is_dir():
        for candidate in ("bin/python3", "bin/python"):
            exe = path / candidate
            if os.access(exe, os.X_OK) and exe.is_file():
                return exe
        return None
    return path if path.exists() else None


def describe(interp: PythonInterpreter) -> dict:
    """name, path, executable, version (None when it cannot be asked) and error."""
    doc: dict = {"name": interp.name, "path": str(interp.path), "executable": None, "version": None, "error": None}
    exe = executable_of(interp.path)
    if exe is None:
        doc["error"] = f"{interp.path}: no python executable there"
        return doc
    doc["executable"] = str(exe)
    try:
        r = subprocess.run([str(exe), "-c", _VERSION_CODE], capture_output=True, text=True,
                           timeout=VERSION_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        doc["error"] = f"did not answer within {VERSION_TIMEOUT_S:g}s"
        return doc
    except OSError as e:
        doc["error"] = f"cannot run {exe}: {e.strerror or e}"
        return doc
    if r.returncode != 0:
        doc["error"] = f"exited with status {r.returncode}: {(r.stderr or '').strip()[-300:]}"
    else:
        doc["version"] = r.stdout.strip().splitlines()[0] if r.stdout.strip() else None
    return doc


@app.command("list")
def list_(as_json: bool = typer.Option(False, "--json", help="one JSON document on stdout")) -> None:
    """Show the published interpreters with their versions."""
    docs = [describe(i) for i in _interpreters()]
    if as_json:
        print_json(docs)
        return
    if not docs:
        out.print("no Python interpreters are published on this node (PYTHON_INTERPRETERS is empty)")
        return
    print_table(*interpreters_table(docs), has_wide=False)


def interpreters_table(docs: list[dict]) -> tuple[list[Col], list[tuple[str, ...]]]:
    """`mt-python list`'s table: an interpreter that does not run says why in VERSION (wrapped)."""
    return [Col("NAME"), Col("VERSION", wrap=True), Col("PATH")], \
        [(d["name"], (d["version"] or "").split()[0] if d["version"] else d["error"], d["path"]) for d in docs]


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    name: str = typer.Argument(..., help="the interpreter's name, as `mt-python list` shows it"),
    args: Optional[list[str]] = typer.Argument(None, help="arguments for python, after --"),
) -> None:
    """Run a published interpreter: `mt-python run NAME -- ARGS` (replaces this process)."""
    interpreters = _interpreters()
    by_name = {i.name: i for i in interpreters}
    interp = by_name.get(name)
    if interp is None:
        if not interpreters:
            fail(f"no interpreter named {name!r}: none are published on this node (PYTHON_INTERPRETERS is empty)",
                 EXIT_REFUSED)
        fail(f"no interpreter named {name!r}; the published interpreters are: {', '.join(sorted(by_name))}",
             EXIT_REFUSED)
    exe = executable_of(interp.path)
    if exe is None:
        fail(f"interpreter {name!r}: no python executable at {interp.path}", 1)
    argv = list(args or [])
    if argv[:1] == ["--"]:
        argv = argv[1:]
    try:
        os.execv(str(exe), [str(exe), *argv])
    except OSError as e:
        err.print(f"error: cannot run {exe}: {e.strerror or e}", markup=False)
        raise SystemExit(1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

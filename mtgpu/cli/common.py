"""What every CLI shares: printing JSON, rich tables and `show`'s fields, and exiting with
the right status."""

from __future__ import annotations

import datetime as dt
import json
import sys
import webbrowser
from typing import Any, Callable, NoReturn, TypeVar

from rich.console import Console
from rich.table import Table

from ..client.local import ClientError
from ..model.units import format_size

EXIT_REFUSED = 2
T = TypeVar("T")

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def print_warnings(result: dict) -> None:
    """The submission's warnings on stderr, one line each (#SBATCH options with no effect
    here, conflicts between #MTGPU and #SBATCH lines, the disk quota)."""
    for line in ([result["warning"]] if result.get("warning") else []) + list(result.get("warnings") or ()):
        err.print(f"warning: {line}", markup=False, soft_wrap=True)


def print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def fail(e: ClientError | str, status: int | None = None) -> NoReturn:
    message = str(e)
    if status is None:
        status = EXIT_REFUSED if isinstance(e, ClientError) and (e.refused or e.status == 422) else 1
    err.print(f"error: {message}", markup=False)
    raise SystemExit(status)


def request(connect: Callable[[], Any], action: Callable[[Any], T]) -> T:
    """Open a client with `connect()`, run one `action(client)` and close it; a refused
    request or an unreachable node ends the command with the message (see fail)."""
    try:
        with connect() as client:
            return action(client)
    except ClientError as e:
        fail(e)


def when(ts: float | None) -> str:
    if not ts:
        return "-"
    return dt.datetime.fromtimestamp(ts).strftime("%m-%d %H:%M:%S")


def size(n: int | float | None) -> str:
    return "-" if n is None else format_size(n)


def gpu_text(job: dict) -> str:
    gpus = job.get("gpus") or []
    if not gpus:
        return "-"
    return ",".join(f"{g['node']}:{g['index']}" + ("" if g["fraction"] >= 1 else f"({g['fraction']:.2g})") for g in gpus)


def print_jobs_table(jobs: list[dict], tenant: bool = False) -> None:
    """The table of jobs every CLI prints (`tenant` adds the owner's column, for admins)."""
    columns = ["ID"] + (["TENANT"] if tenant else []) + ["NAME", "STATE", "NODES", "GPUS", "SUBMITTED", "EXIT", "REASON"]
    table = Table(*columns, box=None)
    for j in jobs:
        table.add_row(str(j["id"]), *([j["tenant"]] if tenant else []), j["name"], j["state"],
                      ",".join(j["nodes"]) or "-", gpu_text(j), when(j["submitted_at"]),
                      "-" if j["exit_code"] is None else str(j["exit_code"]), j["reason"] or "")
    out.print(table)


def history_line(h: dict) -> str:
    """One attempt of a job's (or a workspace's) history: where it ran and how it ended,
    and, when its member reported later that the attempt also ran there to the end (after
    it was requeued), how it ended there."""
    line = f"attempt {h['attempt']} on {','.join(h['nodes']) or '-'}: {h['outcome']}"
    late = h.get("late")
    if late and not late["taken"]:
        line += (f"; its member reported later that it also ran there to the end ({late['state']}"
                 + (f", exit {late['exit_code']}" if late["exit_code"] is not None else "") + ")")
    return line


def print_fields(rows: list[tuple[str, Any]], history: list[dict] | None = None) -> None:
    """`show`'s layout: one `name  value` line per row, then a `history` line per attempt."""
    for k, v in [*rows, *(("history", history_line(h)) for h in history or [])]:
        out.print(f"{k:>10}  {v}", markup=False)


def give_link(url: str, sentence: str, print_url: bool, open_browser: bool) -> None:
    """A link for a person (the web dashboard's): alone on stdout with `print_url` (for
    scripts), else within `sentence`; and opened in the default web browser unless not wanted."""
    if print_url:
        print(url, flush=True)
    else:
        out.print(sentence, markup=False)
        sys.stdout.flush()
    if open_browser:
        try:
            opened = webbrowser.open(url, new=2)
        except webbrowser.Error:
            opened = False
        if not opened:
            err.print("no web browser could be started here: open the link in one yourself", markup=False)

"""What every CLI shares: printing JSON, tables and `show`'s fields, and exiting with the
right status.

Our text is never read as rich markup or emoji codes (a job name `[bold]`, an error's
`(h:m:s)` print as they are). Tables (`Col`, `print_table`) are laid out for the terminal
they print to: on a terminal narrower than their natural width they drop their least
needed columns (said under the table: `--wide` or a pipe shows them) and wrap only the
column made to wrap; through a pipe (not a terminal) nothing is cut or wrapped, one line a
row, as kubectl and squeue do."""

from __future__ import annotations

import datetime as dt
import io
import json
import re
import sys
import textwrap
import webbrowser
from dataclasses import dataclass
from typing import Any, Callable, NoReturn, Sequence, TypeVar

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..client.local import ClientError
from ..model.units import format_size

EXIT_REFUSED = 2
T = TypeVar("T")

# markup and emoji off: what we print is our text (names, reasons, errors), never rich's codes
out = Console(highlight=False, soft_wrap=True, markup=False, emoji=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False, emoji=False)
WRAP_MIN = 30  # a wrapping column (a reason) is given at least this, else columns are dropped
UNLIMITED = 100_000  # the width a table is laid out in when nothing may be cut (a pipe, --wide)


@dataclass(frozen=True)
class Col:
    """A table's column: `drop` 0 is always shown; a narrow terminal drops the others,
    the highest `drop` first, until the rest fit; `wrap` is the one column that folds its
    text (a reason) rather than be dropped; `right` aligns numbers."""

    header: str
    drop: int = 0
    wrap: bool = False
    right: bool = False


def fit_table(cols: Sequence[Col], rows: Sequence[Sequence[str]], width: int | None) -> tuple[Table, list[str]]:
    """The table of these rows for `width` columns (None: no limit), and the headers of the
    columns it left out to fit. Columns are 2 apart; no column but a `wrap` one is ever
    cut or wrapped: one that does not fit is dropped instead (by its `drop`)."""
    natural = [max([cell_len(c.header)] + [max((cell_len(x) for x in str(r[i]).split("\n")), default=0)
                                            for r in rows]) for i, c in enumerate(cols)]
    keep = list(range(len(cols)))
    dropped: list[str] = []

    def need(idx: list[int]) -> int:
        return sum(natural[i] for i in idx if not cols[i].wrap) + sum(min(natural[i], WRAP_MIN) for i in idx
                                                                      if cols[i].wrap) + 2 * (len(idx) - 1)

    if width is not None:
        for i in sorted((i for i in keep if cols[i].drop), key=lambda i: (-cols[i].drop, -i)):
            if need(keep) <= width:
                break
            keep.remove(i)
            dropped.append(cols[i].header)
    table = Table(box=None, pad_edge=False, padding=(0, 1), show_edge=False)
    for i in keep:
        c = cols[i]
        table.add_column(c.header, justify="right" if c.right else "left", no_wrap=not c.wrap,
                         overflow="fold" if c.wrap else "ellipsis", min_width=natural[i] if not c.wrap else None)
    for r in rows:
        table.add_row(*(Text(str(r[i])) for i in keep))
    return table, [h for h in (c.header for c in cols) if h in dropped]


def table_width(wide: bool = False) -> int | None:
    """The width tables are laid out for: the terminal's, or no limit when stdout is not a
    terminal (a pipe, a file) or --wide asks for every column."""
    return None if wide or not out.is_terminal else out.width


def render_table(cols: Sequence[Col], rows: Sequence[Sequence[str]], width: int | None, has_wide: bool = True) -> str:
    """The text `print_table` prints at `width` (None: a pipe), without colour: what the
    golden tests compare."""
    table, dropped = fit_table(cols, rows, width)
    return plain(table, width) + ("\n" + wrapped(dropped_note(dropped, has_wide), width) if dropped else "")


def wrapped(text: str, width: int | None) -> str:
    """A line of ours folded at words to `width` (None: left whole, for a pipe); each
    paragraph (a line of `text`) on its own."""
    if width is None:
        return text
    return "\n".join("\n".join(textwrap.wrap(line, width, break_on_hyphens=False, break_long_words=False)
                                or [""]) for line in text.split("\n"))


def plain(renderable, width: int | None = None) -> str:
    """A table as text at `width` (None: no limit), no colour, no trailing blanks."""
    console = Console(file=io.StringIO(), width=width or UNLIMITED, highlight=False, markup=False, emoji=False,
                      color_system=None, soft_wrap=False)
    console.print(renderable)
    return "\n".join(line.rstrip() for line in console.file.getvalue().splitlines())


def dropped_note(dropped: list[str], has_wide: bool = True) -> str:
    """The line under a table that left columns out (`has_wide`: the command has --wide)."""
    return f"(left out at this width: {', '.join(dropped)}; {'--wide or ' if has_wide else ''}a pipe shows them)"


def print_table(cols: Sequence[Col], rows: Sequence[Sequence[str]], wide: bool = False, has_wide: bool = True) -> None:
    """The rows as a table laid out for stdout (see fit_table and table_width); `has_wide`:
    the command has --wide (the note under a narrowed table says so)."""
    width = table_width(wide)
    if width is None:
        out.file.write(render_table(cols, rows, None) + "\n")
        out.file.flush()
        return
    table, dropped = fit_table(cols, rows, width)
    out.print(table, soft_wrap=False)
    if dropped:
        out.print(wrapped(dropped_note(dropped, has_wide), width))


_SENTENCE = re.compile(r"(?<=[.!?])\s")
_ASIDE = re.compile(r"\s*\([^()]*\)")


def summary_line(doc: str, limit: int = 60) -> str:
    """A command's summary in `--help`: one line, never a docstring's line break: its
    docstring's first sentence without its asides in parentheses; when still longer than
    `limit`, up to its first ':' or ';' (else ','), else cut at a word with '…'."""
    first = _SENTENCE.split(" ".join(doc.split()), 1)[0]
    while True:
        bare = _ASIDE.sub("", first)
        if bare == first:
            break
        first = bare
    first = " ".join(first.split())
    if len(first) <= limit:
        return first
    for mark in (": ", "; ", ", "):
        head = first.split(mark, 1)[0]
        if mark in first and len(head) <= limit:
            return head
    return first[:limit - 1].rsplit(" ", 1)[0] + "…"


def one_line_summaries(app) -> None:
    """Give every command of a typer app (and of its sub-apps) a one-line summary for the
    command lists of `--help` (typer prints the docstring's first paragraph with its line
    breaks, cutting sentences mid-way at 80 columns); `COMMAND --help` keeps the whole text."""
    for info in app.registered_commands:
        doc = info.help or (info.callback.__doc__ if info.callback else None)
        if doc and not info.short_help:
            info.short_help = summary_line(doc)
    for group in app.registered_groups:
        one_line_summaries(group.typer_instance)


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


JOB_COLS = (Col("ID", right=True), Col("TENANT"), Col("NAME"), Col("STATE"), Col("NODES", drop=2),
            Col("GPUS", drop=3), Col("SUBMITTED", drop=4), Col("EXIT", drop=1, right=True), Col("REASON", wrap=True))


def jobs_table_rows(jobs: list[dict], tenant: bool = False) -> tuple[list[Col], list[tuple[str, ...]]]:
    """The jobs table's columns and rows (`tenant` adds the owner's column, for admins).
    Narrow, it drops SUBMITTED, then GPUS, then NODES, then EXIT; REASON wraps."""
    cols = [c for c in JOB_COLS if tenant or c.header != "TENANT"]
    rows = [(str(j["id"]), *([j["tenant"]] if tenant else []), j["name"], j["state"], ",".join(j["nodes"]) or "-",
             gpu_text(j), when(j["submitted_at"]), "-" if j["exit_code"] is None else str(j["exit_code"]),
             j["reason"] or "") for j in jobs]
    return cols, rows


def print_jobs_table(jobs: list[dict], tenant: bool = False, wide: bool = False, has_wide: bool = False) -> None:
    """The table of jobs every CLI prints (`tenant` adds the owner's column, for admins)."""
    print_table(*jobs_table_rows(jobs, tenant), wide=wide, has_wide=has_wide)


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

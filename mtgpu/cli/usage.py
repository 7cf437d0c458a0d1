"""`mtgpu-admin usage` and `mt-job usage`: their flags' checks and the sreport-like tables
(docs/ACCOUNTING.md)."""

from __future__ import annotations

from typing import Optional

import typer

from ..model.units import format_duration
from ..model.usage import DAY_FORMAT, UsageError, parse_day
from ..model.usage_report import check_by
from .common import Col, fail, out, print_json, print_table, table_width, wrapped

SINCE_HELP = f"first day counted, {DAY_FORMAT} (UTC; a job counts on the day it ended); default: the oldest kept"
UNTIL_HELP = f"last day counted (included), {DAY_FORMAT} (UTC); default: the newest"


def since_option() -> Optional[str]:
    return typer.Option(None, "--since", metavar=DAY_FORMAT, help=SINCE_HELP)


def until_option() -> Optional[str]:
    return typer.Option(None, "--until", metavar=DAY_FORMAT, help=UNTIL_HELP)


def checked(since: str | None, until: str | None, by: str, allowed: tuple[str, ...]) -> None:
    """Refuse a bad flag before asking the node, naming the flag, the value and the format."""
    try:
        if since is not None:
            parse_day(since, "--since")
        if until is not None:
            parse_day(until, "--until")
        check_by(by, allowed)
    except UsageError as e:
        fail(str(e), 2)
    if since is not None and until is not None and since > until:
        fail(f"--since {since} is after --until {until}: give a range that starts before it ends", 2)


def _hours(s: float) -> str:
    return f"{s / 3600.0:.2f}"


def _wait(row: dict, p: int) -> str:
    v = row.get(f"wait_p{p}_s")
    if v is None:
        return "-"
    return format_duration(v) if row.get("wait_exact") else f"<={format_duration(v)}"


WIDE_HELP = "every column even on a narrow terminal (a pipe always gets them all)"


def wide_option() -> bool:
    return typer.Option(False, "--wide", help=WIDE_HELP)


def report_tables(report: dict) -> list[tuple[list[Col], list[tuple[str, ...]]]]:
    """The report's tables: per group, and (when known) the wait per GPU model. Narrow
    (80 columns), the first drops BY MODEL, then RUN HOURS and WAIT HOURS, then
    MEM GIB-HOURS and CPU-HOURS; the group, JOBS, GPU-HOURS and the wait percentiles stay."""
    by = report["by"]
    by_model = by == "model"
    cols = [Col(by.upper()), Col("JOBS", right=True), Col("GPU-HOURS", right=True)] + \
        ([] if by_model else [Col("BY MODEL", drop=5)]) + \
        [Col("CPU-HOURS", drop=1, right=True), Col("MEM GIB-HOURS", drop=2, right=True),
         Col("RUN HOURS", drop=4, right=True), Col("WAIT HOURS", drop=3, right=True), Col("WAIT P50", right=True),
         Col("P90", right=True), Col("P99", right=True)]
    rows = []
    for label, row in [(r[by], r) for r in report["rows"]] + [("TOTAL", report["totals"])]:
        models = ", ".join(f"{m} {_hours(s)}" for m, s in row["gpu_s_by_model"].items()) or "-"
        rows.append((str(label), f"{row['jobs']:g}", _hours(row["gpu_s"]), *([] if by_model else [models]),
                     _hours(row["cpu_s"]), _hours(row["mem_byte_s"] / 1024**3), _hours(row["run_s"]),
                     _hours(row["wait_s"]), _wait(row, 50), _wait(row, 90), _wait(row, 99)))
    tables = [(cols, rows)]
    if report["wait_by_model"]:
        waits = [Col("MODEL"), Col("JOBS", right=True), Col("P50", right=True), Col("P90", right=True),
                 Col("P99", right=True)]
        tables.append((waits, [(w["model"], str(w["wait_samples"]), _wait(w, 50), _wait(w, 90), _wait(w, 99))
                               for w in report["wait_by_model"]]))
    return tables


def report_heads(report: dict, what: str) -> list[str]:
    """The line above each of report_tables' tables."""
    span = f"{report['since'] or 'the oldest kept'} .. {report['until'] or 'the newest'}"
    heads = [f"{what}, days {span} (UTC; a job counts on the day it ended), by {report['by']}"]
    if report["wait_by_model"]:
        approx = any(not w["wait_exact"] for w in report["wait_by_model"])
        heads.append("\nwait from submission to first start, per GPU model" + (
            " (<=: from the daily summary of forgotten jobs, the upper edge of a histogram bucket)" if approx else "")
            + ":")
    return heads


def print_report(report: dict, json_out: bool, what: str, wide: bool = False, has_wide: bool = True) -> None:
    """The report as JSON or as its tables (`has_wide`: the command has --wide)."""
    if json_out:
        print_json(report)
        return
    width = table_width(wide)
    for head, (cols, rows) in zip(report_heads(report, what), report_tables(report)):
        out.print(wrapped(head, width))
        print_table(cols, rows, wide=wide, has_wide=has_wide)

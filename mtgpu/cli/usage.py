"""`mtgpu-admin usage` and `mt-job usage`: their flags' checks and the sreport-like tables
(docs/ACCOUNTING.md)."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from ..model.units import format_duration
from ..model.usage import DAY_FORMAT, UsageError, parse_day
from ..model.usage_report import check_by
from .common import fail, out, print_json

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


def print_report(report: dict, json_out: bool, what: str) -> None:
    if json_out:
        print_json(report)
        return
    by = report["by"]
    span = f"{report['since'] or 'the oldest kept'} .. {report['until'] or 'the newest'}"
    out.print(f"{what}, days {span} (UTC; a job counts on the day it ended), by {by}", markup=False)
    by_model = by == "model"
    columns = [by.upper(), "JOBS", "GPU-HOURS"] + ([] if by_model else ["BY MODEL"]) + \
        ["CPU-HOURS", "MEM GIB-HOURS", "RUN HOURS", "WAIT HOURS", "WAIT P50", "P90", "P99"]
    table = Table(*columns, box=None)
    for label, row in [(r[by], r) for r in report["rows"]] + [("TOTAL", report["totals"])]:
        models = ", ".join(f"{m} {_hours(s)}" for m, s in row["gpu_s_by_model"].items()) or "-"
        table.add_row(label, f"{row['jobs']:g}", _hours(row["gpu_s"]), *([] if by_model else [models]),
                      _hours(row["cpu_s"]), _hours(row["mem_byte_s"] / 1024**3), _hours(row["run_s"]),
                      _hours(row["wait_s"]), _wait(row, 50), _wait(row, 90), _wait(row, 99))
    out.print(table)
    if report["wait_by_model"]:
        approx = any(not w["wait_exact"] for w in report["wait_by_model"])
        out.print("\nwait from submission to first start, per GPU model" + (
            " (<=: from the daily summary of forgotten jobs, the upper edge of a histogram bucket)" if approx else "")
            + ":", markup=False)
        waits = Table("MODEL", "JOBS", "P50", "P90", "P99", box=None)
        for w in report["wait_by_model"]:
            waits.add_row(w["model"], str(w["wait_samples"]), _wait(w, 50), _wait(w, 90), _wait(w, 99))
        out.print(waits)

"""What every CLI shares: printing JSON or rich tables, and exiting with the right status."""

from __future__ import annotations

import datetime as dt
import json
import sys
from typing import Any, NoReturn

from rich.console import Console

from ..client.local import ClientError
from ..model.units import format_size

EXIT_REFUSED = 2

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def fail(e: ClientError | str, status: int | None = None) -> NoReturn:
    message = str(e)
    if status is None:
        status = EXIT_REFUSED if isinstance(e, ClientError) and (e.refused or e.status == 422) else 1
    err.print(f"error: {message}", markup=False)
    raise SystemExit(status)


def when(ts: float | None) -> str:
    if not ts:
        return "-"
    return dt.datetime.fromtimestamp(ts).strftime("%m-%d %H:%M:%S")


def size(n: int | float | None) -> str:
    return "-" if n is None else format_size(n)

"""`logs` as mt-job and remotegpu-cli both offer it: a job's output as raw bytes on
stdout, whole or its first/last N lines, optionally followed."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional

import typer

from ..client.errors import ClientError
from ..client.logs import LogReader, copy_log
from .common import err, fail

LOGS_HELP = "\n\n".join((  # one line per paragraph: the help reflows it to the terminal
    "Print a job's output (stdout and stderr): all of it, byte for byte.",
    "However large, the log is streamed in bounded memory, also when it lives on another member of the cluster. "
    "--head N prints its first N lines, --tail N its last N lines (as head -n and tail -n count them); -f keeps "
    "printing what the job writes until it has ended (--tail N -f: the last N lines, then follow, like "
    "tail -n N -f).",
    "Without -f the log is printed as it is at that moment. Nothing is ever cut without a word: if the log cannot "
    "be read to its end (the member that holds it is down, or went away mid-way), the command says so on stderr "
    "and exits with status 1.",
))

FOLLOW = typer.Option(False, "-f", "--follow", help="keep printing what the job writes until it has ended")
TAIL = typer.Option(None, "--tail", min=0, metavar="N", help="only the last N lines (with -f: then follow)")
HEAD = typer.Option(None, "--head", min=0, metavar="N", help="only the first N lines")
RANK = typer.Option(0, "--rank", min=0, metavar="R",
                    help="the log of rank R of a multi-node job (each rank writes its own; 0 is the job's)")


def print_log(connect: Callable[[], Any], job_id: int, follow: bool, head: Optional[int], tail: Optional[int],
              rank: int) -> None:
    """Copy the log to stdout as raw bytes; a log that cannot be read to its end ends the
    command with status 1 and the reason on stderr."""
    if head is not None and follow:
        fail("--head cannot follow a log (a head does not grow); use --tail N -f, or --head N alone", 2)
    if head is not None and tail is not None:
        fail("give --head N or --tail N, not both", 2)
    stdout = sys.stdout.buffer

    def write(data: bytes) -> None:
        stdout.write(data)
        stdout.flush()

    try:
        with connect() as client:
            copy_log(client, job_id, write, follow=follow, head=head, tail=tail, rank=rank,
                     notice=lambda text: err.print(f"note: {text}", markup=False))
    except ClientError as e:
        fail(e)
    except BrokenPipeError:
        # The reader went away (`mt-job logs 7 | head`): stop quietly, as cat would.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None


def follow_to_end(reader: LogReader, job_id: int) -> None:
    """Print a job's whole log as it is written, until the job has ended (submit --wait)."""
    stdout = sys.stdout.buffer
    copy_log(reader, job_id, lambda data: (stdout.write(data), stdout.flush()), follow=True,
             notice=lambda text: err.print(f"note: {text}", markup=False))

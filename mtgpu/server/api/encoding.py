"""Long lists of what the member built itself, encoded without holding the interpreter lock
for the whole list (issue 23).

A route declared `-> list[dict]` has FastAPI validate the whole list and encode it in two
calls into pydantic's Rust core, and a call into C is never interrupted by the switch
interval: for 4,000 jobs (3.5 MB) that was 12 + 45 ms on an idle core and up to 220 ms of
a 1 ms sleeper's lateness on a busy machine, during which the member's Raft, report and
loop threads wait. Here the list is encoded in chunks of CHUNK items, so the lock can change
hands between two chunks, and not validated (the server built every item itself). The bytes
are those FastAPI's own answer or starlette's JSONResponse would have been (a JSON list is
its items joined by commas; tests/unit/server/test_list_encoding.py checks it).

And such lists are built one at a time (in_turn): every thread that runs Python work is
one more the Raft thread queues behind for the lock, and on an oversubscribed machine a
holder may be off the CPU when asked to let go (a 1 ms sleeper beside 3 busy threads woke
240-340 ms late at the median, beside 1 thread 60-85 ms, load average 60 on 2 cores). Two
clients listing at once get the same answers, the second after the first.
"""

from __future__ import annotations

import asyncio
import json
from typing import Callable, Iterable

from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import TypeAdapter

CHUNK = 100  # items per call into the encoder: about 90 KB of jobs, under a millisecond

_ITEMS = TypeAdapter(list[dict])
_IN_TURN = asyncio.Lock()  # bound to the server's event loop at its first wait


async def in_turn(build: Callable[[], Response]) -> Response:
    """`build()` in a worker thread, after any other long list being built (waiting on the
    event loop: no worker thread is held while it waits)."""
    async with _IN_TURN:
        return await run_in_threadpool(build)


def chunks(items: list[dict]) -> Iterable[list[dict]]:
    return (items[i:i + CHUNK] for i in range(0, len(items), CHUNK))


def list_bytes(items: list[dict]) -> bytes:
    """As FastAPI's answer for a route declared `-> list[dict]` (pydantic's JSON)."""
    return b"[" + b",".join(_ITEMS.dump_json(part)[1:-1] for part in chunks(items)) + b"]"


def list_bytes_stdlib(items: list[dict]) -> bytes:
    """As starlette's JSONResponse(items) (the standard library's JSON, compact, UTF-8)."""
    parts = (json.dumps(part, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))[1:-1]
             for part in chunks(items))
    return ("[" + ",".join(parts) + "]").encode("utf-8")


def list_response(items: list[dict], stdlib: bool = False, headers: dict[str, str] | None = None) -> Response:
    """The answer for a list, encoded by list_bytes (or list_bytes_stdlib); call it off the event loop."""
    body = list_bytes_stdlib(items) if stdlib else list_bytes(items)
    return Response(content=body, media_type="application/json", headers=headers)

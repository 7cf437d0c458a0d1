"""What asyncio reports about a DirectLink event loop ("Task exception was never
retrieved", "Task was destroyed but it is pending!", an exception in a callback) becomes
one log line without a traceback: a failure of the network (UDP dropped between the
sites, a peer gone) is an event to note, never a trace on a user's terminal or a page of
a member's log (issue 26)."""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("mtgpu.directlink")


def one_line(context: dict) -> str:
    """The report as one line: its message, what it was about, the exception's type and text."""
    parts = [str(context.get("message") or "asyncio reported a problem")]
    job = context.get("task") or context.get("future") or context.get("handle")
    if isinstance(job, asyncio.Task):
        coro = job.get_coro()
        parts.append(f"in {getattr(coro, '__qualname__', None) or job.get_name()}")
    exc = context.get("exception")
    if exc is not None:
        parts.append(f"({type(exc).__name__}: {str(exc)[:200] or 'no detail'})")
    return " ".join(parts).replace("\n", " ")


def install(loop: asyncio.AbstractEventLoop, level: int = logging.INFO) -> None:
    """Report this loop's unhandled problems as one line at `level` (the client: DEBUG,
    so a user sees nothing; a member: one line in its log)."""
    loop.set_exception_handler(lambda _loop, context: log.log(level, "directlink: %s", one_line(context)))


async def cancel_rest(timeout_s: float = 2.0) -> None:
    """Cancel every other task of the running loop and give them `timeout_s` to end, so
    that closing the loop destroys no pending task."""
    me = asyncio.current_task()
    rest = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    for t in rest:
        t.cancel()
    if rest:
        await asyncio.wait(rest, timeout=timeout_s)

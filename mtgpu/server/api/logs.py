"""Job logs as byte streams: a slice [start, end) of a log file, sent in bounded
chunks, with its bounds and the job's state in the headers.

The end is the file's size when the request came, and `final` says whether the job
had already ended before that size was read: a final answer holds the whole log.
A reader that wants more (`mt-job logs -f`) asks again from `end`. The answer's
Content-Length is end - start, so a stream that breaks off (the member holding the
log went away mid-way) is seen as incomplete by the client, never as the whole log.

A log lives on the member that ran the job (rank R of a gang job on its R-th
member); another member relays it, streamed, through the signed member-to-member route.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Awaitable, BinaryIO, Callable

from fastapi.concurrency import run_in_threadpool
from starlette.responses import StreamingResponse

from ...model import logstream
from ..cluster.errors import LogUnavailable
from .identity import Caller
from .service import LogSource, MemberService, ServiceError

CHUNK_BYTES = 256 * 1024
TAIL_BLOCK_BYTES = 64 * 1024



def tail_start(f: BinaryIO, end: int, lines: int, block_bytes: int = TAIL_BLOCK_BYTES) -> int:
    """Where the last `lines` lines of the first `end` bytes of `f` begin, as `tail -n`
    counts them: a last line without its newline is a line too. Reads backwards in
    blocks, so memory stays bounded whatever the size."""
    if lines <= 0 or end <= 0:
        return end
    f.seek(end - 1)
    # The newline that ends the last line does not begin another one.
    newlines_wanted = lines + 1 if f.read(1) == b"\n" else lines
    pos = end
    while pos > 0:
        size = min(block_bytes, pos)
        pos -= size
        f.seek(pos)
        block = f.read(size)
        i = len(block)
        while (i := block.rfind(b"\n", 0, i)) >= 0:
            newlines_wanted -= 1
            if newlines_wanted == 0:
                return pos + i + 1
    return 0


def open_file_slice(path: Path | None, offset: int, tail_lines: int | None) -> tuple[BinaryIO | None, int, int]:
    """(the open file, or None while there is none, start, end). An `offset` past the
    end (the log was begun again, on another member) gives start = end = its size."""
    if path is None:
        return None, 0, 0
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return None, 0, 0
    try:
        end = os.fstat(f.fileno()).st_size
        start = min(offset, end)
        if tail_lines is not None:
            start = max(start, tail_start(f, end, tail_lines))
        f.seek(start)
        return f, start, end
    except BaseException:
        f.close()
        raise


async def _file_chunks(f: BinaryIO | None, start: int, end: int) -> AsyncIterator[bytes]:
    left = end - start
    while left > 0:
        data = await run_in_threadpool(f.read, min(CHUNK_BYTES, left))
        if not data:
            raise OSError(f"the log {f.name} shrank while it was sent ({left} bytes missing)")
        left -= len(data)
        yield data


@dataclass
class LogSlice:
    """Bytes [start, end) of a job's log, sent as `chunks`; `close` frees what the
    slice holds (an open file, a connection to another member)."""

    start: int
    end: int
    final: bool
    state: str
    node: str
    chunks: AsyncIterator[bytes]
    close: Callable[[], Awaitable[None]]


async def local_slice(source: LogSource, offset: int, tail_lines: int | None) -> LogSlice:
    f, start, end = await run_in_threadpool(open_file_slice, source.path, offset, tail_lines)

    async def close() -> None:
        if f is not None:
            f.close()

    return LogSlice(start, end, source.final, source.state, source.node, _file_chunks(f, start, end), close)


def _check_bounds(offset: int, tail_lines: int | None, rank: int) -> None:
    if offset < 0 or rank < 0 or (tail_lines is not None and tail_lines < 0):
        raise ServiceError(422, f"offset ({offset}), tail ({tail_lines}) and rank ({rank}) must be 0 or more",
                           refused=True)


async def job_log(service: MemberService, caller: Caller, job_id: int, offset: int = 0,
                  tail_lines: int | None = None, rank: int = 0) -> LogSlice:
    """The caller's job's log from `offset` (or its last `tail_lines` lines), from
    this member's disk or relayed from the member that holds it."""
    _check_bounds(offset, tail_lines, rank)
    source = await run_in_threadpool(service.log_source, caller, job_id, rank)
    link = service.member.link
    if source.node == service.node_name or not link.is_cluster:
        return await local_slice(source, offset, tail_lines)
    try:
        remote = await link.open_log(source.node, job_id, offset, tail_lines, rank)
    except LogUnavailable as e:
        raise ServiceError(502, f"the log of job {job_id} is on member {source.node}, which could not be read: "
                                f"{e}; nothing of it was sent: try again when {source.node} answers") from None
    return LogSlice(remote.start, remote.end, source.final, source.state, source.node, remote.chunks, remote.close)


async def member_log(service: MemberService, job_id: int, offset: int, tail_lines: int | None,
                     rank: int) -> LogSlice:
    """For another member: the log as this member has it (never relayed further). A job
    this member's replica does not know yet cannot have run here: its log is empty."""
    _check_bounds(offset, tail_lines, rank)
    job = service.store.machine.jobs.get(job_id)
    if job is None:
        source = LogSource(job_id, rank, service.node_name, None, False, "unknown")
    else:
        source = LogSource(job_id, rank, service.node_name, service.state_dir / job.rank_log_path(rank),
                           job.state.final, job.state.value)
    return await local_slice(source, offset, tail_lines)


class LogResponse(StreamingResponse):
    """A log slice as raw bytes with an exact Content-Length; what the slice holds is
    released when the answer ends, also when the client went away mid-way."""

    media_type = "application/octet-stream"

    def __init__(self, piece: LogSlice) -> None:
        super().__init__(piece.chunks, headers={
            "content-length": str(piece.end - piece.start),
            logstream.START: str(piece.start), logstream.END: str(piece.end),
            logstream.FINAL: "1" if piece.final else "0", logstream.STATE: piece.state, logstream.NODE: piece.node,
        })
        self._close = piece.close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._close()

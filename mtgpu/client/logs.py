"""Reading a job's log as raw bytes in bounded memory: all of it, its first or last N
lines, or following it until the job has ended. The node answers a slice of the log
with its exact length (mtgpu.model.logstream); a slice that arrives short is an
error, never taken for the whole log."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterator, Protocol

import httpx

from ..model import logstream
from .errors import ClientError, answer

CHUNK_BYTES = 256 * 1024
FOLLOW_POLL_S = 0.2


@dataclass
class LogPart:
    """One answer: bytes [start, end) of the log, as `chunks`."""

    job_id: int
    start: int
    end: int
    final: bool
    state: str
    node: str
    chunks: Iterator[bytes]


class LogReader(Protocol):
    """What LocalClient and RemoteClient offer: one slice of a job's log, streamed."""

    def open_log(self, job_id: int, offset: int = 0, tail: int | None = None,
                 rank: int = 0) -> ContextManager[LogPart]: ...


@contextlib.contextmanager
def stream_log(open_stream: Callable[[], ContextManager[httpx.Response]], job_id: int,
               unreachable: Callable[[Exception], ClientError]) -> Iterator[LogPart]:
    """Open one streamed answer of the log route; its chunks raise ClientError if the
    stream breaks off before the announced length."""
    try:
        with open_stream() as r:
            if r.status_code >= 400:
                r.read()
                if r.status_code == 404 and _is_route_not_found(r):
                    raise ClientError("this node does not serve log streams: it runs an older mtgpu than this "
                                      "client; upgrade the node (or use the client that came with it)", status=404)
                answer(r)
            try:
                start, end = int(r.headers[logstream.START]), int(r.headers[logstream.END])
            except (KeyError, ValueError):
                raise ClientError(f"the node's answer for the log of job {job_id} has no valid "
                                  f"{logstream.START}/{logstream.END} headers") from None
            yield LogPart(job_id, start, end, r.headers.get(logstream.FINAL) == "1",
                          r.headers.get(logstream.STATE, ""), r.headers.get(logstream.NODE, ""),
                          _checked_chunks(r, job_id, start, end))
    except httpx.HTTPError as e:
        raise unreachable(e) from None


def _is_route_not_found(r: httpx.Response) -> bool:
    try:
        body = r.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("detail") == "Not Found" and "error" not in body


def _checked_chunks(r: httpx.Response, job_id: int, start: int, end: int) -> Iterator[bytes]:
    received = 0
    try:
        for data in r.iter_raw(CHUNK_BYTES):
            received += len(data)
            yield data
    except httpx.HTTPError as e:
        raise _broke_off(job_id, start, end, received, f"{type(e).__name__}: {e}") from None
    if received != end - start:
        raise _broke_off(job_id, start, end, received, "the stream ended early")


def _broke_off(job_id: int, start: int, end: int, received: int, why: str) -> ClientError:
    return ClientError(f"the log of job {job_id} broke off after byte {start + received} of {end} ({why}); "
                       "what was printed is incomplete: run the command again")


class HeadCut:
    """Lets bytes through up to and including the `lines`-th newline, as `head -n`."""

    def __init__(self, lines: int) -> None:
        self.left = lines

    @property
    def done(self) -> bool:
        return self.left <= 0

    def take(self, data: bytes) -> bytes:
        if self.done:
            return b""
        i = -1
        for _ in range(self.left):
            i = data.find(b"\n", i + 1)
            if i < 0:
                self.left -= data.count(b"\n")
                return data
        self.left = 0
        return data[:i + 1]


def copy_log(reader: LogReader, job_id: int, write: Callable[[bytes], object], *, follow: bool = False,
             head: int | None = None, tail: int | None = None, rank: int = 0,
             notice: Callable[[str], object] = lambda _: None,
             sleep: Callable[[float], object] = time.sleep) -> LogPart:
    """Write a job's log, or its first `head` / last `tail` lines, through `write`; with
    `follow`, keep reading until the job has ended and all of it was written. Returns the
    last answer (its `state` and `final`)."""
    cut = HeadCut(head) if head is not None else None
    offset, first = 0, True
    while True:
        with reader.open_log(job_id, offset, tail if first else None, rank) as part:
            if part.start < offset:
                notice(f"the log of job {job_id} is now {part.end} bytes, less than the {offset} already printed: "
                       "the job was started again (on another member?); its new log follows from the start")
                offset, first = 0, False
                continue
            for data in part.chunks:
                if cut is not None:
                    data = cut.take(data)
                if data:
                    write(data)
                if cut is not None and cut.done:
                    return part
            offset, first = part.end, False
        if not follow or part.final:
            return part
        sleep(FOLLOW_POLL_S)

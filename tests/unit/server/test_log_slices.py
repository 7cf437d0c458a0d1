"""Job logs as byte slices (server/api/logs.py): where the last N lines begin, and a
slice served as raw bytes with its bounds, whatever the chunk boundaries."""

import asyncio
import io
import re

import httpx
from fastapi import FastAPI
from hypothesis import given
from hypothesis import strategies as st

from mtgpu.model import logstream
from mtgpu.server.api import logs
from mtgpu.server.api.logs import LogResponse, local_slice, open_file_slice, tail_start
from mtgpu.server.api.service import LogSource


def lines_of(data: bytes) -> list[bytes]:
    """Lines as tail and head count them: each with its newline; a last one without."""
    return re.findall(rb"[^\n]*\n|[^\n]+$", data)


def reference_tail(data: bytes, n: int) -> bytes:
    return b"".join(lines_of(data)[-n:]) if n else b""


LOG_BYTES = st.lists(st.sampled_from([b"a", b"\n", "é".encode(), b"xyz\n", b"\n\n"]), max_size=60).map(b"".join)


@given(data=LOG_BYTES, n=st.integers(0, 30), block=st.integers(1, 9))
def test_tail_start_finds_the_last_n_lines_as_tail_does_for_any_block_size(data, n, block):
    start = tail_start(io.BytesIO(data), len(data), n, block_bytes=block)
    assert data[start:] == reference_tail(data, n)


def test_tail_start_counts_a_last_line_without_newline_as_a_line():
    data = b"one\ntwo\nthree"
    assert data[tail_start(io.BytesIO(data), len(data), 1):] == b"three"
    assert data[tail_start(io.BytesIO(data), len(data), 2):] == b"two\nthree"
    assert tail_start(io.BytesIO(data), len(data), 10) == 0
    assert tail_start(io.BytesIO(b""), 0, 3) == 0


def test_tail_start_looks_only_below_the_given_end():
    data = b"a\nb\nc\nlater\n"
    assert data[tail_start(io.BytesIO(data), 6, 2):6] == b"b\nc\n"


def test_a_missing_log_is_an_empty_slice_and_an_offset_past_the_end_answers_the_end(tmp_path):
    assert open_file_slice(tmp_path / "none.log", 0, None) == (None, 0, 0)
    path = tmp_path / "job.log"
    path.write_bytes(b"12345")
    f, start, end = open_file_slice(path, 99, None)
    f.close()
    assert (start, end) == (5, 5)


def serve(source: LogSource, offset: int = 0, tail: int | None = None) -> httpx.Response:
    app = FastAPI()

    @app.get("/log")
    async def log() -> LogResponse:
        return LogResponse(await local_slice(source, offset, tail))

    async def get() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.get("/log")

    return asyncio.run(get())


def test_a_slice_larger_than_many_chunks_arrives_byte_for_byte_with_its_bounds(tmp_path, monkeypatch):
    monkeypatch.setattr(logs, "CHUNK_BYTES", 1000)
    data = ("é" * 5000 + "\n").encode() * 3  # two-byte characters across every 1000-byte chunk boundary
    path = tmp_path / "job.log"
    path.write_bytes(data)
    r = serve(LogSource(1, 0, "m0", path, True, "completed"), offset=7)
    assert r.content == data[7:]
    assert r.headers["content-length"] == str(len(data) - 7)
    assert (r.headers[logstream.START], r.headers[logstream.END]) == ("7", str(len(data)))
    assert (r.headers[logstream.FINAL], r.headers[logstream.STATE], r.headers[logstream.NODE]) == \
        ("1", "completed", "m0")


def test_a_tail_slice_starts_at_the_last_lines(tmp_path):
    path = tmp_path / "job.log"
    path.write_bytes(b"1\n2\n3\n4\n")
    r = serve(LogSource(1, 0, "m0", path, False, "running"), tail=2)
    assert r.content == b"3\n4\n" and r.headers[logstream.START] == "4" and r.headers[logstream.FINAL] == "0"


def test_a_job_without_a_log_yet_answers_an_empty_slice(tmp_path):
    r = serve(LogSource(1, 0, "m0", None, False, "queued"))
    assert r.content == b"" and r.headers[logstream.END] == "0"

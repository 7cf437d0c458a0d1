"""Reading a job's log (client/logs.py): --head cuts after the N-th newline wherever the
chunks split; -f reads on until the job has ended; a stream that breaks off is an error."""

import contextlib
import re

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mtgpu.client.errors import ClientError
from mtgpu.client.logs import HeadCut, LogPart, copy_log, stream_log
from mtgpu.model import logstream


def reference_head(data: bytes, n: int) -> bytes:
    return b"".join(re.findall(rb"[^\n]*\n|[^\n]+$", data)[:n])


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    cuts = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(cuts, cuts[1:])]


@given(data=st.lists(st.sampled_from([b"ab", b"\n", b"\xc3\xa9"]), max_size=40).map(b"".join),
       n=st.integers(0, 25), cuts=st.lists(st.integers(0, 200), max_size=8))
def test_head_cut_keeps_the_first_n_lines_wherever_the_chunks_split(data, n, cuts):
    cut = HeadCut(n)
    out = b"".join(cut.take(chunk) for chunk in split_at(data, cuts))
    assert out == reference_head(data, n)


class GrowingLog:
    """A fake node: the log grows by one piece per request; the job ends with the last."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces
        self.data = b""
        self.requests: list[tuple[int, int | None]] = []

    @contextlib.contextmanager
    def open_log(self, job_id, offset=0, tail=None, rank=0):
        self.requests.append((offset, tail))
        if self.pieces:
            self.data += self.pieces.pop(0)
        start = min(offset, len(self.data))
        if tail is not None:
            lines = re.findall(rb"[^\n]*\n|[^\n]+$", self.data)
            start = max(start, len(self.data) - len(b"".join(lines[-tail:] if tail else [])))
        yield LogPart(job_id, start, len(self.data), not self.pieces, "completed" if not self.pieces else "running",
                      "m0", iter([self.data[start:]]))


def test_follow_reads_on_from_each_end_until_the_job_has_ended():
    node = GrowingLog([b"a\n", b"", b"b\n", b"c\n"])
    out = []
    last = copy_log(node, 1, out.append, follow=True, sleep=lambda s: None)
    assert b"".join(out) == b"a\nb\nc\n" and last.final
    assert [o for o, _ in node.requests] == [0, 2, 2, 4]


def test_tail_then_follow_prints_the_last_lines_then_what_comes():
    node = GrowingLog([b"1\n2\n3\n", b"4\n"])
    out = []
    copy_log(node, 1, out.append, follow=True, tail=1, sleep=lambda s: None)
    assert b"".join(out) == b"3\n4\n" and node.requests == [(0, 1), (6, None)]


def test_without_follow_one_answer_is_printed():
    node = GrowingLog([b"x\n", b"y\n"])
    out = []
    assert not copy_log(node, 1, out.append).final
    assert out == [b"x\n"] and len(node.requests) == 1


class RestartedLog(GrowingLog):
    """After the first answer, the job starts again elsewhere with a new, shorter log."""

    @contextlib.contextmanager
    def open_log(self, job_id, offset=0, tail=None, rank=0):
        if self.requests:
            self.data, self.pieces = b"new\n", []
        with super().open_log(job_id, offset, tail, rank) as part:
            yield part


def test_a_log_that_got_shorter_is_noted_and_read_again_from_its_start():
    node = RestartedLog([b"old log\n", b""])
    notes, out = [], []
    last = copy_log(node, 1, out.append, follow=True, notice=notes.append, sleep=lambda s: None)
    assert b"".join(out) == b"old log\nnew\n" and last.final
    assert [o for o, _ in node.requests] == [0, 8, 0] and "started again" in notes[0]


def serve(status: int, headers: dict, body: bytes):
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=headers, content=iter([body]))

    http = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://node")
    return lambda: http.stream("GET", "/v1/jobs/1/log/stream")


def unreachable(e):
    return ClientError(f"unreachable: {e}")


def test_a_stream_shorter_than_announced_is_an_error_never_the_whole_log():
    open_stream = serve(200, {logstream.START: "0", logstream.END: "10", logstream.FINAL: "1"}, b"12345")
    with pytest.raises(ClientError, match="broke off after byte 5 of 10"):
        with stream_log(open_stream, 1, unreachable) as part:
            b"".join(part.chunks)


def test_the_nodes_refusal_is_its_own_message_and_an_older_node_is_named():
    with pytest.raises(ClientError, match="no job 1 of yours"):
        with stream_log(serve(404, {}, b'{"error": "no job 1 of yours", "refused": false}'), 1, unreachable):
            pass
    with pytest.raises(ClientError, match="older mtgpu"):
        with stream_log(serve(404, {}, b'{"detail": "Not Found"}'), 1, unreachable):
            pass

"""Members' telemetry reports taken where the HTTP parser hands over a request.

Every member sends `POST /cluster/v1/report` once a second on its keep-alive
connection. Through uvicorn's ASGI cycle (a task, an event, the message dicts, the
middleware, a response object) one costs the scheduler about 0.3 ms of CPU: at a
thousand members that alone was a third of a core (bench/telemetry.py). This protocol
is uvicorn's httptools protocol with one change: a report is not given to the app. It is
checked and kept by `take_report` (the same function the route calls), and the answer is
written to the connection at once, with the headers every answer to a member carries
(the signed clock). A read that starts with a whole plain report (the usual case: a
member's request in one segment) is taken without the parser, whose dozen callbacks per
request cost more than the rest; a report that comes in pieces, or with chunked
encoding, `Expect:` or a repeated framing header, is collected from the parser's
callbacks instead. Everything else (other paths, a query string, a request pipelined
behind one the app still answers) goes to the app as before, where the route serves a
report too, with the same checks.
"""

from __future__ import annotations

import json
import logging

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ...state.store import ReplicationError
from ..cluster.errors import ClusterSetupError
from .service import ServiceError

log = logging.getLogger(__name__)

REPORT_PATH = "/cluster/v1/report"
REPORT_URL = REPORT_PATH.encode()
MAX_REPORT_BYTES = 1 << 20  # a member with 64 GPUs sends about 40 KB
REQUEST_LINE = b"POST " + REPORT_URL + b" HTTP/1.1\r\n"
# A report with one of these goes through the parser (it knows their rules); one with a
# repeated framing header too.
_PARSER_HEADERS = frozenset({"transfer-encoding", "expect", "upgrade"})
_SINGLE_HEADERS = frozenset({"content-length", "connection"})
_REASONS = {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 409: b"Conflict", 413: b"Payload Too Large",
            422: b"Unprocessable Entity", 500: b"Internal Server Error", 503: b"Service Unavailable"}


def take_report(link, path: str, body: bytes, headers) -> dict:
    """A member's telemetry report, once its signature is checked (401 else)."""
    why = link.signer.verify("POST", path, body, headers)
    if why:
        raise ServiceError(401, f"refused: {why}")
    try:
        payload = orjson.loads(body)
    except ValueError:  # what orjson refuses and json reads (NaN, integers over 64 bits): read as the route reads it
        try:
            payload = json.loads(body)
        except ValueError as e:
            raise ServiceError(400, f"a report's body must be JSON: {e}") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("node"), str):
        raise ServiceError(422, "a report is a JSON object with the member's name in \"node\"")
    return link.handle_report(payload)


def report_answer(link, path: str, body: bytes, headers) -> tuple[int, dict]:
    """(status, body) for a report: what the route answers, for every outcome."""
    try:
        return 200, take_report(link, path, body, headers)
    except ServiceError as e:
        return e.status, {"error": str(e), "refused": e.refused}
    except ReplicationError as e:
        return 503, {"error": str(e)}
    except ClusterSetupError as e:
        return 409, {"error": str(e)}


def report_protocol(link) -> type:
    """uvicorn's httptools protocol class for LISTEN, taking `link`'s reports itself."""

    class ReportProtocol(HttpToolsProtocol):
        _mid_message = False  # the parser holds part of a request

        def data_received(self, data: bytes) -> None:
            if not self._mid_message and data.startswith(REQUEST_LINE) and \
                    (self.cycle is None or self.cycle.response_complete) and not self.pipeline:
                self._unset_keepalive_if_required()
                data = self._take_whole_reports(data)
                if not data or self.transport.is_closing():
                    return
            super().data_received(data)

        def _take_whole_reports(self, data: bytes) -> bytes:
            """Answer each complete, plain report at the start of `data` (the usual case: a
            member's whole request in one read) without the parser; what is left (a part of
            a request, anything unusual) goes to the parser, which is between requests."""
            while data.startswith(REQUEST_LINE):
                end = data.find(b"\r\n\r\n")
                if end < 0:
                    break
                headers: dict[str, str] = {}
                for line in data[len(REQUEST_LINE):end].split(b"\r\n"):
                    name, sep, value = line.partition(b":")
                    key = name.lower().decode("latin-1")
                    if not sep or key in _PARSER_HEADERS or (key in _SINGLE_HEADERS and key in headers):
                        return data  # chunked, 100-continue, odd or repeated framing: the parser's
                    headers.setdefault(key, value.strip(b" \t").decode("latin-1"))
                length = headers.get("content-length", "")
                if not length.isdigit() or int(length) > MAX_REPORT_BYTES:
                    break
                stop = end + 4 + int(length)
                if len(data) < stop:
                    break  # the body comes in a later read
                self._take(data[end + 4:stop], headers, headers.get("connection", "").lower() != "close")
                data = data[stop:]
                if self.transport.is_closing():
                    return b""
            return data

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._mid_message = True
            self._report: list[bytes] | None = None
            self._report_size = 0

        def on_headers_complete(self) -> None:
            if (self.url == REPORT_URL and self.parser.get_method() == b"POST" and not self.expect_100_continue
                    and (self.cycle is None or self.cycle.response_complete) and not self.parser.should_upgrade()):
                self._report, self._report_size = [], 0
                return
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if self._report is None:
                super().on_body(body)
                return
            self._report_size += len(body)
            if self._report_size <= MAX_REPORT_BYTES:
                self._report.append(body)

        def on_message_complete(self) -> None:
            self._mid_message = False
            if self._report is None:
                super().on_message_complete()
                return
            chunks, self._report = self._report, None
            keep_alive = self.parser.should_keep_alive()
            headers: dict[str, str] = {}
            for name, value in self.headers:  # the first of a repeated header counts, as Headers.get has it
                headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
            if self._report_size > MAX_REPORT_BYTES:
                self._answer(413, {"error": f"a report of {self._report_size} bytes is over the "
                                            f"{MAX_REPORT_BYTES}-byte limit"}, {}, False)  # the rest is not read
                return
            self._take(b"".join(chunks), headers, keep_alive)

        def _take(self, body: bytes, headers: dict[str, str], keep_alive: bool) -> None:
            extra: dict[str, str] = {}
            try:
                status, content = report_answer(link, REPORT_PATH, body, headers)
                extra = link.signer.clock_headers(headers)
            except Exception:  # a bug answers 500 and is logged; the node goes on
                log.exception("a member's report could not be taken")
                status, content = 500, {"error": "internal error taking the report (see the node's log)"}
            self._answer(status, content, extra, keep_alive)

        def _answer(self, status: int, content: dict, extra: dict[str, str], keep_alive: bool) -> None:
            try:
                body = orjson.dumps(content)
            except TypeError:  # an integer over 64 bits, say: the slower encoder writes it
                body = json.dumps(content, ensure_ascii=False, separators=(",", ":"), default=str).encode()
            head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
                status, _REASONS.get(status, b""), len(body))
            for k, v in extra.items():
                head += b"%s: %s\r\n" % (k.lower().encode("latin-1"), v.encode("latin-1"))
            if not keep_alive:
                head += b"connection: close\r\n"
            self.transport.write(head + b"\r\n" + body)
            self.server_state.total_requests += 1
            if not keep_alive:
                self.transport.close()
            elif not self.transport.is_closing():
                self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                                    self.timeout_keep_alive_handler)

    return ReportProtocol


__all__ = ["MAX_REPORT_BYTES", "REPORT_PATH", "report_answer", "report_protocol", "take_report"]

"""LISTEN's protocol takes members' reports before the app (server/api/report_protocol.py):
a real uvicorn server on a loopback port, real keep-alive connections, the real signer.
Every outcome the route has, the protocol has too, on a connection that stays usable."""

from __future__ import annotations

import http.client
import json
import math
import socket
import threading
import time
from types import SimpleNamespace

import pytest
import uvicorn
from fastapi import FastAPI

from mtgpu.server.api.report_protocol import MAX_REPORT_BYTES, REPORT_PATH, report_protocol
from mtgpu.server.api.routes import _error_response, add_cluster_routes
from mtgpu.server.api.service import ServiceError
from mtgpu.server.cluster.errors import ClusterSetupError
from mtgpu.server.cluster.signer import H_CLOCK, H_CLOCK_SIG, Signer
from mtgpu.state.store import ReplicationError


class Link:
    """What the protocol and the routes use of a ClusterLink: the signer and the handlers."""

    is_cluster = True

    def __init__(self, signer: Signer) -> None:
        self.signer = signer
        self.taken: list[dict] = []
        self.fail: Exception | None = None
        self.answer_extra: dict = {}

    def handle_report(self, payload: dict) -> dict:
        if self.fail is not None:
            raise self.fail
        self.taken.append(payload)
        return {"ok": True, "commit": len(self.taken), **self.answer_extra}

    def raft_info(self) -> dict:
        return {"raft": "info"}

    handle_role = handle_join = handle_remove = raft_info


class Served:
    def __init__(self, link: Link) -> None:
        app = FastAPI()
        app.add_exception_handler(ServiceError, _error_response)
        add_cluster_routes(app, SimpleNamespace(member=SimpleNamespace(link=link), node_name="sched"))
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, http=report_protocol(link), log_level="warning",
                                                    access_log=False, lifespan="off"))
        self.server.install_signal_handlers = lambda: None
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


@pytest.fixture
def lab():
    """(the cluster signer, the link behind the protocol, the server)."""
    signer = Signer("s" * 48)
    link = Link(signer)
    served = Served(link)
    try:
        yield signer, link, served
    finally:
        served.close()


def post(conn, signer: Signer | None, body: bytes, path: str = REPORT_PATH, headers: dict | None = None):
    h = dict(headers or (signer.headers("POST", path, body, "m7") if signer else {}))
    conn.request("POST", path, body=body, headers=h)
    r = conn.getresponse()
    return r, json.loads(r.read() or b"null"), h


def report(seq: int) -> bytes:
    return json.dumps({"node": "m7", "cluster_id": "lab", "gpus": [], "seq": seq}).encode()


def test_reports_on_one_connection_are_taken_and_every_refusal_is_answered_there(lab):
    signer, link, served = lab
    conn = served.connection()
    r, body, sent = post(conn, signer, report(1))
    assert r.status == 200 and body == {"ok": True, "commit": 1}
    sock = conn.sock
    # the answer carries the signed clock, as every answer to a member does
    assert r.getheader(H_CLOCK) and r.getheader(H_CLOCK_SIG)
    assert signer.clock_headers(sent)[H_CLOCK_SIG] != ""
    r, body, _ = post(conn, signer, report(2))
    assert r.status == 200 and body["commit"] == 2 and conn.sock is sock  # kept alive
    assert [p["seq"] for p in link.taken] == [1, 2]

    r, body, _ = post(conn, signer, report(1), headers=sent)  # the first one again
    assert r.status == 401 and "replay" in body["error"]
    r, body, _ = post(conn, None, report(4))
    assert r.status == 401 and body["refused"] is False
    r, body, _ = post(conn, Signer("w" * 48), report(5))
    assert r.status == 401
    r, body, _ = post(conn, signer, b"{not json")
    assert r.status == 400 and "JSON" in body["error"]
    r, body, _ = post(conn, signer, b"[1, 2]")
    assert r.status == 422 and '"node"' in body["error"]
    # what a member's json.dumps writes and orjson refuses (NaN, an integer over 64 bits) is
    # still read, as the route reads it; an answer with such an integer is still written
    r, body, _ = post(conn, signer, json.dumps({"node": "m7", "seq": 3, "util": float("nan"), "big": 2**70}).encode())
    assert r.status == 200 and link.taken[-1]["big"] == 2**70 and math.isnan(link.taken.pop()["util"])
    link.answer_extra = {"big": 2**70}
    r, body, _ = post(conn, signer, report(3))
    assert r.status == 200 and body["big"] == 2**70 and link.taken.pop()["seq"] == 3
    link.answer_extra = {}
    for seq, (fail, status) in enumerate(((ReplicationError("not the scheduler"), 503),
                                          (ClusterSetupError("not ours"), 409), (RuntimeError("a bug"), 500))):
        link.fail = fail
        r, body, _ = post(conn, signer, report(60 + seq))
        assert r.status == status, (fail, r.status, body)
        assert ("a bug" not in body["error"]) if status == 500 else (str(fail) in body["error"])
    link.fail = None
    assert conn.sock is sock and [p["seq"] for p in link.taken] == [1, 2]

    # other requests on the same connection go to the app, before and after a report
    conn.request("GET", "/cluster/v1/raft", headers=signer.headers("GET", "/cluster/v1/raft", b"", "m7"))
    r = conn.getresponse()
    assert r.status == 200 and json.loads(r.read()) == {"raft": "info"}
    r, body, _ = post(conn, signer, report(7))
    assert r.status == 200 and link.taken[-1]["seq"] == 7 and conn.sock is sock
    # with a query string, the app's route takes it (the same checks)
    r, body, _ = post(conn, signer, report(8), path=REPORT_PATH + "?from=test")
    assert r.status == 200 and link.taken[-1]["seq"] == 8
    conn.request("GET", REPORT_PATH)
    r = conn.getresponse()
    assert r.status == 405, r.read()
    r.read()

    # a body over the limit is refused and the connection closed; a new one works
    big = json.dumps({"node": "m7", "pad": "x" * (MAX_REPORT_BYTES + 10)}).encode()
    r, body, _ = post(conn, signer, big)
    assert r.status == 413 and str(MAX_REPORT_BYTES) in body["error"] and r.getheader("connection") == "close"
    conn.close()
    conn = served.connection()
    r, body, _ = post(conn, signer, report(9))
    assert r.status == 200 and link.taken[-1]["seq"] == 9
    conn.close()


def test_a_connection_the_member_closes_after_a_report_is_closed_by_the_server_too(lab):
    signer, link, served = lab
    s = socket.create_connection(("127.0.0.1", served.port), timeout=10)
    head, body = raw_report(signer, 1, f"connection: close\r\ncontent-length: {len(report(1))}\r\n\r\n")
    s.sendall(head + body)
    got = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break  # the server closed it
        got += chunk
    s.close()
    assert got.startswith(b"HTTP/1.1 200 OK\r\n") and b"connection: close" in got and link.taken


def raw_report(signer: Signer, seq: int, extra: str = "", body: bytes | None = None) -> tuple[bytes, bytes]:
    body = report(seq) if body is None else body
    head = "".join(f"{k}: {v}\r\n" for k, v in signer.headers("POST", REPORT_PATH, body, "m7").items())
    return (f"POST {REPORT_PATH} HTTP/1.1\r\nhost: x\r\n{head}{extra}").encode(), body


def answers(s: socket.socket, count: int) -> list[tuple[int, dict]]:
    """`count` answers read off the socket, in order."""
    buf, out = b"", []
    deadline = time.monotonic() + 20
    while len(out) < count:
        assert time.monotonic() < deadline, (out, buf)
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            head = buf[:end].decode().lower()
            length = int(head.split("content-length: ")[1].split("\r\n")[0])
            if len(buf) >= end + 4 + length:
                body = buf[end + 4:end + 4 + length]
                out.append((int(head[9:12]), json.loads(body) if b"json" in buf[:end] else body.decode()))
                buf = buf[end + 4 + length:]
                continue
        chunk = s.recv(65536)
        assert chunk, ("closed", out)
        buf += chunk
    return out


def test_reports_in_pieces_chunked_pipelined_or_oddly_framed_are_taken_or_refused_as_the_parser_says(lab):
    signer, link, served = lab
    s = socket.create_connection(("127.0.0.1", served.port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # two whole reports in one write, then a third split inside its headers and its body
    a, body_a = raw_report(signer, 1, f"content-length: {len(report(1))}\r\n\r\n")
    b, body_b = raw_report(signer, 2, f"content-length: {len(report(2))}\r\n\r\n")
    s.sendall(a + body_a + b + body_b)
    assert answers(s, 2) == [(200, {"ok": True, "commit": 1}), (200, {"ok": True, "commit": 2})]
    c, body_c = raw_report(signer, 3, f"content-length: {len(report(3))}\r\n\r\n")
    for piece in (c[:40], c[40:] + body_c[:10], body_c[10:]):
        s.sendall(piece)
        time.sleep(0.05)
    assert answers(s, 1) == [(200, {"ok": True, "commit": 3})]
    # chunked: the parser's way, the same answer
    d, body_d = raw_report(signer, 4, "transfer-encoding: chunked\r\n\r\n")
    s.sendall(d + b"%x\r\n" % len(body_d) + body_d + b"\r\n0\r\n\r\n")
    assert answers(s, 1) == [(200, {"ok": True, "commit": 4})]
    # a report after the app answered another request on the connection
    s.sendall("GET /cluster/v1/raft HTTP/1.1\r\nhost: x\r\n".encode() + "".join(
        f"{k}: {v}\r\n" for k, v in signer.headers("GET", "/cluster/v1/raft", b"", "m7").items()).encode()
              + b"\r\n")
    e, body_e = raw_report(signer, 5, f"content-length: {len(report(5))}\r\n\r\n")
    time.sleep(0.2)
    s.sendall(e + body_e)
    assert answers(s, 2) == [(200, {"raft": "info"}), (200, {"ok": True, "commit": 5})]
    assert [p["seq"] for p in link.taken] == [1, 2, 3, 4, 5]
    # two different content-lengths: never taken, the parser refuses the request
    f, body_f = raw_report(signer, 6, f"content-length: {len(report(6))}\r\ncontent-length: 3\r\n\r\n")
    s.sendall(f + body_f)
    status = answers(s, 1)[0][0]
    assert status == 400 and [p["seq"] for p in link.taken] == [1, 2, 3, 4, 5]
    s.close()
    # a line that is no header: the parser's, which refuses it
    s = socket.create_connection(("127.0.0.1", served.port), timeout=10)
    g, body_g = raw_report(signer, 7, f"no colon here\r\ncontent-length: {len(report(7))}\r\n\r\n")
    s.sendall(g + body_g)
    assert answers(s, 1)[0][0] == 400 and [p["seq"] for p in link.taken] == [1, 2, 3, 4, 5]
    s.close()
    # names in any case, values with blanks around them, the first of a repeated signed header
    s = socket.create_connection(("127.0.0.1", served.port), timeout=10)
    h, body_h = raw_report(signer, 8, f"Content-Length:  {len(report(8))} \r\nX-Mtgpu-Node: other\r\n\r\n")
    s.sendall(h.replace(b"x-mtgpu-signature:", b"X-MTGPU-Signature:") + body_h)
    assert answers(s, 1) == [(200, {"ok": True, "commit": 6})] and link.taken[-1]["seq"] == 8
    s.close()

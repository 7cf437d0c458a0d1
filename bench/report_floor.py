"""The floor under bench/telemetry.py's scheduler CPU: what one HTTP request per member per
second costs on this machine before the scheduler does anything with it.

The same generator processes as telemetry.py (the same keep-alive connections, headers,
signed bodies and schedule) report to a server that does the least a server of these
reports can do: uvloop's event loop, httptools' parser (what uvicorn and the scheduler's
LISTEN use), `json.loads` of each body, and a fixed answer of the size and headers of the
scheduler's. No signature check, no state, no Raft, no placement. Its CPU share over the
window is the floor: the kernel's loopback TCP for both directions (a member's report and
its answer), the event loop and the parser.

With `--protocol` the server is the node's own LISTEN protocol instead
(server/api/report_protocol.py on uvicorn and uvloop, the cluster signer checking every
report and signing every answer's clock) over a link that keeps nothing and answers what
the scheduler answers: the protocol's cost, without `handle_report` and the node's other
threads.

    python bench/report_floor.py --members 1000 [--seconds 30] [--protocol] [--json]

`--json` keys: `members`, `server`, `floor_cpu_pct`, `floor_system_cpu_pct`, `report_rate_hz`, `seconds`.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.telemetry import cpu_s, start_generators  # noqa: E402

ANSWER_BODY = json.dumps({"ok": True, "voters": [f"127.0.0.1:{17000 + i}" for i in range(5)], "term": 2,
                          "commit": 123456, "majority_age_s": 0.012}, separators=(",", ":")).encode()
ANSWER = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
          b"x-mtgpu-clock: 1764640000.123\r\nx-mtgpu-clock-signature: %s\r\n\r\n" % (len(ANSWER_BODY), b"0" * 64)
          + ANSWER_BODY)


def serve(sock: socket.socket) -> None:
    """The floor server, on a listening socket, until SIGTERM."""
    import asyncio
    import signal

    import httptools
    import uvloop

    class Report(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            self.transport = transport
            self.parser = httptools.HttpRequestParser(self)
            self.body = []

        def data_received(self, data: bytes) -> None:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                self.transport.close()

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            json.loads(b"".join(self.body))
            self.body = []
            self.transport.write(ANSWER)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        server = await loop.create_server(Report, sock=sock, backlog=4096)
        print("serving", flush=True)
        await stop.wait()
        server.close()

    uvloop.run(main())


def serve_protocol(sock: socket.socket, secret: str) -> None:
    """The node's report protocol, over a link that keeps nothing, until SIGTERM."""
    import signal

    import uvicorn
    import uvloop
    from fastapi import FastAPI

    from mtgpu.server.api.report_protocol import report_protocol
    from mtgpu.server.cluster.signer import Signer

    answer = json.loads(ANSWER_BODY)

    class Link:
        signer = Signer(secret)

        def handle_report(self, payload: dict) -> dict:
            return answer

    server = uvicorn.Server(uvicorn.Config(FastAPI(), http=report_protocol(Link()), log_level="warning",
                                           access_log=False, lifespan="off"))
    server.install_signal_handlers = lambda: None

    async def main() -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: setattr(server, "should_exit", True))
        print("serving", flush=True)
        await server.serve(sockets=[sock])

    import asyncio
    uvloop.run(main())


def run(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="mtgpu-floor-"))
    procs: list[subprocess.Popen] = []  # the server, then (gens) the generators
    gens: list[subprocess.Popen] = []
    try:
        secret = work / "secret"
        secret.write_text(secrets.token_hex(24))
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        serve_args = ["--serve", str(sock.fileno())] + (["--secret", str(secret)] if args.protocol else [])
        server = subprocess.Popen([sys.executable, os.path.abspath(__file__), *serve_args],
                                  pass_fds=[sock.fileno()], stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
        procs.append(server)
        sock.close()
        if server.stdout.readline().strip() != "serving":
            raise SystemExit("the floor server did not start")
        start_generators(args.members, args.generators or max(1, -(-args.members // 2500)),
                         f"127.0.0.1:{port}", secret, work, gens)
        time.sleep(args.warmup)
        u0, s0 = cpu_s(server.pid)
        w0 = time.monotonic()
        time.sleep(args.seconds)
        u1, s1 = cpu_s(server.pid)
        w1 = time.monotonic()
        for p in gens:
            p.stdin.write("stop\n")
            p.stdin.flush()
        for p in gens:
            p.wait(timeout=120)
        answered = 0
        for f in work.glob("gen-*.json"):
            for rec in json.loads(f.read_text()).values():
                answered += sum(1 for t, a in zip(rec["sends"], rec["answers"]) if w0 <= t < w1 and a is not None)
    finally:
        for p in procs + gens:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(work, ignore_errors=True)
    seconds = w1 - w0
    return {"members": args.members, "server": "protocol" if args.protocol else "floor", "seconds": round(seconds, 1),
            "floor_cpu_pct": round(100 * ((u1 - u0) + (s1 - s0)) / seconds, 1),
            "floor_system_cpu_pct": round(100 * (s1 - s0) / seconds, 1),
            "report_rate_hz": round(answered / seconds, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--generators", type=int, default=0, help="generator processes (default 1 per 2,500)")
    ap.add_argument("--protocol", action="store_true",
                    help="serve with the node's report protocol and signer instead of the do-nothing server")
    ap.add_argument("--secret", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve is not None:
        sock = socket.socket(fileno=args.serve)
        if args.secret:  # the cluster secret's file: the node's protocol
            serve_protocol(sock, Path(args.secret).read_text().strip())
        else:
            serve(sock)
        return 0
    if not 1 <= args.members <= 60000 or args.seconds + args.warmup > 800:
        ap.error("--members 1..60000, and --seconds + --warmup at most 800")
    r = run(args)
    if args.json:
        print(json.dumps(r))
    else:
        what = ("the node's report protocol (signatures checked, nothing kept)" if args.protocol else
                "a do-nothing server (uvloop, httptools, json.loads, a fixed answer)")
        print(f"{r['members']:,} members reporting once a second to {what}: {r['report_rate_hz']:,.1f} reports/s "
              f"answered; its CPU "
              f"{r['floor_cpu_pct']}% of one core ({r['floor_system_cpu_pct']}% in the kernel) over {r['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Telemetry at scale (issue 15): N simulated members report to a real scheduler at 1 Hz.

Five real `mtgpu-server` processes on loopback form a cluster (the five voters a
cluster of five or more members has; 8 simulated H200s each, all drained so that
jobs go to the simulated members; [METRICS] on, read before and after the window).
N simulated members (8 simulated RTX 4090s each: less capable, so the voters stay the
voters) join the replicated state as a member does: their inventory is committed as
`node.register.v1` through a non-voting Raft replica this bench opens and then closes.
Each reports once a second on its own keep-alive connection (they come up a thousand
a second), through the real route: `POST /cluster/v1/report` on the scheduler's
LISTEN, signed with the cluster secret by cluster/signer.py as a member signs it,
with httpx's headers and `ClusterLink.report_once`'s payload (GPUs sampled by the
simulated backend). A temporary tenant submits one-GPU jobs through the members'
sockets meanwhile; the scheduler places them on simulated members (which never run
them).

Measured over `--seconds` after a warm-up: the scheduler process's CPU time
(/proc/PID/stat utime + stime, percent of one core; its event loop's thread apart),
the reports answered per second (the target is N/s; a shortfall is printed), and
report-to-visible: from the moment a member sends a report until its answer is back.
The scheduler stores a report in its view (`SchedulerRole.telemetry`, what its passes
and `GET /v1/nodes` read) before it answers, so the answer is the moment the report
is visible; a report not answered within 2 s (a member's timeout) counts as 2 s.
After the window, a check of that from the outside: reads of the scheduler's
`GET /v1/nodes` (GPU 0's utilization carries each member's report sequence number)
count reports answered before a read but not shown by it (must be 0), and the oldest
report sent before a read and not shown yet.

Not simulated: a simulated member holds no Raft replica, so the leader's replication
to N non-voting replicas (pysyncobj sends each its appendEntries 20 times a second) is
not in the figure; nor do the members run the jobs placed on them.

    python bench/telemetry.py --members 1000 [--seconds 30] [--submit-rate 2] [--json]     (as root)

`--json` keys: `members`, `scheduler_cpu_pct`, `visible_p50_ms`, `visible_p99_ms`,
`report_rate_hz`, `kept_rate`, `jobs_placed`, `seconds`, `targets_met` (and more).
`--dump FILE` writes every report's times; `--keep-logs DIR` the servers' logs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

REPORT_PATH = "/cluster/v1/report"
REPORT_EVERY_S = 1.0
ANSWER_TIMEOUT_S = 2.0       # what ClusterLink.report_once waits for an answer
VOTERS = 5
CLUSTER_ID = "test-lab"      # tests/support/cluster.py's
DOWN_AFTER_S = 10.0          # MEMBER_DOWN_AFTER_S's default
TARGET_VISIBLE_MS = 2000.0
LOOP = "scheduler's event loop"
SIM_GPU = {"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram_bytes": 24 * 2**30, "count": 8}
VOTER_GPUS = [{"model": "NVIDIA H200", "vendor": "nvidia", "vram": "141G", "count": 8}]
JOB = "#!/bin/bash\n#MTGPU gpus=1\n#MTGPU name=telemetry-bench\nsleep 3600\n"


def cpu_target_pct(members: int) -> float | None:
    """The issue's target: up to 1,000 members under 25% of one core, up to 5,000 under
    one core; none set beyond."""
    return 25.0 if members <= 1000 else 100.0 if members <= 5000 else None


# ---------------------------------------------------------------- simulated members
def sim_name(i: int) -> str:
    return f"sim-{i:05d}"


def sim_address(i: int) -> str:
    """A LISTEN address of its own (a host on loopback nothing serves); Raft is its port + 1."""
    return f"127.77.{i >> 8}.{i & 255}:7070"


@dataclass
class SimMember:
    index: int
    name: str
    gpus: list[dict]
    host: dict
    boot: str
    _template: str | None = None
    _order: list[int] | None = None

    @classmethod
    def make(cls, index: int) -> "SimMember":
        from mtgpu.agent.telemetry.simulated import SimulatedBackend
        from mtgpu.model.gpu import HostInfo

        name = sim_name(index)
        gpus = [g.to_dict() for g in SimulatedBackend([SIM_GPU], seed=name).sample()]
        host = HostInfo(cpu_count=64, cpu_util_pct=0.0, mem_total_bytes=512 * 2**30,
                        mem_available_bytes=480 * 2**30).to_dict()
        return cls(index, name, gpus, host, f"{index:012x}")

    def inventory(self) -> dict:
        """What Member._register commits for it."""
        return {"gpus": [{k: g[k] for k in ("index", "vendor", "model", "vram_total_bytes")} for g in self.gpus],
                "cpus": float(self.host["cpu_count"]), "mem_total_bytes": self.host["mem_total_bytes"],
                "address": sim_address(self.index), "containers": None, "directlink": None}

    def values(self, seq: int, applied: int) -> tuple:
        """What changes from one report to the next: per GPU its utilization (GPU 0's
        carries `seq`, as seq/10 %) and VRAM used, the host's CPU use, the replica's index."""
        out: list = []
        for g in self.gpus:
            k = g["index"]
            out += [(seq % 1000) / 10 if k == 0 else float((seq * 7 + k * 13 + self.index) % 101),
                    ((seq + k) % 24) * 2**30]
        return (*out, float((seq * 3 + self.index) % 100), applied)

    def payload(self, seq: int, applied: int) -> dict:
        """ClusterLink.report_once's payload."""
        *gpus, cpu, applied = self.values(seq, applied)
        return {"node": self.name, "cluster_id": CLUSTER_ID,
                "gpus": [{**g, "utilization_pct": gpus[2 * j], "vram_used_bytes": gpus[2 * j + 1]}
                         for j, g in enumerate(self.gpus)],
                "host": {**self.host, "cpu_util_pct": cpu},
                "raft": {"voter": False, "applied": applied, "caught_up": True, "generation": 0, "boot": self.boot}}

    def report(self, seq: int, applied: int) -> bytes:
        """The body report_once sends (its json.dumps of payload()), byte for byte: the
        JSON written once with markers where the values go, then only the values
        formatted into it (the generators must cost less than the scheduler they measure)."""
        if self._template is None:
            marked = self.payload(0, 0)
            for j, g in enumerate(marked["gpus"]):
                g["utilization_pct"], g["vram_used_bytes"] = f"@{2 * j}@", f"@{2 * j + 1}@"
            n = 2 * len(marked["gpus"])
            marked["host"]["cpu_util_pct"], marked["raft"]["applied"] = f"@{n}@", f"@{n + 1}@"
            text = json.dumps(marked).replace("%", "%%")
            self._order = sorted(range(n + 2), key=lambda k: text.index(f'"@{k}@"'))  # the values in text order
            for k in range(n + 2):
                text = text.replace(f'"@{k}@"', "%r")
            self._template = text
        values = self.values(seq, applied)
        return (self._template % tuple(values[k] for k in self._order)).encode()


def seq_shown(gpu0_utilization_pct: float) -> int:
    return round(gpu0_utilization_pct * 10)


# ---------------------------------------------------------------- the generator process
class _Wire(asyncio.Protocol):
    """One TCP connection of a Connection: its bytes and its end reach that Connection only
    while it is the current one (a connection closed after a timeout may still deliver
    its end after the next one opened)."""

    def __init__(self, owner: "Connection") -> None:
        self.owner = owner

    def data_received(self, data: bytes) -> None:
        if self.owner.wire is self:
            self.owner.received(data)

    def connection_lost(self, exc) -> None:
        if self.owner.wire is self:
            self.owner.lost()


class Connection:
    """One member's keep-alive HTTP/1.1 connection to the scheduler, sending the headers
    its httpx client sends (`defaults`: httpx.Client().headers). Protocols on the event
    loop, not asyncio's streams: the generators must cost less than the scheduler they
    measure (5,000 members on two cores)."""

    def __init__(self, host: str, port: int, defaults: dict[str, str] | None = None) -> None:
        self.host, self.port = host, port
        self.defaults = "".join(f"{k}: {v}\r\n" for k, v in (defaults or {}).items())
        self.wire: _Wire | None = None
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.waiter: asyncio.Future | None = None

    def received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None or self.waiter.done():
            return
        raw = self.buf[:end].lower()
        at = raw.find(b"\r\ncontent-length:")
        eol = raw.find(b"\r\n", at + 2)
        stop = end + 4 + (int(raw[at + 17:eol if eol > 0 else None]) if at >= 0 else 0)
        if len(self.buf) < stop:
            return
        data, self.buf = self.buf[end + 4:stop], self.buf[stop:]
        self.waiter.set_result((int(raw[9:12]), data, b"\r\nconnection: close" in raw))

    def lost(self) -> None:
        self.wire = self.transport = None
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionResetError("the scheduler closed the connection"))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.wire = self.transport = None

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        loop = asyncio.get_running_loop()
        if self.transport is None:
            self.buf = b""
            self.wire = _Wire(self)
            wire = self.wire
            transport, _ = await loop.create_connection(lambda: wire, self.host, self.port)
            if self.wire is not wire:  # lost (or closed) while it opened
                transport.close()
                raise ConnectionResetError("the scheduler closed the connection as it opened")
            self.transport = transport
        head = (f"POST {path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n{self.defaults}"
                f"content-length: {len(body)}\r\ncontent-type: application/json\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n")
        self.waiter = loop.create_future()
        self.transport.write(head.encode() + body)
        status, data, closing = await self.waiter
        if closing:
            self.close()
        return status, data


async def member_loop(sim: SimMember, conn: Connection, signer, leader: str, first_at: float, stop: asyncio.Event,
                      rec: dict) -> None:
    """Report every REPORT_EVERY_S on a fixed schedule from `first_at` (a late report is
    sent at once, never skipped) until `stop`; record each report's times."""
    sends, answers, lags = rec["sends"], rec["answers"], rec["lags"]
    due, seq, applied = first_at, 0, 0
    while not stop.is_set():
        wait = due - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
            if stop.is_set():
                return
        seq += 1
        body = sim.report(seq, applied)
        headers = signer.headers("POST", REPORT_PATH, body, sim.name, peer=leader)
        sent = time.monotonic()
        sends.append(sent)
        lags.append(sent - due)
        answer = None
        try:
            async with asyncio.timeout(ANSWER_TIMEOUT_S):
                status, data = await conn.post(REPORT_PATH, body, headers)
            if status == 200:
                answer = time.monotonic()
                applied = json.loads(data).get("commit") or applied  # a replica that keeps up
            else:
                rec["errors"][f"HTTP {status}"] = rec["errors"].get(f"HTTP {status}", 0) + 1
                rec["first_error"] = rec["first_error"] or data[:300].decode("utf-8", "replace")
        except (OSError, TimeoutError, ValueError) as e:
            kind = "timeout (> 2 s)" if isinstance(e, TimeoutError) else type(e).__name__
            rec["errors"][kind] = rec["errors"].get(kind, 0) + 1
            conn.close()  # a late answer would be read as the next one's
        answers.append(answer)
        due += REPORT_EVERY_S


def generate(leader: str, secret_path: str, first: int, count: int, total: int, out_path: str) -> int:
    """A generator process: members first..first+count-1 (of `total`, spread over the
    second by index). Prints `ready`, reads `start T` (a monotonic time) then `stop`
    on stdin, and writes every report's times to out_path."""
    import httpx

    from mtgpu.server.cluster.signer import Signer

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, count + 1000)), hard))
    signer = Signer(Path(secret_path).read_text().strip())
    sims = [SimMember.make(i) for i in range(first, first + count)]
    for seq in (1, 12345):  # the fast body is the member's, byte for byte
        if sims[0].report(seq, seq) != json.dumps(sims[0].payload(seq, seq)).encode():
            raise SystemExit("bench error: SimMember.report differs from json.dumps(payload)")
    host, port = leader.rsplit(":", 1)
    recs = {s.name: {"sends": [], "answers": [], "lags": [], "errors": {}, "first_error": None} for s in sims}

    async def run() -> None:
        loop = asyncio.get_running_loop()
        stop, started = asyncio.Event(), loop.create_future()

        def read_stdin() -> None:
            for line in sys.stdin:
                word, *rest = line.split()
                if word == "start":
                    loop.call_soon_threadsafe(started.set_result, float(rest[0]))
                elif word == "stop":
                    loop.call_soon_threadsafe(stop.set)
                    return
            loop.call_soon_threadsafe(stop.set)  # the parent went away

        threading.Thread(target=read_stdin, daemon=True).start()
        print("ready", flush=True)
        start = await started
        defaults = dict(httpx.Client().headers)
        conns = [Connection(host, int(port), defaults) for _ in sims]
        # members come up over ramp_s (a thousand a second, as if they had been started
        # one after the other), then each reports once a second
        ramp_s = max(REPORT_EVERY_S, total / 1000)
        await asyncio.gather(*(member_loop(s, c, signer, leader, start + ramp_s * s.index / total, stop,
                                           recs[s.name]) for s, c in zip(sims, conns)))
        for c in conns:
            c.close()

    import uvloop

    uvloop.run(run())  # as the scheduler's own loop: the generators must cost less than what they measure
    Path(out_path).write_text(json.dumps(recs))
    return 0


# ---------------------------------------------------------------- the tenant's submissions
def submit_worker(sockets: list[str], rate_hz: float, seconds: float) -> dict:
    """As the tenant: one job every 1/rate_hz s for `seconds`, round robin over the members' sockets."""
    from mtgpu.client.local import ClientError, LocalClient

    clients = [LocalClient(s, timeout_s=10) for s in sockets]
    ids, errors = [], []
    began = time.monotonic()
    k = 0
    while rate_hz > 0 and (now := time.monotonic()) < began + seconds:
        if now < began + k / rate_hz:
            time.sleep(began + k / rate_hz - now)
        try:
            ids.append(clients[k % len(clients)].submit(JOB)["job_id"])
        except ClientError as e:
            errors.append(str(e))
        k += 1
    for c in clients:
        c.close()
    return {"ids": ids, "errors": errors[:5], "error_count": len(errors)}


# ---------------------------------------------------------------- joining the state
def register(sims: list[SimMember], voters: list[str], secret: str, work: Path, timeout_s: float) -> float:
    """Commit every simulated member's `node.register.v1` through a non-voting replica
    of the cluster's state (what a member joining through PEERS commits); seconds taken.
    A registration the cluster did not commit is sent again a second later, as a
    member's next telemetry pass does."""
    from mtgpu.state import commands as C
    from mtgpu.state.raft import RaftState

    # pysyncobj's complaints about this short-lived replica (it re-receives entries while
    # it catches up) are not the cluster's: the servers log their own
    logging.getLogger("pysyncobj").setLevel(logging.CRITICAL + 1)
    began = time.monotonic()
    deadline = began + timeout_s
    store = RaftState(work / "replica", None, voters, secret, cluster_id=CLUSTER_ID)
    try:
        todo, why = list(sims), ""
        while todo:
            if time.monotonic() > deadline:
                raise SystemExit(f"{len(todo)} of {len(sims)} registrations not committed in {timeout_s:g} s: {why}")
            done = threading.Semaphore(0)
            failed: list[tuple[SimMember, str]] = []

            def callback(result, error, sim):
                if error is not None or not (result or {}).get("ok"):
                    failed.append((sim, str(error or result)))
                done.release()

            for s in todo:
                store.apply_async(C.command(C.NODE_REGISTER, name=s.name, at=time.time(), **s.inventory()),
                                  lambda r, e, sim=s: callback(r, e, sim))
            for _ in todo:
                if not done.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    raise SystemExit(f"the cluster did not answer {len(todo)} registrations in {timeout_s:g} s")
            todo, why = [f[0] for f in failed], failed[0][1] if failed else ""
            if todo:
                time.sleep(1.0)
    finally:
        store.close()
    return time.monotonic() - began


# ---------------------------------------------------------------- measuring
def cpu_s(pid: int, thread: int | None = None) -> tuple[float, float]:
    """(utime, stime) of a process (all its threads), or of one of its threads, in seconds."""
    where = f"/proc/{pid}/task/{thread}/stat" if thread else f"/proc/{pid}/stat"
    fields = Path(where).read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def machine_busy_s() -> float:
    """CPU seconds the whole machine was busy (all cores; /proc/stat)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + f[4]
    return (sum(f[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def scheduler_counts(leader_api: str, socket_path: str) -> dict | None:
    """The scheduler's placements, whether it still schedules, and its passes (count and
    seconds, from GET /metrics; a pass over an empty queue is not counted there); None
    when it did not answer within a minute."""
    import httpx

    from mtgpu.client.local import ClientError, LocalClient

    try:
        with LocalClient(socket_path, timeout_s=60) as c:
            health = c.health()
        text = httpx.get(f"http://{leader_api}/metrics", timeout=60).text
    except (ClientError, httpx.HTTPError):
        return None
    got = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
           if line.startswith("mtgpu_scheduling_pass_seconds_")}
    return {"placements": health["placements"], "is_scheduler": health["is_scheduler"],
            "passes": got.get("mtgpu_scheduling_pass_seconds_count", 0.0),
            "pass_s": got.get("mtgpu_scheduling_pass_seconds_sum", 0.0)}


def percentile(values: list[float], p: float) -> float | None:
    from bench.common import percentile as pct

    return pct(values, p) if values else None


def view_check(reads: list[tuple[float, float, dict]], recs: dict) -> dict:
    """For each read of GET /v1/nodes (sent at t0, answered at t1): reports answered
    before t0 that it did not show (a lie of the answer-based figure), and the oldest
    report sent before t0 that it did not show yet."""
    not_shown, oldest_unseen_s, compared = 0, 0.0, 0
    for t0, _t1, shown in reads:
        for name, rec in recs.items():
            seq = shown.get(name)
            if seq is None:
                continue
            compared += 1
            answered = [k + 1 for k, a in enumerate(rec["answers"]) if a is not None and a < t0]
            if answered and seq < answered[-1]:
                not_shown += 1
            sent = [(k + 1, t) for k, t in enumerate(rec["sends"]) if t < t0 and k + 1 > seq]
            if sent:
                oldest_unseen_s = max(oldest_unseen_s, t0 - sent[0][1])
    return {"reads": len(reads), "compared": compared, "answered_not_shown": not_shown,
            "oldest_unseen_ms": round(oldest_unseen_s * 1000, 1)}


def start_generators(n: int, generators: int, leader_api: str, secret_path: Path, work: Path,
                     procs: list[subprocess.Popen]) -> None:
    """Start the generator processes (appended to `procs` at once, so that they are killed
    whatever happens), wait until each is ready, then tell them all when to start."""
    per = math.ceil(n / generators)
    for g in range(generators):
        first, count = g * per, min(per, n - g * per)
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--generate", leader_api, str(secret_path), str(first),
             str(count), str(n), str(work / f"gen-{g}.json")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(ROOT)))
    for p in procs:
        if p.stdout.readline().strip() != "ready":
            raise SystemExit("a generator process did not start")
    start = time.monotonic() + 0.5
    for p in procs:
        p.stdin.write(f"start {start}\n")
        p.stdin.flush()


def read_views(socket_path: str, reads: int) -> tuple[list, list[dict], list[dict]]:
    """`reads` reads of the scheduler's GET /v1/nodes, a second apart, as root on its
    socket: [(sent, answered, {member: sequence shown})], the last answer, the active jobs."""
    from mtgpu.client.local import ClientError, LocalClient

    out, nodes, jobs = [], [], []
    with LocalClient(socket_path, timeout_s=60) as c, contextlib.suppress(ClientError):  # it may not answer
        for _ in range(reads):
            time.sleep(1.0)
            t0 = time.monotonic()
            nodes = c.nodes()
            out.append((t0, time.monotonic(), {x["name"]: seq_shown(x["gpus"][0]["utilization_pct"])
                                               for x in nodes if x["name"].startswith("sim-") and x["gpus"]}))
        jobs = c.jobs(all_tenants=True, active_only=True)
    return out, nodes, jobs


def run_bench(args) -> dict:
    from mtgpu.client.local import LocalClient
    from tests.support.cluster import member_name, running_cluster
    from tests.support.users import temp_user

    n, seconds = args.members, args.seconds
    generators = args.generators or max(1, math.ceil(n / 2500))
    work = Path(tempfile.mkdtemp(prefix="mtgpu-telemetry-"))
    procs: list[subprocess.Popen] = []
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # the servers inherit it: one socket per member
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, n + 4000)), hard))
    try:
        with temp_user("mttel") as user, \
                running_cluster(VOTERS, gpus=[VOTER_GPUS] * VOTERS, down_after_s=DOWN_AFTER_S,
                                settings=[{"METRICS": {"enabled": True}}] * VOTERS) as cl:
            leader = cl.scheduler()
            others = [m for m in cl.members if m is not leader]
            with LocalClient(str(leader.socket_path)) as c:
                for m in cl.members:
                    c.drain(member_name(m), "benchmark: jobs go to the simulated members")
                voters = c.health()["raft"]["voters"]
            leader_api = f"127.0.0.1:{leader.port}"

            # reports begin as the registrations are committed, as a starting member's do
            start_generators(n, generators, leader_api, cl.secret_path, work, procs)
            register_s = register([SimMember.make(i) for i in range(n)], voters, cl.secret_path.read_text().strip(),
                                  work, timeout_s=120)
            time.sleep(args.warmup)

            # the measured window: reports, submissions, placements; nothing else asks the scheduler
            before = scheduler_counts(leader_api, str(leader.socket_path))
            watched = {"scheduler": (leader.proc.pid, None), LOOP: (leader.proc.pid, leader.proc.pid),
                       **{member_name(m): (m.proc.pid, None) for m in others},
                       **{f"generator {g}": (p.pid, None) for g, p in enumerate(procs)}}
            cpu_before = {k: cpu_s(*pid) for k, pid in watched.items()}
            busy_before, w0 = machine_busy_s(), time.monotonic()
            submitter = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--submit-worker", str(args.submit_rate), str(seconds),
                 *[str(m.socket_path) for m in others + [leader]]],
                user=user.uid, group=user.gid, extra_groups=[], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, cwd=user.home, env={"PATH": "/usr/bin:/bin", "HOME": user.home, "PYTHONPATH": str(ROOT)})
            procs.append(submitter)
            time.sleep(max(0.0, w0 + seconds - time.monotonic()))
            w1 = time.monotonic()
            cpu_after = {k: cpu_s(*pid) for k, pid in watched.items()}
            busy_after = machine_busy_s()
            out, err = submitter.communicate(timeout=60)
            if submitter.returncode != 0:
                raise SystemExit(f"the tenant's submissions failed:\n{err[-2000:]}")
            after = scheduler_counts(leader_api, str(leader.socket_path))

            # after the window: the scheduler's own answer, read from the outside
            reads, nodes, jobs = read_views(str(leader.socket_path), args.view_reads)
            for p in procs[:generators]:
                p.stdin.write("stop\n")
                p.stdin.flush()
            for p in procs[:generators]:
                p.wait(timeout=120)
            recs: dict = {}
            for g in range(generators):
                recs.update(json.loads((work / f"gen-{g}.json").read_text()))
            if args.dump:
                Path(args.dump).write_text(json.dumps({"window": [w0, w1], "members": recs}))
            if args.keep_logs:
                os.makedirs(args.keep_logs, exist_ok=True)
                for m in cl.members:
                    for log_file in m.log_files:
                        shutil.copy(log_file, Path(args.keep_logs) / f"{member_name(m)}-{log_file.name}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(work, ignore_errors=True)
    window = {
        "w0": w0, "w1": w1, "register_s": register_s, "generators": generators, "busy_s": busy_after - busy_before,
        "cpu": {k: (sum(cpu_after[k]) - sum(cpu_before[k])) / (w1 - w0) for k in cpu_before},
        "system": (cpu_after["scheduler"][1] - cpu_before["scheduler"][1]) / (w1 - w0),
        "counts": {k: after[k] - before[k] for k in ("placements", "passes", "pass_s")} if before and after else None,
        "still_scheduler": bool(after and after["is_scheduler"]),
        "submitted": json.loads(out), "jobs": jobs, "reads": reads,
        "down": sum(1 for x in nodes if x["name"].startswith("sim-") and x["state"] == "down"),
    }
    return summarize(args, recs, window)


def summarize(args, recs: dict, w: dict) -> dict:
    seconds = w["w1"] - w["w0"]
    latencies, lags, sent, errors, first_error = [], [], 0, {}, None
    for rec in recs.values():
        for t, a, lag in zip(rec["sends"], rec["answers"], rec["lags"]):
            if w["w0"] <= t < w["w1"]:
                sent += 1
                lags.append(lag)
                if a is not None:
                    latencies.append((a - t) * 1000)
        for k, v in rec["errors"].items():
            errors[k] = errors.get(k, 0) + v
        first_error = first_error or rec["first_error"]
    answered = len(latencies)
    # a report not answered within ANSWER_TIMEOUT_S (or refused) counts as that late at least
    counted = latencies + [ANSWER_TIMEOUT_S * 1000] * (sent - answered)
    p99 = percentile(counted, 99)
    cpu = {k: round(100 * v, 1) for k, v in w["cpu"].items()}
    rate = answered / seconds
    counts = w["counts"] or {"placements": None, "passes": None, "pass_s": None}  # None: it did not answer
    passes = counts["passes"]
    submitted = w["submitted"]
    result = {
        "members": args.members,
        "seconds": round(seconds, 1),
        "scheduler_cpu_pct": cpu["scheduler"],
        "scheduler_system_cpu_pct": round(100 * w["system"], 1),
        "cpu_target_pct": cpu_target_pct(args.members),
        "visible_p50_ms": round(percentile(counted, 50), 2) if counted else None,
        "visible_p99_ms": round(p99, 2) if p99 is not None else None,
        "visible_max_ms": round(max(latencies), 2) if latencies else None,
        "unanswered": sent - answered,
        "report_rate_hz": round(rate, 1),
        "kept_rate": rate >= 0.99 * args.members and answered == sent,
        "send_lag_p99_ms": round(percentile(lags, 99) * 1000, 1) if lags else None,
        "errors": errors,
        "first_error": first_error,
        "still_scheduler": w["still_scheduler"],
        "submit_rate_hz": args.submit_rate,
        "jobs_submitted": len(submitted["ids"]),
        "submit_errors": submitted["error_count"],
        "jobs_placed": counts["placements"],
        "jobs_running_on_simulated": sum(1 for j in w["jobs"] if j["state"] == "running" and j["nodes"]
                                         and all(str(x).startswith("sim-") for x in j["nodes"])),
        "scheduling_passes": None if passes is None else int(passes),
        "scheduling_pass_mean_ms": round(1000 * counts["pass_s"] / passes, 1) if passes else None,
        "simulated_marked_down": w["down"],
        "register_s": round(w["register_s"], 2),
        "view": view_check(w["reads"], recs),
        "cpu_pct": cpu,
        "machine_busy_pct": round(100 * w["busy_s"] / seconds / (os.cpu_count() or 1), 1),
        "cores": os.cpu_count(),
        "generators": w["generators"],
    }
    target = result["cpu_target_pct"]
    result["targets_met"] = bool(result["kept_rate"] and result["still_scheduler"] and target is not None
                                 and cpu["scheduler"] < target and p99 is not None and p99 < TARGET_VISIBLE_MS
                                 and result["view"]["answered_not_shown"] == 0)
    return result


def print_human(r: dict, args) -> None:
    met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    n = r["members"]
    print(f"{n:,} simulated members (8 GPUs each) reporting once a second, signed, to the scheduler of a "
          f"{VOTERS}-voter cluster on loopback; {r['seconds']} s measured after {args.warmup:g} s of warm-up "
          f"({r['register_s']} s to register them); {r['generators']} generator process(es)")
    kept = "kept" if r["kept_rate"] else "NOT kept: the figures below are at this lower rate"
    print(f"reports answered: {r['report_rate_hz']:,.1f}/s of {n:,}/s ({kept}); {r['unanswered']} unanswered, "
          f"errors over the whole run {r['errors'] or 'none'}; sends started up to {r['send_lag_p99_ms']} ms late (p99)")
    if r["first_error"]:
        print(f"  first error answer: {r['first_error']}")
    if r["jobs_placed"] is None:
        print("  the scheduler did not answer its socket or GET /metrics within a minute around the window")
    elif not r["still_scheduler"]:
        print("  the member measured as the scheduler no longer schedules: another one took over during the run")
    target = r["cpu_target_pct"]
    said = f"target < {target:g}%: {met(r['scheduler_cpu_pct'] < target)}" if target is not None else "no target set"
    if not r["kept_rate"] and target is not None:
        said = f"target < {target:g}%: not judged, the reports were not all taken"
    print(f"scheduler CPU: {r['scheduler_cpu_pct']}% of one core ({said}); {r['scheduler_system_cpu_pct']}% in the "
          f"kernel, {r['cpu_pct'][LOOP]}% in its event loop's thread (the API, the reports)")
    late = f"; {r['unanswered']:,} unanswered counted as {ANSWER_TIMEOUT_S * 1000:g} ms" if r["unanswered"] else ""
    ok = r["visible_p99_ms"] is not None and r["visible_p99_ms"] < TARGET_VISIBLE_MS
    print(f"report to visible: p50 {r['visible_p50_ms']} ms, p99 {r['visible_p99_ms']} ms, max answered "
          f"{r['visible_max_ms']} ms{late} (target < {TARGET_VISIBLE_MS:g} ms: {met(ok)})")
    v = r["view"]
    print(f"  checked in GET /v1/nodes ({v['reads']} reads after the window, {v['compared']:,} members compared): "
          f"{v['answered_not_shown']} answered reports not shown; oldest report not shown yet: "
          f"{v['oldest_unseen_ms']} ms old")
    print(f"jobs: {r['jobs_submitted']} submitted at {r['submit_rate_hz']:g}/s ({r['submit_errors']} failed), "
          f"{r['jobs_placed']} placed in the "
          f"window, {r['jobs_running_on_simulated']} running on simulated members at the end; "
          f"{r['simulated_marked_down']} simulated members marked down; {r['scheduling_passes']} scheduling passes "
          f"over a waiting queue, {r['scheduling_pass_mean_ms']} ms each (mean wall time)")
    others = ", ".join(f"{k} {v}%" for k, v in r["cpu_pct"].items() if k not in ("scheduler", LOOP))
    print(f"other CPU (% of one core): {others}; the machine busy {r['machine_busy_pct']}% of its {r['cores']} cores")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=1000, help="simulated members")
    ap.add_argument("--seconds", type=float, default=30.0, help="the measured window")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds of reports before the window")
    ap.add_argument("--submit-rate", type=float, default=2.0,
                    help="jobs submitted per second in the window (a thousand tenants submitting 150 jobs a day "
                         "each: 1.7/s)")
    ap.add_argument("--generators", type=int, default=0, help="report generator processes (default 1 per 2,500)")
    ap.add_argument("--view-reads", type=int, default=3, help="reads of GET /v1/nodes after the window")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--dump", metavar="FILE", help="write every report's send, answer and lateness times here")
    ap.add_argument("--keep-logs", metavar="DIR", help="copy the servers' logs here")
    ap.add_argument("--generate", nargs=6, help=argparse.SUPPRESS)
    ap.add_argument("--submit-worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.generate:
        leader, secret_path, first, count, total, out = args.generate
        return generate(leader, secret_path, int(first), int(count), int(total), out)
    if args.submit_worker:
        rate, seconds, *sockets = args.submit_worker
        print(json.dumps(submit_worker(sockets, float(rate), float(seconds))))
        return 0
    if not 1 <= args.members <= 60000 or args.seconds + args.warmup > 800:
        ap.error("--members 1..60000, and --seconds + --warmup at most 800 (sequence numbers ride in a percentage)")
    from bench.common import run_as_root
    from tests.support.users import can_create_users

    result = run_as_root("telemetry.py", "real servers and a real tenant", run_bench, args, why_not=can_create_users)
    if isinstance(result, int):
        return result
    if args.json:
        print(json.dumps(result))
    else:
        print_human(result, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

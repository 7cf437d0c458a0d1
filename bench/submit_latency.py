"""Submit-to-start latency of a standalone node (issue 2's benchmark).

Starts a real `mtgpu-server` with simulated GPUs in a temporary STATE_DIR, creates a
temporary tenant, and, as that tenant, submits short native jobs one at a time over
the node's Unix socket. Each job's first instruction records `$EPOCHREALTIME`; the
latency is that moment minus the moment just before the submit request was sent
(the CLI's own Python start-up is not counted: it is the same for any server).
Then it submits the same number of jobs back to back and reports submissions per
second (each one journaled and fsync'd before it is acknowledged).

`--queued N` keeps N jobs waiting in the queue throughout (blocked on memory a long job
holds; every pass considers them; the measured jobs ask for nothing and start past them).

    python bench/submit_latency.py [--jobs 200] [--queued 1000] [--json]      (as root)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import percentile  # noqa: E402 (after the path is set)


def queue_up(c, queued: int) -> int:
    """`queued` jobs that wait in the queue for the whole run, each a pass considers: a
    long job takes 60% of the node's memory, then jobs that each ask for 60% of it (they
    fit the node, not now: blocked, they hold memory; the measured jobs ask for none, so
    they start past them). Priorities differ, so their specs differ. Returns the long job."""
    mem_gib = int(Path("/proc/meminfo").read_text().split()[1]) * 0.6 / 1024**2
    blocker = c.submit(f"#!/bin/bash\n#MTGPU mem={mem_gib:.1f}G\nsleep 3600\n")["job_id"]
    deadline = time.monotonic() + 60
    while c.job(blocker)["state"] != "running":
        if time.monotonic() > deadline:
            raise SystemExit(f"the long job {blocker} did not start: {c.job(blocker)['reason']}")
        time.sleep(0.1)
    for i in range(queued):
        c.submit(f"#!/bin/bash\n#MTGPU mem={mem_gib:.1f}G priority=-{i % 500 / 10:.1f}\ntrue\n")
    waiting = sum(1 for j in c.jobs(active_only=True) if j["state"] == "queued")
    if waiting < queued:
        raise SystemExit(f"only {waiting} of the {queued} jobs wait in the queue")
    return blocker


def worker(socket_path: str, jobs: int, state_dir: str, queued: int = 0) -> dict:
    """Runs as the tenant: submit, wait for the job's first instruction, repeat."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from mtgpu.client.local import LocalClient

    uid = os.getuid()
    latencies = []
    script = "#!/bin/bash\necho START $EPOCHREALTIME\n"
    with LocalClient(socket_path) as c:
        c.submit("#!/bin/bash\ntrue\n")  # warm-up: first tenant record, connections
        blocker = queue_up(c, queued) if queued else None
        time.sleep(0.5)
        for _ in range(jobs):
            t0 = time.time()
            job_id = c.submit(script)["job_id"]
            log = Path(state_dir) / "logs" / str(uid) / f"{job_id}.log"
            deadline = time.monotonic() + 30
            started = None
            while time.monotonic() < deadline:
                try:
                    text = log.read_text()
                except OSError:
                    text = ""
                if text.startswith("START ") and text.endswith("\n"):
                    started = float(text.split()[1])
                    break
                time.sleep(0.001)
            if started is None:
                raise SystemExit(f"job {job_id} did not start within 30 s")
            latencies.append((started - t0) * 1000.0)
        t0 = time.perf_counter()
        for _ in range(jobs):
            c.submit("#!/bin/bash\ntrue\n")
        burst_s = time.perf_counter() - t0
        still = sum(1 for j in c.jobs(active_only=True) if j["state"] == "queued") if queued else 0
        if blocker is not None:
            c.cancel(blocker)
    return {
        "jobs": jobs,
        "queued": queued,
        "queued_at_end": still,
        "start_p50_ms": round(percentile(latencies, 50), 2),
        "start_p99_ms": round(percentile(latencies, 99), 2),
        "start_mean_ms": round(statistics.fmean(latencies), 2),
        "start_max_ms": round(max(latencies), 2),
        "submit_per_s": round(jobs / burst_s, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--queued", type=int, default=0, help="jobs kept waiting in the queue throughout")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", nargs=2, metavar=("SOCKET", "STATE_DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.jobs, args.worker[1], args.queued)))
        return 0
    if os.geteuid() != 0:
        print("bench/submit_latency.py runs a real node and a real tenant: run it as root", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="mtgpu-bench-"))
    os.chmod(base, 0o755)
    user = f"mtbench{os.getpid() % 100000}"
    server = None
    try:
        subprocess.run(["useradd", "-M", "-d", str(base), "-s", "/bin/bash", "-K", "UID_MIN=260000",
                        "-K", "UID_MAX=269999", "-K", "GID_MIN=260000", "-K", "GID_MAX=269999", user],
                       check=True, capture_output=True)
        uid = int(subprocess.run(["id", "-u", user], capture_output=True, text=True, check=True).stdout)
        gid = int(subprocess.run(["id", "-g", user], capture_output=True, text=True, check=True).stdout)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        state = base / "state"
        (base / "mtgpu.toml").write_text(
            f'NODE_NAME = "bench"\nLISTEN = "127.0.0.1:{port}"\nSTATE_DIR = "{state}"\nGPU_BACKEND = "simulated"\n'
            '[[SIMULATED_GPUS]]\nmodel = "NVIDIA GeForce RTX 4090"\nvram = "24G"\ncount = 4\n'
        )
        server = subprocess.Popen([sys.executable, "-m", "mtgpu.cli.server", "--config", str(base / "mtgpu.toml"),
                                   "--log-level", "WARNING"], stdout=subprocess.DEVNULL, stderr=open(base / "server.log", "wb"),
                                  start_new_session=True, cwd=str(Path(__file__).resolve().parent.parent))
        sock = state / "mtgpu.sock"
        deadline = time.monotonic() + 30
        while not sock.exists():
            if time.monotonic() > deadline or server.poll() is not None:
                print((base / "server.log").read_text(), file=sys.stderr)
                return 1
            time.sleep(0.05)
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--jobs", str(args.jobs), "--queued",
                            str(args.queued), "--worker", str(sock), str(state)],
                           user=uid, group=gid, extra_groups=[], capture_output=True, text=True, cwd=str(base),
                           env={"PATH": "/usr/bin:/bin", "HOME": str(base)})
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            return 1
        result = json.loads(r.stdout)
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
        subprocess.run(["userdel", user], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"standalone node, {result['jobs']} short native jobs submitted one at a time as a tenant"
              + (f", {result['queued']} jobs waiting in the queue ({result['queued_at_end']} at the end)"
                 if result["queued"] else ""))
        print(f"submit -> first instruction: p50 {result['start_p50_ms']:.1f} ms, p99 {result['start_p99_ms']:.1f} ms "
              f"(mean {result['start_mean_ms']:.1f}, max {result['start_max_ms']:.1f})  [target p50 < 100, p99 < 500]")
        print(f"back-to-back submissions: {result['submit_per_s']:.0f}/s (journaled, fsync'd)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Replicated submissions per second into a 3-member cluster (issue 4's benchmark).

Starts three real `mtgpu-server` processes on loopback forming one cluster, drains
every member (so the jobs stay queued and the machine measures submission, not job
start-up), creates a temporary tenant and, as that tenant, submits jobs from
several client threads spread over the three members' Unix sockets. A submission
counts once the cluster has committed it (Raft majority, journaled) and answered.

    python bench/submit_rate.py [--jobs 3000] [--clients 12] [--json]     (as root)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def worker(sockets: list[str], jobs: int, clients: int, start_at: float) -> dict:
    from mtgpu.client.local import ClientError, LocalClient

    per_client = jobs // clients
    errors: list[str] = []
    latencies: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)

    def run(k: int) -> None:
        mine = []
        with LocalClient(sockets[k % len(sockets)]) as c:
            c.whoami()
            barrier.wait()
            for _ in range(per_client):
                t0 = time.perf_counter()
                try:
                    c.submit("#!/bin/bash\ntrue\n")
                except ClientError as e:
                    with lock:
                        errors.append(str(e))
                    continue
                mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    time.sleep(max(0.0, start_at - time.time()))
    barrier.wait()
    for t in threads:
        t.join()
    return {"latencies": latencies, "errors": errors, "ended_at": time.time()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--clients", type=int, default=16, help="client threads per client process")
    ap.add_argument("--processes", type=int, default=3, help="client processes (each on one member in turn)")
    ap.add_argument("--via", choices=["all", "scheduler"], default="all",
                    help="spread clients over every member (default) or send all to the scheduler")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        start_at, *sockets = args.worker
        print(json.dumps(worker(sockets, args.jobs, args.clients, float(start_at))))
        return 0
    if os.geteuid() != 0:
        print("bench/submit_rate.py runs real servers and a real tenant: run it as root", file=sys.stderr)
        return 2
    from tests.support.cluster import member_name, running_cluster
    from tests.support.users import temp_user

    with temp_user("mtrate") as user, running_cluster(3) as cl:
        for m in cl.members:
            r = cl.members[0].admin("nodes", "drain", member_name(m), "--reason", "benchmark: keep jobs queued")
            if r.returncode != 0:
                print(r.stderr, file=sys.stderr)
                return 1
        sockets = [str(m.socket_path) for m in ([cl.scheduler()] if args.via == "scheduler" else cl.members)]
        start_at = time.time() + 2.0
        per_process = args.jobs // args.processes
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--jobs", str(per_process), "--clients",
                                   str(args.clients), "--worker", str(start_at), *(sockets[k:] + sockets[:k])],
                                  user=user.uid, group=user.gid, extra_groups=[], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, cwd=user.home,
                                  env={"PATH": "/usr/bin:/bin", "HOME": user.home})
                 for k in range(args.processes)]
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=600)
            if p.returncode != 0:
                print(err, file=sys.stderr)
                return 1
            outs.append(json.loads(out))
        latencies = sorted(x for o in outs for x in o["latencies"])
        errors = [e for o in outs for e in o["errors"]]
        elapsed = max(o["ended_at"] for o in outs) - start_at
        result = {
            "submitted": len(latencies),
            "errors": len(errors),
            "seconds": round(elapsed, 3),
            "submit_per_s": round(len(latencies) / elapsed, 1),
            "p50_ms": round(latencies[len(latencies) // 2] * 1000, 2) if latencies else None,
            "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2) if latencies else None,
            "first_error": errors[0] if errors else None,
        }
        with cl.members[1].client() as c:
            result["replicated_jobs_seen_on_another_member"] = len(c.jobs(all_tenants=True))
    if args.json:
        print(json.dumps(result))
    else:
        print(f"3-member cluster on loopback, {args.processes} client processes x {args.clients} threads over the "
              f"members, {result['submitted']} submissions")
        print(f"replicated submissions: {result['submit_per_s']:.0f}/s (p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms; "
              f"{result['errors']} errors)  [target >= 1,000/s; Slurm sustains ~500]")
    return 0


if __name__ == "__main__":
    sys.exit(main())

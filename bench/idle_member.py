"""What an idle member costs (issue 28 target 5: under 1% of a core and 100 MB).

Three real `mtgpu-server` processes on loopback (two simulated GPUs each) form a cluster
with nothing queued or running. After --settle seconds, each member's CPU time (user +
system of the server process and its threads, from /proc/PID/stat; the tenant sshd and
other children are counted apart) is read twice, --seconds apart, and its resident memory
(VmRSS) at the end. CPU time is what the member itself used, so a busy machine beside it
changes it little (the wall clock between the reads is the denominator).

Printed per member (scheduler or not): % of one core, RSS in MB, and the children's
% of a core; `--json` the same. Target: every member under 1% and 100 MB.

    python bench/idle_member.py [--seconds 60] [--settle 15] [--json]    (as root)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import run_as_root  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system seconds of the process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def tree_cpu_s(pids: list[int]) -> float:
    total = 0.0
    for p in pids:
        try:
            total += cpu_s(p) + tree_cpu_s(children(p))
        except OSError:
            pass
    return total


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(args) -> dict:
    from tests.support.cluster import GPUS_2, member_name, running_cluster

    with running_cluster(3, gpus=[GPUS_2] * 3) as cluster:
        sched = cluster.scheduler()
        time.sleep(args.settle)
        members = cluster.members
        pids = [m.proc.pid for m in members]
        t0 = time.monotonic()
        before = [cpu_s(p) for p in pids]
        kids_before = [tree_cpu_s(children(p)) for p in pids]
        load0 = os.getloadavg()[0]
        time.sleep(args.seconds)
        wall = time.monotonic() - t0
        after = [cpu_s(p) for p in pids]
        kids_after = [tree_cpu_s(children(p)) for p in pids]
        rows = []
        for m, p, b, a, kb, ka in zip(members, pids, before, after, kids_before, kids_after):
            rows.append({"member": member_name(m),
                         "scheduler": m is sched,
                         "cpu_pct": round(100 * (a - b) / wall, 2),
                         "rss_mb": round(rss_mb(p), 1),
                         "children_cpu_pct": round(100 * max(0.0, ka - kb) / wall, 2)})
        return {"seconds": round(wall, 1), "load_avg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
                "members": rows,
                "met": all(r["cpu_pct"] < 1.0 and r["rss_mb"] < 100 for r in rows)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--settle", type=float, default=15.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = run_as_root("idle_member.py", "a 3-member cluster of real servers", run, args)
    if isinstance(result, int):
        return result
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"idle 3-member cluster, {result['seconds']} s measured, load average "
          f"{result['load_avg_1m'][0]} -> {result['load_avg_1m'][1]}")
    print(f"{'member':<10} {'role':<10} {'% of a core':>12} {'RSS MB':>8} {'children %':>11}")
    for r in result["members"]:
        print(f"{r['member']:<10} {'scheduler' if r['scheduler'] else 'member':<10} {r['cpu_pct']:>12} "
              f"{r['rss_mb']:>8} {r['children_cpu_pct']:>11}")
    print("target (< 1% of a core, < 100 MB each):", "met" if result["met"] else "NOT met")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Busy members are not dead ones (issue 23): jobs that burn every CPU twice over, on every
member of a cluster, for --minutes; no member may be marked down and no job requeued.

Three real `mtgpu-server` processes on loopback (two simulated GPUs each) form a cluster
with MEMBER_DOWN_AFTER_S = --down-after (3 s, the least allowed: the jobs' lease is then
2 s, so a member starved for two seconds loses its job). A temporary tenant runs one job
on each member (`server=`) that keeps 2 x nproc busy loops (no fork in the loop) for
--minutes, then ends. On a machine with one member per node that is "every CPU twice
over" on every member; here the members share the machine, so it is 3 x that.

The members' own Python work beside it: --queued N jobs held behind the burners (`after=`,
so every list of jobs carries them) and --readers K clients per member listing every job
back to back on its Unix socket, which keep each member's API and interpreter lock busy.
--load N adds N spinning processes outside the cluster (bench/hog.py), as other work on
the machine would.

Printed, per member and in total:
- `marked_down`: times the member was marked down (the scheduler's log lines, and what
  the nodes answer showed in the once-a-second samples);
- `requeued`: jobs requeued or not `completed` at their first attempt;
- `longest_report_gap_s`: the longest time between two reports of the member taken by
  the scheduler (nodes --json's longest_report_gap_s; the scheduler's own member: between
  two telemetry passes of its loop), read at the end, and the largest seen in samples
  (a change of scheduler starts the count again);
- `schedulers`: the members that scheduled during the run (more than one: an election).

Target: 0 marked down, 0 requeued, every gap well under --down-after. Everything is
removed at the end (servers by pid, the tenant, the jobs' cgroups), also on Ctrl-C.

    python bench/busy_members.py [--minutes 10] [--down-after 3] [--queued 0] [--readers 0] [--load 0] [--json]  (as root)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import run_as_root  # noqa: E402 (after the path is set)
from tests.support.runs import burner_script  # noqa: E402

FINAL = ("completed", "failed", "cancelled", "lost")


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def read_jobs_back_to_back(socket_path: str, stop: threading.Event, counts: list[int]) -> None:
    """One client listing every job of the cluster, again and again, until `stop`."""
    from mtgpu.client.local import LocalClient

    while not stop.is_set():
        try:
            with LocalClient(socket_path, timeout_s=30) as c:
                c.jobs(all_tenants=True)
            counts[0] += 1
        except Exception:  # noqa: BLE001 - a slow or refused read is load all the same; counted
            counts[1] += 1
            stop.wait(0.5)


def run(minutes: float, down_after_s: float, members: int, queued: int = 0, readers: int = 0, load: int = 0) -> dict:
    """The run, beside a CPU hog of `load` processes (none for 0)."""
    from bench.hog import CpuHog

    with CpuHog(load, minutes * 60 + 900) as hog:
        result = burn(minutes, down_after_s, members, queued, readers)
    result["load"] = load
    if load:
        result["load_average"] = [round(x, 1) for x in hog.load_range() or ()] or result["load_average"]
    return result


def burn(minutes: float, down_after_s: float, members: int, queued: int, readers: int) -> dict:
    from mtgpu.client.local import LocalClient
    from tests.support.cluster import member_name, running_cluster
    from tests.support.node import wait_for
    from tests.support.users import temp_user

    burners = 2 * (os.cpu_count() or 1)
    seconds = int(minutes * 60)
    with temp_user("mtbz") as user, running_cluster(members, down_after_s=down_after_s) as cl:
        names = [member_name(m) for m in cl.members]
        sched = cl.scheduler()
        ids = {n: sched.submit_json(user, script=burner_script(n, burners, seconds))["job_id"] for n in names}
        wait_for("a burning job running on every member",
                 lambda: all(sched.job(j)["state"] == "running" for j in ids.values()), timeout_s=120)
        if queued:
            from bench.chaos import submit_as

            held = "#!/bin/bash\n#MTGPU after=afterany:" + ":".join(str(j) for j in ids.values()) + "\ntrue\n"
            for start in range(0, queued, 500):
                submit_as(user, str(sched.socket_path), held, f"0-{min(500, queued - start) - 1}")
        stop_readers = threading.Event()
        reads = [0, 0]  # answered, failed
        threads = [threading.Thread(target=read_jobs_back_to_back, args=(str(m.socket_path), stop_readers, reads),
                                    daemon=True) for m in cl.members for _ in range(readers)]
        for t in threads:
            t.start()
        t0 = time.monotonic()
        seen_down = {n: 0 for n in names}
        was_down = {n: False for n in names}
        gap_seen = {n: 0.0 for n in names}
        schedulers: list[str] = []
        loads: list[float] = []
        unanswered = 0
        jobs: dict[str, dict] = {}
        while time.monotonic() - t0 < seconds + 300:
            time.sleep(1.0)
            loads.append(load_average())
            for m in cl.live():  # the first member that answers in time
                try:
                    with LocalClient(str(m.socket_path), timeout_s=5) as c:
                        nodes = c.nodes()
                        jobs = {n: c.job(j) for n, j in ids.items()}
                    break
                except Exception:  # noqa: BLE001 - busy or electing: ask another; counted below
                    continue
            else:
                unanswered += 1
                continue
            for n in nodes:
                down = n["state"] == "down"
                if down and not was_down.get(n["name"], False):
                    seen_down[n["name"]] = seen_down.get(n["name"], 0) + 1
                was_down[n["name"]] = down
                if n["role"] == "scheduler" and (not schedulers or schedulers[-1] != n["name"]):
                    schedulers.append(n["name"])
                gap = n.get("longest_report_gap_s")
                if gap is not None:
                    gap_seen[n["name"]] = max(gap_seen.get(n["name"], 0.0), gap)
            if all(j["state"] in FINAL or j["attempt"] > 0 for j in jobs.values()):
                break
        elapsed = time.monotonic() - t0
        stop_readers.set()
        for t in threads:
            t.join(timeout=60)
        sched = cl.scheduler()
        with LocalClient(str(sched.socket_path), timeout_s=30) as c:
            final_gaps = {n["name"]: n.get("longest_report_gap_s") for n in c.nodes()}
            jobs = {n: c.job(j) for n, j in ids.items()}
        log_downs = {n: 0 for n in names}
        stalls: list[str] = []  # the scheduler's own stalls (scheduler_role.py), as logged
        for m in cl.members:
            for path in m.log_files:
                for line in path.read_text(errors="replace").splitlines():
                    if "member " in line and " is down: " in line:
                        who = line.split("member ", 1)[1].split(" ", 1)[0]
                        log_downs[who] = log_downs.get(who, 0) + 1
                    elif " did not check its members for " in line:
                        stalls.append(line.split(": ", 1)[-1])
        per_member = {}
        for n in names:
            job = jobs[n]
            per_member[n] = {
                "marked_down": max(log_downs.get(n, 0), seen_down.get(n, 0)),
                "requeued": int(job["attempt"] > 0 or bool(job["history"]) or job["state"] != "completed"),
                "job_state": job["state"], "job_attempt": job["attempt"],
                "requeue_reasons": [h.get("outcome", "") for h in job["history"]],
                "longest_report_gap_s": round(max(final_gaps.get(n) or 0.0, gap_seen.get(n, 0.0)), 2),
            }
        return {
            "minutes": minutes, "members": members, "down_after_s": down_after_s, "cpus": os.cpu_count(),
            "burners_per_member": burners, "elapsed_s": round(elapsed, 1), "queued": queued,
            "readers_per_member": readers, "reads": reads[0], "reads_failed": reads[1],
            "marked_down": sum(p["marked_down"] for p in per_member.values()),
            "requeued": sum(p["requeued"] for p in per_member.values()),
            "longest_report_gap_s": max(p["longest_report_gap_s"] for p in per_member.values()),
            "schedulers": schedulers, "samples_unanswered": unanswered, "scheduler_stalls": stalls[:20],
            "load_average": [round(min(loads), 1), round(max(loads), 1)] if loads else [],
            "per_member": per_member,
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="how long the jobs burn")
    ap.add_argument("--down-after", type=float, default=3.0, help="MEMBER_DOWN_AFTER_S (at least 3)")
    ap.add_argument("--members", type=int, default=3)
    ap.add_argument("--queued", type=int, default=0, metavar="N", help="jobs held queued behind the burners")
    ap.add_argument("--readers", type=int, default=0, metavar="K", help="clients per member listing every job")
    ap.add_argument("--load", type=int, default=0, metavar="N", help="CPU-spinning processes beside it (bench/hog.py)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.minutes <= 0 or args.down_after < 3 or args.members < 1 or min(args.queued, args.readers, args.load) < 0:
        ap.error(f"--minutes must be above 0, --down-after at least 3, --members at least 1, --queued, --readers "
                 f"and --load at least 0, not {args.minutes}, {args.down_after}, {args.members}, {args.queued}, "
                 f"{args.readers} and {args.load}")
    r = run_as_root("busy_members.py", "real servers and a real tenant", run, args.minutes, args.down_after,
                    args.members, args.queued, args.readers, args.load, why_not=_why_not)
    if isinstance(r, int):
        return r
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"{r['members']} members, {r['burners_per_member']} busy loops each on {r['cpus']} CPUs for "
          f"{r['minutes']:g} min (MEMBER_DOWN_AFTER_S {r['down_after_s']:g}), load average "
          f"{'-'.join(str(x) for x in r['load_average'])}")
    if r["load"]:
        print(f"  beside it: {r['load']} CPU-spinning processes outside the cluster")
    if r["queued"] or r["readers_per_member"]:
        print(f"  beside it: {r['queued']} jobs held queued, {r['readers_per_member']} readers per member listing "
              f"every job ({r['reads']} lists, {r['reads_failed']} failed)")
    for name, p in r["per_member"].items():
        print(f"  {name}: marked down {p['marked_down']}, job requeued {p['requeued']} ({p['job_state']}, "
              f"attempt {p['job_attempt']}), longest gap between reports {p['longest_report_gap_s']:.2f} s")
    for name, p in r["per_member"].items():
        for why in p["requeue_reasons"]:
            print(f"  {name}'s job: {why}")
    for line in r["scheduler_stalls"]:
        print(f"  scheduler: {line}")
    print(f"marked down: {r['marked_down']}  requeued: {r['requeued']}  longest gap: {r['longest_report_gap_s']:.2f} s  "
          f"schedulers: {', '.join(r['schedulers'])}  samples unanswered: {r['samples_unanswered']}")
    return 0


def _why_not() -> str | None:
    from tests.support.users import can_create_users

    return can_create_users()


if __name__ == "__main__":
    sys.exit(main())

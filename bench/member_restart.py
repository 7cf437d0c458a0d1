"""How long a killed member is silent, on a busy machine, before it reports again.

A member's process can die (a crash, an upgrade, the OOM killer) while its jobs run on:
their supervisors are separate processes and the restarted member re-attaches them. The
scheduler marks a member down after MEMBER_DOWN_AFTER_S (10 s by default) without a
report and requeues its jobs; a job that ended by itself while its member was away then
runs a second time (README, "ran once"). So a restart must be well within that bound
also when the machine is busy, above all with the member's own jobs burning every CPU.

A 3-member cluster (down after --down-after s), a job on every member keeping 2 x the
CPUs busy (as bench/busy_members.py) and --queued jobs held in the queue (the replicated
state a member reloads); then --restarts times: a member other than the scheduler is
killed (SIGKILL), started again --pause s later (a service manager's restart delay), and
the bench waits until its API answers. Printed:
- `answered_s`: per restart, from the kill until its API answered (pause included);
- `longest_silence_s`: the longest gap between two reports of any member that the
  scheduler saw (scheduler_role.longest_gap_s: restarts, pause and any other delay);
- `marked_down`, `requeued`: members marked down (logged) and burning jobs requeued.
Target: 0 marked down, 0 requeued, longest silence well under --down-after.

    python bench/member_restart.py [--restarts 10] [--queued 4000] [--down-after 10] [--pause 1.5] [--load 0] [--json]  (as root)
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

from bench.common import percentile, run_as_root  # noqa: E402 (after the path is set)
from bench.hog import CpuHog, describe  # noqa: E402
from tests.support.runs import burner_script  # noqa: E402


def run(restarts: int, queued: int, down_after_s: float, pause_s: float, load: int = 0) -> dict:
    with CpuHog(load, 3600) as hog:
        result = restart_members(restarts, queued, down_after_s, pause_s)
    result["busy"] = describe(hog)
    return result


def restart_members(restarts: int, queued: int, down_after_s: float, pause_s: float) -> dict:
    from bench.chaos import submit_as
    from tests.support.cluster import member_name, running_cluster
    from tests.support.node import wait_for
    from tests.support.users import temp_user

    burners = 2 * (os.cpu_count() or 1)
    seconds = 3600
    answered: list[float] = []
    loads: list[float] = []
    with temp_user("mtmr") as user, running_cluster(3, down_after_s=down_after_s) as cl:
        names = [member_name(m) for m in cl.members]
        sched = cl.scheduler()
        ids = {n: sched.submit_json(user, script=burner_script(n, burners, seconds))["job_id"] for n in names}
        wait_for("a burning job running on every member",
                 lambda: all(sched.job(j)["state"] == "running" for j in ids.values()), timeout_s=120)
        held = "#!/bin/bash\n#MTGPU after=afterany:" + ":".join(str(j) for j in ids.values()) + "\ntrue\n"
        for start in range(0, queued, 500):
            submit_as(user, str(sched.socket_path), held, f"0-{min(500, queued - start) - 1}")
        time.sleep(3.0)  # reports settle before the first kill
        for i in range(restarts):
            sched = cl.scheduler()
            victim = [m for m in cl.members if m is not sched][i % 2]
            victim.kill9()
            killed = time.monotonic()
            time.sleep(pause_s)
            victim.start(wait=False)
            victim.wait_up(timeout_s=120)
            answered.append(round(time.monotonic() - killed, 2))
            loads.append(round(os.getloadavg()[0], 1))
            time.sleep(2.0 + (i % 3))  # a report or two after it, at varied phases of the report second
        sched = cl.scheduler()
        nodes = json.loads(sched.admin("nodes", "--json").stdout)
        jobs = {n: sched.job(j) for n, j in ids.items()}
        marked_down = 0
        for m in cl.members:
            for path in m.log_files:
                marked_down += sum(1 for line in path.read_text(errors="replace").splitlines()
                                   if "member " in line and " is down: " in line)
        return {
            "restarts": restarts, "queued": queued, "down_after_s": down_after_s, "pause_s": pause_s,
            "cpus": os.cpu_count(), "burners_per_member": burners, "answered_s": answered,
            "answered_median_s": round(percentile(answered, 50), 2) if answered else None,
            "answered_max_s": max(answered, default=None),
            "longest_silence_s": round(max((n.get("longest_report_gap_s") or 0.0) for n in nodes), 2),
            "marked_down": marked_down + sum(1 for n in nodes if n["state"] == "down"),
            "requeued": sum(1 for j in jobs.values() if j["attempt"] > 0 or j["history"] or j["state"] != "running"),
            "load_average": [min(loads), max(loads)] if loads else [],
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--restarts", type=int, default=10, help="members killed and started again, one at a time")
    ap.add_argument("--queued", type=int, default=4000, metavar="N", help="jobs held in the queue (the state reloaded)")
    ap.add_argument("--down-after", type=float, default=10.0, help="MEMBER_DOWN_AFTER_S of the cluster")
    ap.add_argument("--pause", type=float, default=1.5, help="seconds between the kill and the start")
    ap.add_argument("--load", type=int, default=0, metavar="N", help="CPU-spinning processes beside it (bench/hog.py)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.restarts < 1 or args.queued < 0 or args.down_after < 3 or args.pause < 0 or args.load < 0:
        ap.error(f"--restarts must be at least 1, --queued, --pause and --load at least 0, --down-after at least 3, "
                 f"not {args.restarts}, {args.queued}, {args.pause}, {args.load}, {args.down_after}")
    r = run_as_root("member_restart.py", "a cluster of real members with a tenant's jobs", run, args.restarts,
                    args.queued, args.down_after, args.pause, args.load, why_not=_why_not)
    if isinstance(r, int):
        return r
    if args.json:
        print(json.dumps(r, indent=1))
        return 0
    print(f"{r['restarts']} restarts of a member of 3 (killed, started again after {r['pause_s']} s), each member's "
          f"job burning {r['burners_per_member']} loops on {r['cpus']} CPUs, {r['queued']} jobs queued, {r['busy']}")
    print(f"  API answered after the kill: median {r['answered_median_s']} s, at most {r['answered_max_s']} s "
          f"({', '.join(str(s) for s in r['answered_s'])})")
    print(f"  longest silence the scheduler saw: {r['longest_silence_s']} s of MEMBER_DOWN_AFTER_S {r['down_after_s']}")
    print(f"  marked down: {r['marked_down']}  burning jobs requeued: {r['requeued']}  "
          f"load average at the restarts: {r['load_average']}")
    return 0


def _why_not() -> str | None:
    from tests.support.users import can_create_users

    return can_create_users()


if __name__ == "__main__":
    sys.exit(main())

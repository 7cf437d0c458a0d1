"""Churn: real members killed and frozen while thousands of jobs run (issue 12's benchmark).

Four real `mtgpu-server` processes on loopback (two simulated GPUs each) form a cluster. A
temporary tenant submits --jobs one-GPU jobs as arrays; each job appends a start line and,
when it finishes, an end line to a marker file of its own. While jobs run, every
--every seconds one member (at random, the scheduler too) is either killed (SIGKILL) and
restarted 1.5 s later, as its service manager would, or frozen (SIGSTOP) for 3 s and
thawed; never two at once, so a majority always remains. Faults stop after --minutes;
then every job must end. Printed:

- `lost`: jobs that did not complete (any other final state, or never ended) or have no end line;
- `run_twice`: jobs with two end lines (ran to their end twice; an attempt stopped by
  fencing before its end is not a run);
- `stuck`: episodes of more than 30 s during which jobs were queued, a member that was
  neither killed nor frozen had a free GPU, and nothing was placed;
- `longest_gap_s`: the longest such interval without a placement.

Target: 0, 0, 0. Everything is removed at the end, also on failure or Ctrl-C.

What it did not do is said, never hidden in the totals: `asked` is --jobs, `jobs` what the
cluster holds for the bench's tenant (a submission whose answer was lost still counts, it is
found in the cluster's records), `submit_errors` the submissions that failed and were tried
again, `not_final` jobs that never ended; `complete` is false, the text says NOT COMPLETE and
the exit status is 1 when fewer jobs than asked were submitted or some never ended.

`--load N` runs N CPU-spinning processes beside it (bench/hog.py), and the load average
seen is printed.

    python bench/chaos.py [--minutes 5] [--jobs 5000] [--every 4] [--load 2] [--json]     (as root)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import run_as_root  # noqa: E402 (after the path is set)
from bench.hog import CpuHog, describe  # noqa: E402

STUCK_S = 30.0
SCRIPT = ("#!/bin/bash\n#MTGPU gpus=1\necho start $MTGPU_NODE >> {marks}/$MTGPU_JOB_ID\nsleep 0.2\n"
          "echo end $MTGPU_NODE >> {marks}/$MTGPU_JOB_ID\n")


def submit_as(user, socket_path: str, script: str, array: str) -> list[int]:
    """One array submission as the tenant (the node knows callers by SO_PEERCRED)."""
    import subprocess

    code = ("import json, sys\nfrom mtgpu.client.local import LocalClient\n"
            "with LocalClient(sys.argv[1], timeout_s=60) as c:\n"
            "    print(json.dumps(c.submit(sys.argv[2], {'array': sys.argv[3]})['job_ids']))\n")
    r = subprocess.run([sys.executable, "-c", code, socket_path, script, array], user=user.uid, group=user.gid,
                       extra_groups=[], capture_output=True, text=True, cwd=user.home, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "HOME": user.home, "PYTHONPATH": str(ROOT)})
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip()[-500:])
    return json.loads(r.stdout)


class Faults(threading.Thread):
    """Kills or freezes one member at a time, every `every` seconds, until stopped."""

    def __init__(self, cluster, every: float, seed: int) -> None:
        super().__init__(name="faults", daemon=True)
        self.cluster, self.every, self.rng = cluster, every, random.Random(seed)
        self.stop = threading.Event()
        self.faulted: set[str] = set()  # members killed or frozen right now
        self.lock = threading.Lock()
        self.log: list[tuple[float, str, str]] = []
        self.restarts: list[tuple[str, float]] = []  # (member, seconds from its start until it answered)

    def run(self) -> None:
        from tests.support.cluster import member_name

        while not self.stop.wait(self.every):
            m = self.rng.choice(self.cluster.members)
            name = member_name(m)
            kind = self.rng.choice(("kill", "freeze"))
            with self.lock:
                self.faulted.add(name)
            self.log.append((time.time(), kind, name))
            try:
                if kind == "kill":
                    m.kill9()
                    time.sleep(1.5)
                    began = time.time()
                    m.start(wait=False)
                    with contextlib.suppress(AssertionError):
                        m.wait_up(timeout_s=60)
                    self.restarts.append((name, round(time.time() - began, 1)))  # until its API answers
                else:
                    os.kill(m.proc.pid, signal.SIGSTOP)
                    time.sleep(3.0)
                    os.kill(m.proc.pid, signal.SIGCONT)
            finally:
                with self.lock:
                    self.faulted.discard(name)


def sample(cluster, faults: Faults) -> tuple[int, int, int] | None:
    """(queued jobs, free GPUs on members not faulted now, placements so far) from a live member."""
    from mtgpu.client.local import LocalClient
    from tests.support.cluster import member_name

    with faults.lock:
        faulted = set(faults.faulted)
    for m in cluster.members:
        if member_name(m) in faulted or m.proc is None or m.proc.poll() is not None:
            continue
        try:
            with LocalClient(str(m.socket_path), timeout_s=2) as c:
                nodes = c.nodes()
                jobs = c.jobs(all_tenants=True, active_only=True)
        except Exception:  # noqa: BLE001 - that member is busy or electing: ask another
            continue
        queued = sum(1 for j in jobs if j["state"] == "queued")
        free = sum(1 for n in nodes if n["name"] not in faulted and n["state"] == "up"
                   for g in n["gpus"] if not g["exclusive"] and g["committed_fraction"] == 0)
        running = sum(1 for j in jobs if j["state"] == "running")
        return queued, free, running
    return None


def run(minutes: float, jobs: int, every: float, seed: int, load: int = 0) -> dict:
    """The run, beside a CPU hog of `load` processes (none for 0)."""
    with CpuHog(load, minutes * 60 + 1800) as hog:
        result = churn(minutes, jobs, every, seed)
    result["load"], result["busy"] = load, describe(hog)
    result["load_average"] = [round(x, 1) for x in hog.load_range() or ()]
    return result


def churn(minutes: float, jobs: int, every: float, seed: int) -> dict:
    from mtgpu.client.local import LocalClient
    from tests.support.cluster import running_cluster
    from tests.support.node import wait_for
    from tests.support.users import temp_user

    with temp_user("mtch") as user, running_cluster(4, down_after_s=8.0) as cl:
        marks = Path(user.home) / "marks"
        marks.mkdir()
        os.chown(marks, user.uid, user.gid)
        script = SCRIPT.format(marks=marks)
        ids: list[int] = []
        faults = Faults(cl, every, seed)
        faults.start()
        t0 = time.time()
        chunk = 250  # arrays of this many; the next once fewer than half a chunk wait (the queue stays short)
        pending = list(range(0, jobs, chunk))
        stuck, longest, queued = 0, 0.0, 0
        submit_errors, last_submit_error = 0, ""
        last_change, last_started, episode_counted = time.time(), None, False
        deadline = t0 + minutes * 60
        while time.time() < deadline + 600:
            if pending and queued < chunk // 2:
                start = pending[0]
                live = [m for m in cl.members if m.proc is not None and m.proc.poll() is None]
                try:  # a failed submission is tried again (its jobs, if it was taken after all, are found below)
                    ids += submit_as(user, str(random.choice(live).socket_path), script,
                                     f"0-{min(chunk, jobs - start) - 1}")
                    pending.pop(0)
                except Exception as e:  # noqa: BLE001 - a member killed or frozen, an election: said in the result
                    submit_errors += 1
                    last_submit_error = f"{type(e).__name__}: {e}"[-300:]
            s = sample(cl, faults)
            now = time.time()
            if s is not None:
                queued, free, _running = s
                started = len(ids) - queued  # placed so far (a requeue takes one back)
                if queued == 0 or free == 0 or started != last_started:
                    last_change, episode_counted = now, False
                last_started = started
                idle = now - last_change
                longest = max(longest, idle)
                if idle > STUCK_S and not episode_counted:
                    stuck += 1
                    episode_counted = True
            if now >= deadline and not pending:
                break
            time.sleep(1.0)
        faults.stop.set()
        faults.join(timeout=120)
        for m in cl.members:  # every member up again
            if m.proc is None or m.proc.poll() is not None:
                m.start(wait=False)
        for m in cl.members:
            m.wait_up(timeout_s=60)
        sched = cl.scheduler()
        final = ("completed", "failed", "lost", "cancelled")
        with LocalClient(str(sched.socket_path), timeout_s=30) as c:
            with contextlib.suppress(AssertionError):
                wait_for("every job to end", lambda: not [j for j in c.jobs(all_tenants=True, active_only=True)],
                         timeout_s=600, interval_s=2.0)
            records = {j["id"]: j for j in c.jobs(all_tenants=True) if j.get("tenant") == user.name}
        # jobs whose submission's answer was lost (the member died after committing) are the tenant's too
        unanswered = sorted(set(records) - set(ids))
        ids = sorted(set(ids) | set(records))
        ends, lost, twice = {}, [], []
        for i in ids:
            lines = (marks / str(i)).read_text().splitlines() if (marks / str(i)).exists() else []
            ends[i] = sum(1 for x in lines if x.startswith("end"))
            state = records.get(i, {}).get("state")
            if state != "completed" or ends[i] == 0:
                lost.append({"id": i, "state": state, "reason": (records.get(i) or {}).get("reason")})
            if ends[i] > 1:  # with what the cluster recorded, and the faults near its requeued attempts
                rec = records.get(i) or {}
                twice.append({"id": i, "runs": lines, "attempt": rec.get("attempt"), "history": rec.get("history"),
                              "faults_near": [(round(t - t0, 1), k, n) for t, k, n in faults.log
                                              if any(h.get("started_at") and h["started_at"] - 30 <= t <= h["ended_at"]
                                                     for h in rec.get("history") or ())]})
        kills = sum(1 for _, k, _ in faults.log if k == "kill")
        not_final = sum(1 for i in ids if records.get(i, {}).get("state") not in final)
        return {"asked": jobs, "jobs": len(ids), "complete": len(ids) >= jobs and not not_final,
                "minutes": minutes, "kills": kills, "freezes": len(faults.log) - kills,
                "lost": len(lost), "run_twice": len(twice), "stuck": stuck, "longest_gap_s": round(longest, 1),
                "not_final": not_final, "submit_errors": submit_errors, "last_submit_error": last_submit_error,
                "unanswered_submissions_found": len(unanswered), "chunks_not_submitted": len(pending),
                "elapsed_s": round(time.time() - t0, 1), "lost_jobs": lost[:20], "twice_jobs": twice[:20],
                "restart_s_max": max((s for _, s in faults.restarts), default=None),
                "restarts_over_5s": [r for r in faults.restarts if r[1] > 5.0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=5.0, help="how long faults go on")
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--every", type=float, default=4.0, help="seconds between faults")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--load", type=int, default=0, metavar="N", help="CPU-spinning processes beside it (bench/hog.py)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.jobs < 1 or args.load < 0:
        ap.error(f"--jobs must be at least 1 and --load at least 0, not {args.jobs} and {args.load}")
    r = run_as_root("chaos.py", "real servers and a real tenant", run, args.minutes, args.jobs, args.every, args.seed,
                    args.load)
    if isinstance(r, int):
        return r
    if args.json:
        print(json.dumps(r))
        return 0 if r["complete"] else 1
    print(f"4 members on loopback, {r['jobs']} of {r['asked']} one-GPU jobs submitted; {r['kills']} kills and "
          f"{r['freezes']} freezes over {r['minutes']:g} min ({r['elapsed_s']} s in all); {r['busy']}")
    print(f"lost {r['lost']}, run twice {r['run_twice']}, stuck {r['stuck']} (longest gap with work and a free GPU "
          f"and no placement: {r['longest_gap_s']} s)  [target 0, 0, 0]")
    print(f"submissions that failed and were tried again: {r['submit_errors']}; jobs found whose submission's answer "
          f"was lost: {r['unanswered_submissions_found']}")
    if not r["complete"]:
        print(f"NOT COMPLETE: {r['jobs']} of {r['asked']} jobs submitted ({r['chunks_not_submitted']} arrays never "
              f"went in; last error: {r['last_submit_error'] or 'none'}), {r['not_final']} never ended: the totals "
              "above cover only what ran")
    for j in r["lost_jobs"] + r["twice_jobs"]:
        print(f"  {j}")
    return 0 if r["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())

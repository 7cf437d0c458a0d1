"""What preemption does to guaranteed jobs' wait (issue 28 point 7, docs/SCHEDULING.md
"Preemption"): the same workload replayed twice on the real scheduling path, once with
`[PREEMPTION] enabled = false` and once with it on, side by side.

The path is the server's, without processes: the state machine (every start, end and
preemption a command, checked as on a node), the scheduler role's view of it
(`build_snapshot` with the preemption policy, `build_queue`, `hold_preempted`) and the
pure scheduler, one pass every --tick simulated seconds. Jobs "run" for their duration in
simulated time; a preempted job checkpoints and exits --checkpoint seconds after its
SIGTERM (within the grace), and its requeued copy runs only what was left of its work.

Workload (seeded): --nodes nodes of 4 GPUs; at time 0 a backlog of --backlog
opportunistic jobs (gpus=1 gpu-mode=oversubscribe, 2 to 6 hours each) fills the idle
GPUs, more arrive at --opp-rate an hour; guaranteed jobs (exclusive, 1 GPU, or 2 one time
in four; exponential durations of mean --mean-min minutes) arrive at --rate an hour, for
--hours, then the replay runs until every guaranteed job ended.

Printed per variant: guaranteed jobs' wait from submission to start (mean, p50, p95,
max), how many ran, the GPU-hours of guaranteed and of opportunistic jobs (those share
GPUs: they may add up to more than the GPUs), preemptions, the simulated hours until the
last guaranteed job ended, and the wall time of the replay.

    python bench/preemption.py [--nodes 8] [--hours 12] [--rate 30] [--max-per-window 3] [--seed 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mtgpu.model.job import GpuAlternative, GpuMode, JobSpec, JobState  # noqa: E402
from mtgpu.sched import schedule  # noqa: E402
from mtgpu.server.member.view import PreemptPolicy, build_queue, build_snapshot, hold_preempted  # noqa: E402
from mtgpu.state import commands as C  # noqa: E402
from mtgpu.state.machine import StateMachine  # noqa: E402

GiB = 1024**3


def workload(args) -> list[tuple[float, str, int, float]]:
    """(submitted at, kind, gpus, work seconds), in time order."""
    rnd = random.Random(args.seed)
    jobs = [(0.0, "opp", 1, rnd.uniform(2, 6) * 3600) for _ in range(args.backlog)]
    horizon = args.hours * 3600
    t = 0.0
    while True:
        t += rnd.expovariate(args.rate / 3600)
        if t >= horizon:
            break
        jobs.append((t, "guaranteed", 2 if rnd.random() < 0.25 else 1, rnd.expovariate(1 / (args.mean_min * 60))))
    t = 0.0
    while args.opp_rate > 0:
        t += rnd.expovariate(args.opp_rate / 3600)
        if t >= horizon:
            break
        jobs.append((t, "opp", 1, rnd.uniform(2, 6) * 3600))
    return sorted(jobs, key=lambda j: j[0])


def ok(r: dict) -> dict:
    assert r["ok"], r
    return r


def replay(args, jobs, enabled: bool) -> dict:
    sm = StateMachine()
    ok(sm.apply(C.command(C.TENANT_ENSURE, name="lab", uid=5000, gid=5000, at=0.0)))
    for n in range(args.nodes):
        ok(sm.apply(C.command(C.NODE_REGISTER, name=f"n{n:02d}", cpus=64, mem_total_bytes=512 * GiB, at=0.0,
                              gpus=[{"index": i, "vendor": "nvidia", "model": "NVIDIA GeForce RTX 4090",
                                     "vram_total_bytes": 24 * GiB} for i in range(4)])))
    ok(sm.apply(C.command(C.SCHED_ELECT, node="n00", epoch=1, at=0.0)))
    policy = PreemptPolicy(enabled, args.grace, args.max_per_window, 3600.0)
    left: dict[int, float] = {}     # job -> work left (seconds)
    kind: dict[int, str] = {}
    ends: dict[int, float] = {}     # running job -> when it ends by itself
    began: dict[int, float] = {}    # running job -> when this attempt started
    waits: list[float] = []
    opp_gpu_s = guaranteed_gpu_s = 0.0
    preemptions = 0
    pending = list(jobs)
    t, i = 0.0, 0
    horizon = args.hours * 3600
    wall = time.perf_counter()
    while True:
        while i < len(pending) and pending[i][0] <= t:
            at, k, gpus, work = pending[i]
            i += 1
            mode = GpuMode.OVERSUBSCRIBE if k == "opp" else GpuMode.EXCLUSIVE
            spec = JobSpec(script="#!/bin/bash\ntrue\n", gpus=(GpuAlternative(gpus),), gpu_mode=mode, cpus=4)
            jid = ok(sm.apply(C.command(C.JOB_SUBMIT, tenant="lab", uid=5000, gid=5000, spec=spec.to_dict(),
                                        at=at)))["job_id"]
            left[jid], kind[jid] = work, k
        for job in list(sm.running_jobs()):
            jid = job.id
            end = ends[jid]
            if job.preempt is not None:
                end = min(end, job.preempt["at"] + args.checkpoint)
            if end <= t:
                ran = end - began[jid]
                gpus = sum(1 for a in job.allocations for _ in a.gpus)
                if kind[jid] == "opp":
                    opp_gpu_s += ran * gpus
                else:
                    guaranteed_gpu_s += ran * gpus
                left[jid] -= ran
                ok(sm.apply(C.command(C.JOB_FINISH, job_id=jid, exit_code=0, at=end, attempt=job.attempt)))
                del ends[jid], began[jid]
        queued = sm.queued_jobs()
        if t >= horizon and not any(kind[j.id] == "guaranteed" for j in queued) \
                and not any(kind[j.id] == "guaranteed" for j in sm.running_jobs()):
            break
        if queued:
            queue = build_queue(queued, sm.running_jobs())
            queue, _ = hold_preempted(sm.jobs, queue, t)
            plan = schedule(build_snapshot(sm, {}, policy, t), queue, t)
            for p in plan.placements:
                job = sm.jobs[p.job_id]
                ok(sm.apply(C.command(C.JOB_START, job_id=job.id, at=t, attempt=job.attempt, epoch=1,
                                      allocations=[a.to_dict() for a in p.allocations])))
                ends[job.id], began[job.id] = t + left[job.id], t
                if kind[job.id] == "guaranteed":
                    waits.append(t - job.submitted_at)
            for p in plan.preemptions:
                victim = sm.jobs[p.victim]
                ok(sm.apply(C.command(C.JOB_PREEMPT, job_id=victim.id, by=p.for_job, at=t, grace_s=args.grace,
                                      attempt=victim.attempt, epoch=1)))
                preemptions += 1
        t += args.tick
    wall = time.perf_counter() - wall
    waits.sort()
    total = sum(1 for k in kind.values() if k == "guaranteed")
    return {
        "preemption": enabled,
        "guaranteed_jobs": total,
        "guaranteed_ran": len(waits),
        "wait_mean_min": round(statistics.fmean(waits) / 60, 2) if waits else None,
        "wait_p50_min": round(waits[len(waits) // 2] / 60, 2) if waits else None,
        "wait_p95_min": round(waits[min(len(waits) - 1, int(len(waits) * 0.95))] / 60, 2) if waits else None,
        "wait_max_min": round(waits[-1] / 60, 2) if waits else None,
        "opportunistic_gpu_hours": round(opp_gpu_s / 3600, 1),
        "preemptions": preemptions,
        "requeued_after_preemption": sum(1 for j in sm.jobs.values() for h in j.history if "preempted_by" in h),
        "guaranteed_gpu_hours": round(guaranteed_gpu_s / 3600, 1),
        "simulated_h": round(t / 3600, 2),
        "wall_s": round(wall, 1),
        "state_ok": all(j.state in (JobState.COMPLETED, JobState.QUEUED, JobState.RUNNING) for j in sm.jobs.values()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--hours", type=float, default=12.0)
    ap.add_argument("--rate", type=float, default=30.0, help="guaranteed jobs an hour")
    ap.add_argument("--mean-min", type=float, default=30.0, help="guaranteed jobs' mean duration, minutes")
    ap.add_argument("--backlog", type=int, default=40, help="opportunistic jobs queued at time 0")
    ap.add_argument("--opp-rate", type=float, default=4.0, help="opportunistic jobs an hour")
    ap.add_argument("--grace", type=float, default=30.0)
    ap.add_argument("--max-per-window", type=int, default=3, help="[PREEMPTION] max_per_window (window 1h)")
    ap.add_argument("--checkpoint", type=float, default=10.0, help="seconds a preempted job takes to exit")
    ap.add_argument("--tick", type=float, default=15.0, help="simulated seconds between passes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    jobs = workload(args)
    results = [replay(args, jobs, False), replay(args, jobs, True)]
    if args.json:
        print(json.dumps(results))
        return 0
    print(f"{args.nodes} nodes x 4 GPUs, {args.hours:g} h of arrivals: {results[0]['guaranteed_jobs']} guaranteed "
          f"jobs ({args.rate:g}/h, mean {args.mean_min:g} min),")
    print(f"{args.backlog} opportunistic queued at 0 + {args.opp_rate:g}/h; grace {args.grace:g}s, checkpoint "
          f"{args.checkpoint:g}s, seed {args.seed}")
    cols = ["preemption", "guaranteed_ran", "wait_mean_min", "wait_p50_min", "wait_p95_min", "wait_max_min",
            "guaranteed_gpu_hours", "opportunistic_gpu_hours", "preemptions", "simulated_h", "wall_s"]
    heads = ["preempt", "ran", "w.mean", "w.p50", "w.p95", "w.max", "g.GPUh", "o.GPUh", "stops", "sim.h", "wall.s"]
    print("w.*: guaranteed jobs' wait, minutes; g.GPUh / o.GPUh: GPU-hours of guaranteed /")
    print("opportunistic jobs; stops: preemptions; sim.h: simulated hours until the last")
    print("guaranteed job ended")
    print(" ".join(f"{h:>6}" for h in heads))
    for r in results:
        print(" ".join(f"{('on' if r[c] else 'off') if c == 'preemption' else r[c]!s:>6}" for c in cols))
    return 0 if all(r["state_ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""One full scheduling pass on a synthetic fleet: how long, how many placements per second, peak memory.

A seeded fleet of mixed GPU models (about 20% CPU-only nodes) and a queue of mixed
requests from many tenants (exclusive, fractional and VRAM-shared, multi-GPU, gangs,
arrays with %K, CPU-only; most with time= limits, some pinned with server=) go
through `mtgpu.sched.schedule()` once, exactly as the server calls it.

    python bench/scale.py [--nodes 10000] [--tenants 5000] [--jobs 100000] [--seed 1] [--json] [--dump FILE]
                          [--drained]

--drained marks every node drained (as bench/submit_rate.py does): nothing can be
placed, and the pass measures what deciding a long waiting queue costs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import resource
import sys
import time
from pathlib import Path


if __package__ in (None, ""):  # run as a script from a checkout: import the checkout's mtgpu
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtgpu.model.cluster import ClusterSnapshot, GpuView, NodeView, PendingJob
from mtgpu.model.job import ArraySpec, GpuAlternative, GpuMode, JobSpec
from mtgpu.sched import frag, schedule

G = 1024**3
# (vendor, model, VRAM GiB, GPUs per node choices, share of GPU nodes)
MODELS = [
    ("nvidia", "rtx4090", 24, (2, 4, 8), 0.25),
    ("nvidia", "a100sxm480gb", 80, (4, 8), 0.2),
    ("nvidia", "h100", 80, (8,), 0.15),
    ("nvidia", "l40s", 48, (4, 8), 0.15),
    ("nvidia", "t4", 16, (1, 2, 4), 0.15),
    ("amd", "mi300x", 192, (8,), 0.1),
]


def make_fleet(n: int, rng: random.Random) -> list[NodeView]:
    nodes = []
    weights = [m[4] for m in MODELS]
    for i in range(n):
        name = f"node{i:05d}"
        if rng.random() < 0.2:
            nodes.append(NodeView(name, [], cpus_total=rng.choice((32, 64, 128)), mem_total_bytes=rng.choice((128, 256, 512)) * G))
            continue
        vendor, model, vram, counts, _ = rng.choices(MODELS, weights)[0]
        k = rng.choice(counts)
        gpus = [GpuView(j, vendor, model, vram * G) for j in range(k)]
        nodes.append(NodeView(name, gpus, cpus_total=16 * k, mem_total_bytes=64 * k * G))
    return nodes


def make_queue(n_jobs: int, n_tenants: int, n_nodes: int, rng: random.Random) -> list[PendingJob]:
    queue: list[PendingJob] = []
    job_id = 0
    while len(queue) < n_jobs:
        tenant = f"t{rng.randrange(n_tenants):04d}"
        x = rng.random()
        time_s = rng.choice((None, 3600.0, 4 * 3600.0, 86400.0)) if rng.random() < 0.8 else None
        prio = rng.choice((0, 0, 0, 1, 5))
        common = dict(cpus=float(rng.choice((2, 4, 8))), mem_bytes=rng.choice((8, 16, 32)) * G,
                      time_limit_s=time_s, priority=prio)
        model = rng.choice((None, None, "rtx4090", "a100", "h100", "l40s", "t4"))
        if x < 0.35:
            spec = JobSpec(gpus=(GpuAlternative(1, None, model),), **common)
        elif x < 0.45:
            spec = JobSpec(gpus=(GpuAlternative(float(rng.choice((2, 4, 8))), None, model),), **common)
        elif x < 0.62:
            spec = JobSpec(gpus=(GpuAlternative(rng.choice((0.25, 0.5)), None, model),), **common)
        elif x < 0.70:
            spec = JobSpec(gpus=(GpuAlternative(1, None, None),), vram_bytes=rng.choice((8, 12, 20)) * G,
                           gpu_mode=GpuMode.SHARED, **common)
        elif x < 0.72:
            spec = JobSpec(gpus=(GpuAlternative(1, "nvidia", None),), gpu_mode=GpuMode.OVERSUBSCRIBE, **common)
        elif x < 0.75:
            spec = JobSpec(gpus=(GpuAlternative(8, None, rng.choice(("h100", "a100"))),), nodes=rng.choice((2, 4)), **common)
        elif x < 0.77:
            spec = JobSpec(gpus=(GpuAlternative(1, None, None),), server=f"node{rng.randrange(n_nodes):05d}", **common)
        elif x < 0.985:
            spec = JobSpec(**common)
        else:  # an array of 10..50 tasks, at most 5 at a time
            k = rng.choice((10, 20, 50))
            spec = JobSpec(gpus=(GpuAlternative(1, None, model),), array=ArraySpec(tuple(range(k)), 5), **common)
            parent = job_id + 1
            for _ in range(k):
                job_id += 1
                queue.append(PendingJob(job_id, tenant, spec, submitted_at=rng.uniform(0, 86400), array_parent=parent))
            continue
        job_id += 1
        queue.append(PendingJob(job_id, tenant, spec, submitted_at=rng.uniform(0, 86400)))
    return queue[:n_jobs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--tenants", type=int, default=5000)
    ap.add_argument("--jobs", type=int, default=100000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--drained", action="store_true", help="every node drained: only waiting verdicts")
    ap.add_argument("--dump", type=Path, help="write the plan (placements, pending and rejected reasons) to this file")
    ap.add_argument("--no-jit", action="store_true",
                    help="score with frag.py's numpy forms, not the compiled ones (sched/fragjit.py): the A/B")
    args = ap.parse_args(argv)
    if args.no_jit:
        frag._JIT[:] = [None]
    # The compiled scoring is imported and loaded from numba's cache once per process (about
    # 1 s: numba's import, the machine code read and linked), as a scheduler does at its first
    # pass on a big fleet: here before the timed pass, and said, as replay_openb.py does.
    jit_load_s = None
    if frag.jit() is not None:
        t0 = time.perf_counter()
        frag.jit().warm()
        jit_load_s = time.perf_counter() - t0
    rng = random.Random(args.seed)
    fleet = make_fleet(args.nodes, rng)
    if args.drained:
        fleet = [dataclasses.replace(n, schedulable=False, unschedulable_reason="drained by an admin") for n in fleet]
    snapshot = ClusterSnapshot(nodes=fleet)
    queue = make_queue(args.jobs, args.tenants, args.nodes, rng)
    t0, c0 = time.perf_counter(), time.process_time()
    plan = schedule(snapshot, queue, now=86400.0)
    pass_s = time.perf_counter() - t0
    pass_cpu_s = time.process_time() - c0  # on a shared machine, steadier than the wall clock
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.dump:  # every decision, to check that an engine change keeps them
        with open(args.dump, "w") as f:
            for p in plan.placements:
                f.write(f"P {p.job_id} " + " ".join(
                    f"{a.node}:" + ",".join(f"{g.index}/{g.fraction:.6g}" for g in a.gpus) for a in p.allocations) + "\n")
            for jid, r in sorted(plan.pending.items()):
                f.write(f"W {jid} {r}\n")
            for jid, r in sorted(plan.rejected.items()):
                f.write(f"R {jid} {r}\n")
    out = {
        "placements_per_s": round(len(plan.placements) / pass_s, 1),
        "pass_s": round(pass_s, 3),
        "pass_cpu_s": round(pass_cpu_s, 3),
        "placements_per_cpu_s": round(len(plan.placements) / pass_cpu_s, 1),
        "peak_rss_mb": round(rss_mb, 1),
        "placed": len(plan.placements),
        "pending": len(plan.pending),
        "rejected": len(plan.rejected),
        "decisions_per_s": round(len(queue) / pass_s, 1),
        "nodes": args.nodes,
        "gpus": sum(len(n.gpus) for n in snapshot.nodes),
        "jobs": len(queue),
        "drained": args.drained,
        "jit_load_s": None if jit_load_s is None else round(jit_load_s, 3),
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{out['nodes']} nodes ({out['gpus']} GPUs{', all drained' if args.drained else ''}), "
              f"{out['jobs']} queued jobs of {args.tenants} tenants")
        print(f"  one pass: {out['pass_s']:.2f} s ({out['pass_cpu_s']:.2f} s of CPU); placed {out['placed']}, "
              f"pending {out['pending']}, "
              f"rejected {out['rejected']}")
        print(f"  {out['placements_per_s']:.0f} placements/s ({out['decisions_per_s']:.0f} jobs decided/s); "
              f"peak RSS {out['peak_rss_mb']:.0f} MB")
        if jit_load_s is not None:
            print(f"  compiled scoring loaded before the timed pass: {jit_load_s:.2f} s (not counted)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

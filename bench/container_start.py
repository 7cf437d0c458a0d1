"""Container job start latency and image staging throughput (container jobs' benchmark).

Starts a real standalone node with `[CONTAINERS] enabled = true` and a busybox image
staged, and one temporary tenant. Then, as that tenant (a worker process running as
the tenant's uid: the node knows callers by SO_PEERCRED):

- start latency: N container jobs (`#MTGPU container=IMAGE`), one at a time (each ends
  before the next is submitted, so this is start latency, not queueing), submitted over
  the node's Unix socket with the Python client (the CLI's own start-up is not counted).
  Each job's first instruction is `touch $HOME/marks/job-I`; latency = the file's mtime
  (the kernel's realtime clock, coarse: a few ms) minus time.time() just before the
  submit request was sent. Each job is also split at its placement (the job record's
  started_at): submit -> placed (scheduling) and placed -> first instruction (launch,
  shim, podman).
- the floor, interleaved with the jobs: `podman run --rm --pull=never --userns=keep-id
  -v HOME:HOME IMAGE touch HOME/marks/bare-I` run by the same tenant with the node's
  podman settings for it (POST /v1/podman/env, what `mt-podman` uses), timed from just
  before the podman process is started to the file's mtime. Overhead = start p50 - bare
  p50; target < 150 ms.
- for reference, the same N as native jobs (`touch`, no container).

Then, as root, image staging: an image of a busybox root filesystem plus --big-mb MiB
of random bytes (`podman import`) goes through the node's staging path,
`ImageStore.stage()` (root `podman save` to an archive named by its SHA-256) then
`ImageStore.ensure_loaded()` (digest verified, `podman load` as the tenant), against the
pipe floor `podman save IMAGE | podman load` (root's save piped into the tenant's load,
the same settings). The image is removed from the tenant's store before each
measurement; 3 of each, alternated, medians reported; MB = 10^6 bytes of the archive.
Target: staging >= 80% of the pipe. Also printed: stage() and ensure_loaded() apart (the
latter is what a tenant's first job in a staged image waits for) and the seconds of each
podman call and digest inside them.

Everything it creates (node, tenant, images in root's store, archives, temp files) is
removed at the end, also on failure, Ctrl-C or SIGTERM.

    python bench/container_start.py [--jobs 100] [--big-mb 256] [--reps 3] [--json]     (as root)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402 (after the path is set)
    percentile, podman_or_users_missing, run_as_root, tenant_node, worker_as, worker_podman)

START_TARGET_MS = 150.0
STAGE_TARGET = 0.8
JOB_TIMEOUT_S = 120.0


# ------------------------------------------------------------------ the tenant's side
def worker(socket_path: str, image: str, jobs: int) -> dict:
    """Runs as the tenant: container jobs, bare podman runs and native jobs, interleaved."""
    from mtgpu.client.local import LocalClient

    home = os.environ["HOME"]
    marks = Path(home) / "marks"
    marks.mkdir(exist_ok=True)
    deadline_total = time.monotonic() + jobs * 3 * JOB_TIMEOUT_S

    with LocalClient(socket_path, timeout_s=60) as c:
        podman, penv = worker_podman(c)

        def job(tag: str, container: bool) -> dict:
            mark = marks / tag
            head = f"#!/bin/sh\n#MTGPU container={image}\n" if container else "#!/bin/sh\n"
            script = head + f"touch $HOME/marks/{tag}\n"
            t0 = time.time()
            job_id = c.submit(script, workdir=home)["job_id"]
            deadline = time.monotonic() + JOB_TIMEOUT_S
            mtime_ns, polls = None, 0
            while mtime_ns is None:
                try:
                    mtime_ns = mark.stat().st_mtime_ns
                    break
                except FileNotFoundError:
                    pass
                polls += 1
                if polls % 25 == 0:
                    j = c.job(job_id)
                    if j["state"] in ("completed", "failed", "cancelled"):
                        try:
                            mtime_ns = mark.stat().st_mtime_ns
                            break
                        except FileNotFoundError:
                            raise SystemExit(f"job {job_id} ended {j['state']} without its first instruction: "
                                             f"{(j.get('reason') or '')[:800]}") from None
                if time.monotonic() > deadline:
                    raise SystemExit(f"job {job_id} did not start within {JOB_TIMEOUT_S:.0f} s")
                time.sleep(0.002)
            while True:  # the next job is submitted once this one has ended
                j = c.job(job_id)
                if j["state"] in ("completed", "failed", "cancelled"):
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"job {job_id} did not end within {JOB_TIMEOUT_S:.0f} s")
                time.sleep(0.01)
            if j["state"] != "completed":
                raise SystemExit(f"job {job_id} ended {j['state']}: {(j.get('reason') or '')[:800]}")
            first = mtime_ns / 1e9
            placed = j.get("started_at") or first
            return {"ms": (first - t0) * 1000, "to_placed_ms": (placed - t0) * 1000,
                    "placed_to_first_ms": (first - placed) * 1000}

        def bare(tag: str) -> float:
            target = f"{home}/marks/{tag}"
            argv = [podman, "run", "--rm", "--pull=never", "--userns=keep-id", "-v", f"{home}:{home}",
                    image, "touch", target]
            t0 = time.time()
            r = subprocess.run(argv, env=penv, cwd=home, stdin=subprocess.DEVNULL, capture_output=True,
                               timeout=JOB_TIMEOUT_S)
            if r.returncode != 0:
                raise SystemExit(f"bare podman run exited {r.returncode}: {r.stderr.decode(errors='replace')[-800:]}")
            return (os.stat(target).st_mtime_ns / 1e9 - t0) * 1000

        # Warm-up, not counted: the first container job loads the image into the tenant's
        # store (ensure_loaded) and the first podman calls fill caches.
        for i in range(2):
            job(f"warm-job-{i}", True)
            bare(f"warm-bare-{i}")
            job(f"warm-native-{i}", False)
        start, bare_ms, native = [], [], []
        for i in range(jobs):
            if time.monotonic() > deadline_total:
                raise SystemExit("the bench ran past its time bound")
            start.append(job(f"job-{i}", True))
            bare_ms.append(bare(f"bare-{i}"))
            native.append(job(f"native-{i}", False)["ms"])
    return {"start": start, "bare": bare_ms, "native": native}


# ------------------------------------------------------------------ root's side
@contextlib.contextmanager
def big_image(mb: int):
    """busybox rootfs + MB MiB of random bytes, imported into root's store; removed on exit."""
    from tests.support.images import busybox_rootfs

    name = f"localhost/mtgpu-bench-big-{secrets.token_hex(3)}:1"
    d = Path(tempfile.mkdtemp(prefix="mtgpu-bench-rootfs-"))
    try:
        try:
            rootfs = busybox_rootfs(d / "rootfs")
            with open(rootfs / "payload.bin", "wb") as f:
                for _ in range(mb):
                    f.write(os.urandom(1 << 20))
            tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
            r = subprocess.run(["podman", "import", "-", name], stdin=tar.stdout, capture_output=True, timeout=600)
            tar.stdout.close()
            tar.wait(timeout=60)
            if r.returncode != 0:
                raise SystemExit(f"podman import failed: {r.stderr.decode(errors='replace')}")
        finally:
            shutil.rmtree(d, ignore_errors=True)
        yield name
    finally:
        subprocess.run(["podman", "rmi", "--force", name], capture_output=True, timeout=300)


def staging(node, user, mb: int, reps: int) -> dict:
    """The node's staging path (stage + ensure_loaded) against `podman save | podman load`."""
    from mtgpu.agent.podman import images as images_mod
    from mtgpu.agent.podman.images import ImageStore
    from mtgpu.agent.podman.tenant import PODMAN, PodmanHost, TenantPodman

    parts: dict[str, float] = {}

    def add(key: str, dt: float) -> None:
        parts[key] = parts.get(key, 0.0) + dt

    class TimedTenant(TenantPodman):
        def run(self, args, **kw):
            t0 = time.perf_counter()
            try:
                return super().run(args, **kw)
            finally:
                add("tenant podman " + " ".join(a for a in args[:2] if not a.startswith("-")), time.perf_counter() - t0)

    class TimedStore(ImageStore):
        def _root_podman(self, args, timeout_s=1800):
            t0 = time.perf_counter()
            try:
                return super()._root_podman(args, timeout_s)
            finally:
                add("root podman " + " ".join(a for a in args[:2] if not a.startswith("-")), time.perf_counter() - t0)

    def timed(label: str, fn):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                add(label, time.perf_counter() - t0)
        return wrapper

    # The module's helpers that read the whole archive (or its index), timed where they exist.
    patched = {attr: getattr(images_mod, attr) for attr in ("file_digest", "archive_image_id")
               if hasattr(images_mod, attr)}
    labels = {"file_digest": "sha256 of the archive", "archive_image_id": "image id from the archive"}

    host = PodmanHost(node.state_dir)
    host.prepare(user.uid, user.gid, user.home)  # the node did this already: a no-op that checks it
    t = host.tenant(user.uid, user.gid, user.home)
    tenant = TimedTenant(t.uid, t.gid, t.home, t.conf, t.storage_conf, t.graph_root, t.runtime_dir)
    root_env = {"CONTAINERS_CONF": str(host.root / "containers.conf"),
                "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
    work = Path(tempfile.mkdtemp(prefix="mtgpu-bench-stage-"))
    stage_s, pipe_s, archive_bytes, breakdowns, split = [], [], 0, [], []

    def forget_image(name: str) -> None:
        r = t.run(["rmi", "--force", "--ignore", name], timeout_s=300)
        if r.returncode != 0:
            raise SystemExit(f"podman rmi as the tenant failed: {r.stderr.decode(errors='replace')[-800:]}")

    def pipe_once(name: str) -> float:
        forget_image(name)
        t0 = time.perf_counter()
        save = subprocess.Popen([PODMAN, "save", "--quiet", "--format", "docker-archive", name], env=root_env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd="/")
        load = subprocess.Popen([PODMAN, "load", "--quiet"], env=t.env(), user=t.uid, group=t.gid, extra_groups=[],
                                stdin=save.stdout, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/")
        save.stdout.close()
        try:
            _, load_err = load.communicate(timeout=900)
            _, save_err = save.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            save.kill()
            load.kill()
            raise SystemExit("podman save | podman load took over 15 minutes") from None
        dt = time.perf_counter() - t0
        if save.returncode != 0 or load.returncode != 0:
            raise SystemExit(f"podman save | load failed: {save_err.decode(errors='replace')[-400:]} "
                             f"{load_err.decode(errors='replace')[-400:]}")
        return dt

    def stage_once(name: str, rep: int) -> float:
        nonlocal archive_bytes
        forget_image(name)
        store = TimedStore(work / f"images-{rep}", root_env)
        store.setup()
        parts.clear()
        t0 = time.perf_counter()
        digest = store.stage(name)
        t1 = time.perf_counter()
        loaded = store.ensure_loaded(tenant, name)
        dt = time.perf_counter() - t0
        split.append((t1 - t0, dt - (t1 - t0)))
        loaded_digest = loaded[0] if isinstance(loaded, tuple) else loaded  # (digest, image id) or digest
        if loaded_digest != digest:
            raise SystemExit(f"ensure_loaded returned {loaded}, not the staged {digest}")
        archive = store.archive(digest)
        archive_bytes = archive.stat().st_size
        breakdowns.append(dict(parts))
        shutil.rmtree(store.dir, ignore_errors=True)
        return dt

    for attr, fn in patched.items():
        setattr(images_mod, attr, timed(labels[attr], fn))
    try:
        with big_image(mb) as name:
            pipe_once(name)  # warm-up, not counted: root's layer into the page cache
            for rep in range(reps):
                if rep % 2 == 0:
                    stage_s.append(stage_once(name, rep))
                    pipe_s.append(pipe_once(name))
                else:
                    pipe_s.append(pipe_once(name))
                    stage_s.append(stage_once(name, rep))
            forget_image(name)
    finally:
        for attr, fn in patched.items():
            setattr(images_mod, attr, fn)
        shutil.rmtree(work, ignore_errors=True)
    mbytes = archive_bytes / 1e6
    stage_med, pipe_med = statistics.median(stage_s), statistics.median(pipe_s)
    keys = sorted({k for b in breakdowns for k in b})
    return {"archive_mb": round(mbytes, 1), "stage_s": [round(x, 2) for x in stage_s],
            "pipe_s": [round(x, 2) for x in pipe_s], "stage_mb_s": round(mbytes / stage_med, 1),
            "pipe_mb_s": round(mbytes / pipe_med, 1), "stage_vs_pipe": round(pipe_med / stage_med, 3),
            "stage_only_s": round(statistics.median(a for a, _ in split), 2),
            "ensure_loaded_s": round(statistics.median(b for _, b in split), 2),
            "load_mb_s": round(mbytes / statistics.median(b for _, b in split), 1),
            "stage_breakdown_s": {k: round(statistics.median(b.get(k, 0.0) for b in breakdowns), 2) for k in keys}}


def run(jobs: int, big_mb: int, reps: int) -> dict:
    os.chdir(ROOT)
    with tenant_node("bb", lambda image: {"images": [image]}, "mtbc") as (image, node, user):
        w = worker_as(user, node, __file__, ["--jobs", str(jobs), "--worker", str(node.socket_path), image],
                      timeout_s=jobs * 30 + 600)
        stage = staging(node, user, big_mb, reps)

    start = [s["ms"] for s in w["start"]]
    start_p50, bare_p50 = percentile(start, 50), percentile(w["bare"], 50)
    overhead = start_p50 - bare_p50
    result = {
        "jobs": jobs,
        "start_p50_ms": round(start_p50, 1),
        "start_p99_ms": round(percentile(start, 99), 1),
        "start_max_ms": round(max(start), 1),
        "submit_to_placed_p50_ms": round(percentile([s["to_placed_ms"] for s in w["start"]], 50), 1),
        "placed_to_first_p50_ms": round(percentile([s["placed_to_first_ms"] for s in w["start"]], 50), 1),
        "bare_p50_ms": round(bare_p50, 1),
        "bare_p99_ms": round(percentile(w["bare"], 99), 1),
        "native_p50_ms": round(percentile(w["native"], 50), 1),
        "native_p99_ms": round(percentile(w["native"], 99), 1),
        "overhead_p50_ms": round(overhead, 1),
        **stage,
    }
    result["targets_met"] = {"start_overhead_lt_150ms": overhead < START_TARGET_MS,
                             "stage_ge_80pct_of_pipe": result["stage_vs_pipe"] >= STAGE_TARGET}
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--big-mb", type=int, default=256, help="MiB of random bytes in the staging image")
    ap.add_argument("--reps", type=int, default=3, help="staging and pipe measurements each (median reported)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", nargs=2, metavar=("SOCKET", "IMAGE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1], args.jobs)))
        return 0
    r = run_as_root("container_start.py", "a real node, a real tenant and root's podman", run, args.jobs, args.big_mb,
                    args.reps, why_not=podman_or_users_missing)
    if isinstance(r, int):
        return r
    if args.json:
        print(json.dumps(r))
        return 0
    met = r["targets_met"]
    print(f"standalone node, rootless podman {_podman_version()}; {r['jobs']} container jobs one at a time as a tenant")
    print(f"submit -> first instruction in the container: p50 {r['start_p50_ms']} ms, p99 {r['start_p99_ms']} ms "
          f"(max {r['start_max_ms']}); p50 submit -> placed {r['submit_to_placed_p50_ms']} ms, "
          f"placed -> first instruction {r['placed_to_first_p50_ms']} ms")
    print(f"bare `podman run` -> first instruction: p50 {r['bare_p50_ms']} ms, p99 {r['bare_p99_ms']} ms; "
          f"native jobs: p50 {r['native_p50_ms']} ms, p99 {r['native_p99_ms']} ms")
    print(f"overhead over bare podman: {r['overhead_p50_ms']} ms at p50  [target < {START_TARGET_MS:.0f} ms: "
          f"{'met' if met['start_overhead_lt_150ms'] else 'NOT met'}]")
    print(f"staging a {r['archive_mb']} MB archive: stage + ensure_loaded {r['stage_mb_s']} MB/s "
          f"({', '.join(map(str, r['stage_s']))} s), podman save | podman load {r['pipe_mb_s']} MB/s "
          f"({', '.join(map(str, r['pipe_s']))} s): {100 * r['stage_vs_pipe']:.0f}% of the pipe  "
          f"[target >= {100 * STAGE_TARGET:.0f}%: {'met' if met['stage_ge_80pct_of_pipe'] else 'NOT met'}]")
    print(f"  of which stage() {r['stage_only_s']} s, ensure_loaded() {r['ensure_loaded_s']} s (a tenant's first use "
          f"of a staged image: {r['load_mb_s']} MB/s)")
    print("  staging, median seconds per step: " + ", ".join(f"{k} {v}" for k, v in r["stage_breakdown_s"].items()))
    return 0


def _podman_version() -> str:
    try:
        return subprocess.run(["podman", "--version"], capture_output=True, text=True, timeout=30).stdout.split()[-1]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "?"


if __name__ == "__main__":
    raise SystemExit(main())

"""Workspace readiness: `mt-container create --template T` until a command has run inside,
beside the bare Podman pair (`podman run -d` + `podman exec`) of the same image.

Starts a real standalone node with `[CONTAINERS] enabled = true`, a busybox image staged
and a template `plain` of it, and one temporary tenant. Then, as that tenant (a worker
process running as the tenant's uid: the node knows callers by SO_PEERCRED), N times,
alternating:

- ready: the create request over the node's Unix socket with the Python client (what
  `mt-container create` sends; the CLI's own start-up is not counted), then the
  workspace is polled until its member has started its container, then `podman exec
  NAME true` as `mt-container exec` runs it (a forked child has the node move it into the
  workspace's cgroup, POST /v1/podman/env with `enter`, then execs podman) is tried until
  it succeeds. Ready = that exec's end minus the moment just
  before the create request. Each workspace is removed (`rm`) and its container gone
  before the next one is created (not counted).
- bare: `podman run -d --pull=never --userns=keep-id IMAGE sleep-loop` then `podman exec
  NAME true`, as the same tenant with the same settings; then `podman rm -f` (not counted).

With `--bind`, each workspace (a devcontainer request naming the same image) and each bare
run also bind-mount a folder of the tenant's home at /src: a workspace with a bind of its
tenant's is made in steps (podman create, init in the job's cgroup, the mounted inodes
checked, start: runners/podman.py), which this measures.

Target: ready p50 within 300 ms of bare p50. Everything it creates is removed at the end,
also on failure, Ctrl-C or SIGTERM.

    python bench/workspace_ready.py [--workspaces 30] [--bind] [--json]     (as root)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402 (after the path is set)
    percentile, podman_or_users_missing, run_as_root, tenant_node, worker_as, worker_podman)

TARGET_MS = 300.0
STEP_TIMEOUT_S = 120.0
IDLE = ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"]


# ------------------------------------------------------------------ the tenant's side
def worker(socket_path: str, image: str, count: int, bind: bool = False) -> dict:
    from mtgpu.client.local import LocalClient

    home = os.environ["HOME"]
    src = os.path.join(home, "bench-src")
    if bind:
        os.makedirs(src, exist_ok=True)
    deadline_total = time.monotonic() + count * 4 * STEP_TIMEOUT_S
    with LocalClient(socket_path, timeout_s=60) as c:
        podman, penv = worker_podman(c)

        def pod(*args: str, check: bool = True) -> subprocess.CompletedProcess:
            r = subprocess.run([podman, *args], env=penv, cwd=home, stdin=subprocess.DEVNULL, capture_output=True,
                               timeout=STEP_TIMEOUT_S)
            if check and r.returncode != 0:
                raise SystemExit(f"podman {' '.join(args[:2])} exited {r.returncode}: "
                                 f"{r.stderr.decode(errors='replace')[-800:]}")
            return r

        def entered_exec(container: str) -> int:
            """`podman exec CONTAINER true` as `mt-container exec` runs it: a child process
            (forked, so no interpreter start-up is counted) has the node move it into the
            workspace's cgroup (POST /v1/podman/env with `enter`), then execs podman."""
            pid = os.fork()
            if pid == 0:
                try:
                    with LocalClient(socket_path, timeout_s=60) as own:
                        if own.podman_env(enter=container).get("entered") is None:
                            os._exit(3)
                    null = os.open(os.devnull, os.O_RDWR)
                    for fd in (0, 1, 2):
                        os.dup2(null, fd)
                    os.execve(podman, [podman, "exec", container, "true"], penv)
                finally:
                    os._exit(127)
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

        def ours(tag: str) -> dict:
            t0 = time.time()
            request = {"template": "plain", "name": tag}
            if bind:
                request = {"name": tag, "devcontainer": {"path": f"{home}/bench/.devcontainer/devcontainer.json",
                                                         "image": image, "mounts": [[src, "/src", False]]}}
            name = c.create_workspace(request)["name"]
            deadline = time.monotonic() + STEP_TIMEOUT_S
            while True:
                ws = c.workspace(name)
                if ws["state"] == "running" and ws["workspace"]["container"]:
                    break
                if ws["state"] not in ("queued", "running") or time.monotonic() > deadline:
                    raise SystemExit(f"workspace {name} is {ws['state']}: {ws['reason'][:800]}")
                time.sleep(0.002)
            t_started = time.time()
            container = ws["workspace"]["container"]
            tries = 0
            while entered_exec(container) != 0:
                tries += 1
                if time.monotonic() > deadline:
                    raise SystemExit(f"workspace {name}: no command ran inside within {STEP_TIMEOUT_S:.0f} s")
                time.sleep(0.005)
            t_ready = time.time()
            placed = ws.get("started_at") or t_started
            c.workspace_action(name, "rm")
            while True:  # gone, container too, before the next one
                listed = [w for w in c.workspaces() if w["workspace"]["name"] == name]
                if not listed and pod("container", "exists", container, check=False).returncode != 0:
                    break
                if time.monotonic() > deadline + STEP_TIMEOUT_S:
                    raise SystemExit(f"workspace {name} was not removed within {2 * STEP_TIMEOUT_S:.0f} s")
                time.sleep(0.02)
            return {"ms": (t_ready - t0) * 1000, "to_placed_ms": (placed - t0) * 1000,
                    "to_started_ms": (t_started - t0) * 1000, "exec_tries": tries}

        def bare(tag: str) -> float:
            t0 = time.time()
            pod("run", "-d", "--pull=never", "--userns=keep-id", "--name", tag, *(["-v", f"{src}:/src"] if bind else []),
                image, *IDLE)
            pod("exec", tag, "true")
            dt = (time.time() - t0) * 1000
            pod("rm", "--force", "--time", "0", tag)
            return dt

        for i in range(2):  # warm-up, not counted: first loads of the image and podman's caches
            ours(f"warm{i}")
            bare(f"bare-warm-{i}")
        ready, bare_ms = [], []
        for i in range(count):
            if time.monotonic() > deadline_total:
                raise SystemExit("the bench ran past its time bound")
            if i % 2 == 0:
                ready.append(ours(f"ws{i}"))
                bare_ms.append(bare(f"bare-{i}"))
            else:
                bare_ms.append(bare(f"bare-{i}"))
                ready.append(ours(f"ws{i}"))
    return {"ready": ready, "bare": bare_ms}


# ------------------------------------------------------------------ root's side
def run(count: int, bind: bool = False) -> dict:
    os.chdir(ROOT)
    with tenant_node("ws", lambda image: {"templates": {"plain": image}}, "mtbw") as (image, node, user):
        w = worker_as(user, node, __file__, ["--workspaces", str(count), *(["--bind"] if bind else []),
                                                 "--worker", str(node.socket_path), image],
                      timeout_s=count * 60 + 600)
    ready = [x["ms"] for x in w["ready"]]
    ready_p50, bare_p50 = percentile(ready, 50), percentile(w["bare"], 50)
    return {
        "workspaces": count,
        "bind": bind,
        "ready_p50_ms": round(ready_p50, 1),
        "ready_p99_ms": round(percentile(ready, 99), 1),
        "ready_max_ms": round(max(ready), 1),
        "to_placed_p50_ms": round(percentile([x["to_placed_ms"] for x in w["ready"]], 50), 1),
        "to_started_p50_ms": round(percentile([x["to_started_ms"] for x in w["ready"]], 50), 1),
        "exec_tries_p50": percentile([x["exec_tries"] for x in w["ready"]], 50),
        "bare_p50_ms": round(bare_p50, 1),
        "bare_p99_ms": round(percentile(w["bare"], 99), 1),
        "overhead_p50_ms": round(ready_p50 - bare_p50, 1),
        "target_met": ready_p50 - bare_p50 <= TARGET_MS,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workspaces", type=int, default=30)
    ap.add_argument("--bind", action="store_true", help="each workspace and bare run mounts a folder of the home")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", nargs=2, metavar=("SOCKET", "IMAGE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1], args.workspaces, args.bind)))
        return 0
    r = run_as_root("workspace_ready.py", "a real node, a real tenant and root's podman", run, args.workspaces, args.bind,
                    why_not=podman_or_users_missing)
    if isinstance(r, int):
        return r
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"standalone node, rootless podman; {r['workspaces']} workspaces one at a time as a tenant"
          + (", each with a bind mount of a folder of the home" if r["bind"] else ""))
    print(f"create -> a command ran inside: p50 {r['ready_p50_ms']} ms, p99 {r['ready_p99_ms']} ms "
          f"(max {r['ready_max_ms']}); p50 create -> placed {r['to_placed_p50_ms']} ms, -> its container started "
          f"{r['to_started_p50_ms']} ms")
    print(f"bare `podman run -d` + `podman exec`: p50 {r['bare_p50_ms']} ms, p99 {r['bare_p99_ms']} ms")
    print(f"overhead over the bare pair: {r['overhead_p50_ms']} ms at p50  [target <= {TARGET_MS:.0f} ms: "
          f"{'met' if r['target_met'] else 'NOT met'}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())

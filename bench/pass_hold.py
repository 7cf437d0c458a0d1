"""How long a placement pass holds the state's lock, and how late a thread that needs it
gets it (the Raft thread applies every command under that lock): a member's state with
--queued jobs that never fit (a quarter of them waiting on another with afterok), passes
run back to back in one thread, and a second thread that takes the lock every 10 ms as
the Raft thread would. Prints the longest and median holds of the pass and the waits of
the other thread, in milliseconds (issue 23; docs/ARCHITECTURE.md, "A busy member is not a
dead one").

    python bench/pass_hold.py [--queued 4000] [--passes 30] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import percentile  # noqa: E402
from mtgpu.model.job import JobSpec  # noqa: E402
from mtgpu.server.member.scheduler_role import SchedulerRole  # noqa: E402
from mtgpu.state import commands as C  # noqa: E402
from mtgpu.state.journal import JournaledState  # noqa: E402
from mtgpu.state.store import commit  # noqa: E402


class TimedLock:
    """The state's RLock, timing each outermost hold of the pass's thread."""

    def __init__(self, lock, holds: list[float], owner: list) -> None:
        self._lock, self.holds, self._owner = lock, holds, owner
        self._depth, self._since = 0, 0.0

    def acquire(self, *a, **kw):
        ok = self._lock.acquire(*a, **kw)
        if ok and threading.current_thread() is self._owner[0]:
            self._depth += 1
            if self._depth == 1:
                self._since = time.perf_counter()
        return ok

    def release(self):
        if threading.current_thread() is self._owner[0]:
            self._depth -= 1
            if self._depth == 0:
                self.holds.append(time.perf_counter() - self._since)
        self._lock.release()

    __enter__ = acquire

    def __exit__(self, *exc):
        self.release()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queued", type=int, default=4000)
    ap.add_argument("--passes", type=int, default=30)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = JournaledState(Path(tmp) / "state")
        commit(store, C.TENANT_ENSURE, name="alice", uid=2001, gid=2001, at=1.0)
        commit(store, C.NODE_REGISTER, name="n1", gpus=[], cpus=2.0, mem_total_bytes=1 << 30, at=1.0)
        first = None
        for i in range(args.queued):
            after = (("afterok", (first,)),) if first is not None and i % 4 == 0 else ()
            r = commit(store, C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001, at=2.0,
                       spec=JobSpec(script="#!/bin/bash\ntrue\n", cpus=64.0, after=after).to_dict())
            first = first or r["job_id"]
        holds: list[float] = []
        owner = [threading.current_thread()]
        real = store.lock
        store.lock = TimedLock(real, holds, owner)
        waits: list[float] = []
        done = threading.Event()

        def applier() -> None:  # as the Raft thread: take the lock every 10 ms, note how late
            while not done.is_set():
                t = time.perf_counter()
                with real:
                    waits.append(time.perf_counter() - t)
                time.sleep(0.01)

        t = threading.Thread(target=applier)
        t.start()
        role = SchedulerRole(store, "n1", clock=lambda: 10.0, down_after_s=10.0)
        began = time.perf_counter()
        for _ in range(args.passes):
            role._usage_at = -1e18  # every pass also builds the usage, as one a second does
            role.run_once(10.0, store.term())
        took = time.perf_counter() - began
        done.set()
        t.join()
    ms = lambda v: round(v * 1000, 2)  # noqa: E731
    out = {"queued": args.queued, "passes": args.passes, "pass_ms_median": ms(took / args.passes),
           "hold_ms_max": ms(max(holds)), "hold_ms_median": ms(percentile(holds, 50)),
           "other_thread_wait_ms_max": ms(max(waits)), "other_thread_wait_ms_p99": ms(percentile(waits, 99))}
    print(json.dumps(out) if args.json else "\n".join(f"{k}: {v}" for k, v in out.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

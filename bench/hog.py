"""A bounded CPU hog, to run the suite or a benchmark on a busy machine (issue 23).

N processes spin on the CPU. Each ends by itself after --seconds (so a hog left behind by
a killed caller still stops), and the hog kills its own processes, by pid, when it ends or
is sent SIGTERM/SIGINT/SIGHUP. Load averages are sampled every 5 s and the lowest and
highest are printed at the end (on stderr), so a run can say how busy it was.

    python bench/hog.py --cpus 2 --seconds 1800        (scripts/test.sh: MTGPU_TEST_LOAD=2)

As a library: `with CpuHog(2, 600) as hog: ...; hog.load_range()`.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading

BURN = "import time, sys\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"


class CpuHog:
    """`cpus` spinning processes for at most `seconds`; a context manager."""

    def __init__(self, cpus: int, seconds: float) -> None:
        if cpus < 0 or seconds <= 0:
            raise ValueError(f"a hog needs cpus >= 0 and seconds > 0, not {cpus} and {seconds}")
        self.cpus, self.seconds = cpus, seconds
        self.procs: list[subprocess.Popen] = []
        self.loads: list[float] = []
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="hog-loadavg", daemon=True)

    def _sample(self) -> None:
        while True:
            self.loads.append(os.getloadavg()[0])
            if self._stop.wait(5.0):
                return

    def start(self) -> "CpuHog":
        for _ in range(self.cpus):
            self.procs.append(subprocess.Popen([sys.executable, "-c", BURN, str(self.seconds)],
                                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))
        self._sampler.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()
        if self._sampler.is_alive():
            self._sampler.join()
        self.loads.append(os.getloadavg()[0])

    def load_range(self) -> tuple[float, float] | None:
        """(lowest, highest) one-minute load average seen while it ran, or None before any sample."""
        return (min(self.loads), max(self.loads)) if self.loads else None

    def __enter__(self) -> "CpuHog":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def describe(hog: CpuHog | None) -> str:
    if hog is None or not hog.cpus:
        return "no CPU hog"
    lo, hi = hog.load_range() or (0.0, 0.0)
    return f"a CPU hog of {hog.cpus} spinning processes beside it (load average {lo:.1f}-{hi:.1f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 1, help="spinning processes (default: one a core)")
    ap.add_argument("--seconds", type=float, default=1800.0, help="each ends by itself after this long")
    args = ap.parse_args()
    done = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, lambda *_: done.set())
    with CpuHog(args.cpus, args.seconds) as hog:
        done.wait(args.seconds)
    print(f"hog: {describe(hog)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

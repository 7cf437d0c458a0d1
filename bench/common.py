"""What several benchmarks share: percentiles, and Ctrl-C/SIGTERM that unwind cleanly."""

from __future__ import annotations

import signal


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile, linearly interpolated between the two nearest ranks."""
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _interrupt(signum, _frame):
    # The first signal unwinds everything (the with-blocks clean up); later ones are
    # ignored so that the clean-up itself is not cut short.
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def unwind_on_signals() -> None:
    """SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt once, so `with` blocks clean up."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _interrupt)


def podman_or_users_missing() -> str | None:
    """Why rootless podman as a temporary tenant cannot run here, or None (a why_not)."""
    from tests.support.images import podman_missing
    from tests.support.users import can_create_users

    return podman_missing() or can_create_users()


def run_as_root(name: str, what: str, run, *args, why_not=None) -> dict | int:
    """The part every benchmark's main shares: refuse to run but as root, unwind cleanly
    on a signal; the result of run(*args), or the exit status to return. `why_not`, when
    given, is asked once root is known: None, or why this machine cannot run the bench."""
    import os
    import sys

    if os.geteuid() != 0:
        print(f"bench/{name} runs {what}: run it as root", file=sys.stderr)
        return 2
    why = why_not() if why_not is not None else None
    if why:
        print(f"bench/{name} cannot run here: {why}", file=sys.stderr)
        return 2
    unwind_on_signals()
    try:
        return run(*args)
    except KeyboardInterrupt:
        print("interrupted: everything the bench made was removed", file=sys.stderr)
        return 130

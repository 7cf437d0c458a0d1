"""The jobs' lease: how a cluster member's job supervisors know that their member is
still part of the cluster, and kill their jobs when it may not be (self-fencing).

The file holds one number: the CLOCK_MONOTONIC moment (seconds) at which this member
last knew itself in a cluster whose scheduler held a majority. The shims (same
machine, same monotonic clock) kill their job once it is older than `timeout_s`.

Why that is safe. The scheduler marks a member down after MEMBER_DOWN_AFTER_S without
a report, counted from the moment it received the member's last report, from the moment
it became the scheduler, or from the moment it came back from a stall of its own (its
checks paused for more than half of MEMBER_DOWN_AFTER_S: scheduler_role.py), whichever
is latest. Each of these only moves the marking later; the argument needs only the
first two. The lease moment is never later than either:
- a member other than the scheduler renews it with the moment it *sent* the report
  the scheduler took, minus how long ago that scheduler last heard a majority of the
  voters (a scheduler cut off from its voters may still take reports for a moment,
  while the others already elect a new one, which only happens after they stopped
  hearing from it);
- the scheduler's own member renews it with the moment it last heard a majority.
So with `timeout_s` = `lease_s(MEMBER_DOWN_AFTER_S)`, one second less, a job is dead
before its member can be marked down and the job requeued. The moment only moves
forward, and a restart leaves it alone: re-attached jobs keep the lease they had.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path


WRITE_STEP_MAX_S = 0.5


def lease_s(down_after_s: float) -> float:
    """How long a job may run on past its member's lease moment: one second (at most
    half) less than MEMBER_DOWN_AFTER_S, margin for the shim's 0.2 s check and the kill
    (a copy elsewhere also needs the requeue committed, placed and started)."""
    return down_after_s - min(1.0, down_after_s / 2)


class Lease:
    """The lease file of this member (see the module's docstring)."""

    def __init__(self, path: Path, timeout_s: float) -> None:
        self.path = Path(path)
        self.timeout_s = timeout_s
        # The scheduler's member renews from two threads (its loop and its report loop):
        # one write at a time, or one's rename finds the other's temporary file gone.
        self._lock = threading.Lock()
        self._at = self._read()
        if self._at is None or self._at > time.monotonic():
            # none yet, or written before a reboot (the monotonic clock started again): lapsed
            self._write(0.0)

    def _read(self) -> float | None:
        try:
            return float(self.path.read_text().strip())
        except (OSError, ValueError):  # none yet, or not a number (an older lease file)
            return None

    def _write(self, at: float) -> None:
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(f"{at:.6f}\n")
            os.replace(tmp, self.path)
        except OSError as e:  # a write's error names no file: say which (a full STATE_DIR stops the member)
            raise OSError(e.errno, e.strerror, str(tmp)) from e
        self._at = at

    def renew(self, at: float) -> None:
        """Move the lease moment forward to `at` (monotonic seconds); never backward. The
        file is written once the moment moved by a twentieth of `timeout_s` (at most 0.5 s):
        the scheduler's member renews at every tick, five times a second, and a lease the
        shims read a little older only makes them kill a little sooner, never later."""
        with self._lock:
            if self._at is None or at >= self._at + min(WRITE_STEP_MAX_S, self.timeout_s / 20):
                self._write(at)

    @property
    def at(self) -> float | None:
        return self._at

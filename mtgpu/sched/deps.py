"""Queue dependencies (`after=afterok:12`, Slurm's `--dependency`): whether a queued job
may be placed yet, must wait, or never can. Pure: the caller says what became of the
jobs it names.

A dependency is a kind and job ids; every dependency of a job must hold (Slurm's `,`).
An id is a job, or an array (its first task's id, the array's id): then every task of it.

- `afterany`: the jobs have ended, however.
- `afterok`: the jobs have ended and completed (exit 0). One that ended otherwise means
  never: the waiting job is cancelled, naming it.
- `afternotok`: the jobs have ended, and at least one did not complete. All of them
  completing means never.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mtgpu.model.job import JobState

READY, WAITING, NEVER = "ready", "waiting", "never"


@dataclass(frozen=True)
class Verdict:
    state: str  # READY, WAITING or NEVER
    reason: str | None = None  # why it waits, or why it never can


def verdict(after: Sequence[tuple[str, Sequence[int]]],
            states_of: Callable[[int], Sequence[JobState] | None]) -> Verdict:
    """`states_of(id)`: the states of that job (one) or of that array's tasks; None when
    there is no such job (any more)."""
    waiting: list[str] = []
    for kind, ids in after:
        for jid in ids:
            states = states_of(jid)
            if not states:
                return Verdict(NEVER, f"dependency {kind}:{jid} can never be met: there is no job {jid}")
            ended = [s for s in states if s.final]
            bad = [s for s in ended if s is not JobState.COMPLETED]
            if kind == "afterok" and bad:
                return Verdict(NEVER, f"dependency afterok:{jid} can never be met: job {jid} {_what(bad)}")
            if len(ended) < len(states):
                live = next(s for s in states if not s.final)
                waiting.append(f"job {jid} ({live.value})")
                continue
            if kind == "afternotok" and not bad:
                return Verdict(NEVER, f"dependency afternotok:{jid} can never be met: job {jid} completed")
    if waiting:
        return Verdict(WAITING, "waiting for " + ", ".join(waiting))
    return Verdict(READY)


def _what(bad: list[JobState]) -> str:
    return "ended " + bad[0].value if len(bad) == 1 else f"had {len(bad)} tasks end {', '.join(sorted({s.value for s in bad}))}"

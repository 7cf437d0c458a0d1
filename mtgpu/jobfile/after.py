"""`after=` (Slurm's `--dependency`) as written: `afterok:12:13,afterany:14` <-> the
JobSpec's ((kind, (ids...)), ...). What a dependency means: sched/deps.py."""

from __future__ import annotations

from collections.abc import Sequence

from mtgpu.model.job import DEPENDENCY_KINDS as KINDS


def parse_after(text: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """`afterok:12:13,afterany:14` -> (("afterok", (12, 13)), ("afterany", (14,))).
    Raises ValueError saying what is allowed."""
    out = []
    if "?" in text:
        raise ValueError("either-or dependencies ('?') are not available: give dependencies that must all hold, "
                         "separated by ','")
    for part in text.split(","):
        kind, _, rest = part.strip().partition(":")
        kind = kind.lower()
        if kind not in KINDS:
            raise ValueError(f"{kind or part!r} is not a dependency kind we have; use {', '.join(KINDS)} "
                             "followed by :JOBID[:JOBID...]")
        if "+" in rest:
            raise ValueError(f"{part.strip()!r}: a delay after the job ('+MINUTES') is not available")
        ids = []
        for word in rest.split(":"):
            if not word.isdigit() or int(word) < 1:
                raise ValueError(f"{kind}: needs job ids (whole numbers), not {rest!r}; e.g. {kind}:12:13")
            ids.append(int(word))
        out.append((kind, tuple(dict.fromkeys(ids))))
    return tuple(out)


def render_after(after: Sequence[tuple[str, Sequence[int]]]) -> str:
    return ",".join(f"{kind}:" + ":".join(str(i) for i in ids) for kind, ids in after)

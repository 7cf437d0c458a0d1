"""Slurm's filename patterns for `output=` / `error=` (sbatch's `--output` / `--error`).

Checked at submit (`pattern_problem`), expanded when the job starts on its member
(`expand_pattern`), where the job's id, array and node are known. As in sbatch:

  %j job id   %J job id (the batch step's)   %A the array's id (the job's own when it is no array)
  %a array index (0 when it is no array)     %x job name   %u user name   %N node name
  %n node rank, %t task rank (0: the batch script's)   %s step ("batch")   %% a literal %

A number between `%` and the letter zero-pads a numeric value (`%4a` -> 0007). A
backslash anywhere turns the replacements off (the backslashes are dropped).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PATTERN_HELP = ("a file name, where %j is the job id, %A the array's id, %a the array index, %x the job name, "
                "%u the user, %N the node and %% a literal %, e.g. logs/%x-%A_%a.out")
_TOKEN_RE = re.compile(r"%(\d{0,2})(.)", re.DOTALL)
_NUMERIC = set("jJAantb")
_KNOWN = _NUMERIC | set("xuNs%")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
MAX_PATH_CHARS = 4096


@dataclass(frozen=True, slots=True)
class PatternValues:
    """What the letters stand for, for one job on one node."""

    job_id: int
    array_job_id: int | None = None
    array_index: int | None = None
    name: str = ""
    user: str = ""
    node: str = ""
    node_rank: int = 0


def pattern_problem(pattern: str) -> str | None:
    """None when `pattern` is a usable output file name, else what is wrong with it."""
    if not pattern.strip():
        return f"the file name is empty; write {PATTERN_HELP}"
    if len(pattern) > MAX_PATH_CHARS or _CONTROL_RE.search(pattern):
        return f"a file name of at most {MAX_PATH_CHARS} printable characters; write {PATTERN_HELP}"
    if pattern.endswith("/"):
        return f"{pattern!r} names a directory, not a file; write {PATTERN_HELP}"
    if "\\" in pattern:
        return None  # replacements are off
    rest = _TOKEN_RE.sub("", pattern.replace("%%", ""))
    if "%" in rest:
        return f"a % at the end needs a letter after it; write {PATTERN_HELP}"
    for m in _TOKEN_RE.finditer(pattern.replace("%%", "")):
        if m.group(2) not in _KNOWN:
            return f"%{m.group(2)} is not one of Slurm's filename patterns; write {PATTERN_HELP}"
    return None


def expand_pattern(pattern: str, v: PatternValues) -> str:
    """The file name for this job on this node (the pattern is assumed checked)."""
    if "\\" in pattern:
        return pattern.replace("\\", "")
    numbers = {
        "j": v.job_id, "J": v.job_id,
        "A": v.array_job_id if v.array_job_id is not None else v.job_id,
        "a": v.array_index if v.array_index is not None else 0,
        "b": (v.array_index or 0) % 10,
        "n": v.node_rank, "t": 0,
    }
    texts = {"x": v.name, "u": v.user, "N": v.node, "s": "batch", "%": "%"}

    def one(m: re.Match) -> str:
        width, letter = m.group(1), m.group(2)
        if letter in numbers:
            return str(numbers[letter]).zfill(int(width) if width else 0)
        if letter in texts:
            return texts[letter]
        return m.group(0)

    return _TOKEN_RE.sub(one, pattern)

"""`mt-job list` for people used to squeue (docs/SLURM.md): state filters that take
Slurm's names and codes, and `--format` with squeue's %-fields. Pure: the jobs as the
API lists them, and `now` for the elapsed time, come in."""

from __future__ import annotations

import datetime as dt
import re

# our state -> squeue's compact code (and the long names squeue prints, where they differ)
CODES = {"queued": "PD", "running": "R", "completed": "CD", "failed": "F", "cancelled": "CA", "lost": "NF",
         "stopped": "ST"}
SLURM_NAMES = {"queued": "PENDING", "running": "RUNNING", "completed": "COMPLETED", "failed": "FAILED",
               "cancelled": "CANCELLED", "lost": "NODE_FAIL", "stopped": "STOPPED"}
_BY_ANY = {**{k: k for k in CODES}, **{v.lower(): k for k, v in CODES.items()},
           **{v.lower(): k for k, v in SLURM_NAMES.items()}, "pending": "queued", "timeout": "failed",
           "to": "failed", "canceled": "cancelled"}
FIELDS = {
    "i": "job id", "j": "name", "T": "state (Slurm's name)", "t": "state code (PD, R, CD, F, CA, NF, ST)",
    "u": "tenant", "D": "number of nodes", "N": "nodes", "b": "GPUs", "M": "time used", "l": "time limit",
    "V": "submitted", "S": "started", "e": "ended", "R": "the reason while queued, else the nodes",
    "r": "reason", "C": "CPUs", "m": "memory", "K": "array index", "F": "array job id",
}
DEFAULT_FORMAT = "%.8i %.20j %.9T %.10M %.6D %R"  # squeue's default, near enough
_FIELD = re.compile(r"%(-)?(\.)?(\d+)?([A-Za-z%])")


class FormatError(ValueError):
    pass


def parse_states(text: str) -> set[str]:
    """`R,PD` / `running,queued` / `PENDING` -> our state names; `all` -> every state."""
    out = set()
    for word in (w.strip().lower() for w in text.split(",")):
        if word == "all":
            return set(CODES)
        if word not in _BY_ANY:
            raise FormatError(f"--state {text!r}: {word!r} is no state; use {', '.join(CODES)} or Slurm's "
                              f"{', '.join(CODES.values())} (or PENDING, RUNNING, ...), several with ','")
        out.add(_BY_ANY[word])
    return out


def check_format(fmt: str) -> None:
    for m in _FIELD.finditer(fmt):
        if m.group(4) != "%" and m.group(4) not in FIELDS:
            raise FormatError(f"--format {fmt!r}: %{m.group(4)} is not a field here; the fields: " +
                              ", ".join(f"%{k} {v}" for k, v in FIELDS.items()))
    if "%" in _FIELD.sub("", fmt):
        raise FormatError(f"--format {fmt!r}: a '%' that starts no field; write %% for a '%'")


def _clock(seconds: float | None) -> str:
    """squeue's elapsed form: M:SS, H:MM:SS, D-HH:MM:SS."""
    if seconds is None:
        return "0:00"
    s = int(max(0, seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}-{h:02d}:{m:02d}:{s:02d}"
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _stamp(t: float | None) -> str:
    if t is None:
        return "N/A"
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def field(job: dict, key: str, now: float) -> str:
    spec = job.get("spec") or {}
    state = job["state"]
    if key == "i":
        return str(job["id"])
    if key == "j":
        return job.get("name") or f"job-{job['id']}"
    if key == "T":
        return SLURM_NAMES.get(state, state.upper())
    if key == "t":
        return CODES.get(state, state[:2].upper())
    if key == "u":
        return job.get("tenant") or ""
    if key == "D":
        return str(len(job.get("nodes") or []) or spec.get("nodes") or 1)
    if key == "N":
        return ",".join(job.get("nodes") or []) or ""
    if key == "b":
        gpus = job.get("gpus") or []
        return str(sum(g.get("fraction", 1.0) for g in gpus)).removesuffix(".0") if gpus else "0"
    if key == "M":
        start = job.get("started_at")
        return _clock(None if start is None else (job.get("ended_at") or now) - start)
    if key == "l":
        limit = spec.get("time_limit_s")
        return "UNLIMITED" if limit is None else _clock(limit)
    if key == "V":
        return _stamp(job.get("submitted_at"))
    if key == "S":
        return _stamp(job.get("started_at"))
    if key == "e":
        return _stamp(job.get("ended_at"))
    if key == "R":
        if state == "queued":
            return f"({job.get('reason') or 'None'})"
        return ",".join(job.get("nodes") or []) or f"({job.get('reason') or 'None'})"
    if key == "r":
        return job.get("reason") or "None"
    if key == "C":
        return str(spec.get("cpus") or "-")
    if key == "m":
        mem = spec.get("mem_bytes")
        return "-" if not mem else f"{mem // (1 << 20)}M"
    if key == "K":
        return "N/A" if job.get("array_index") is None else str(job["array_index"])
    if key == "F":
        return str(job.get("array_parent") or job["id"])
    return "%"


def render(job: dict, fmt: str, now: float) -> str:
    """One line: each %[.][width]X replaced, as squeue does (a width pads, and cuts a longer
    value; with `.` the value is right-aligned)."""
    return _FIELD.sub(lambda m: _fit(field(job, m.group(4), now), m), fmt)


def header(fmt: str) -> str:
    names = {"i": "JOBID", "j": "NAME", "T": "STATE", "t": "ST", "u": "USER", "D": "NODES", "N": "NODELIST",
             "b": "GPUS", "M": "TIME", "l": "TIME_LIMIT", "V": "SUBMIT_TIME", "S": "START_TIME", "e": "END_TIME",
             "R": "NODELIST(REASON)", "r": "REASON", "C": "CPUS", "m": "MIN_MEMORY", "K": "ARRAY_TASK_ID",
             "F": "ARRAY_JOB_ID", "%": "%"}

    return _FIELD.sub(lambda m: _fit(names[m.group(4)], m), fmt)


def _fit(text: str, m: re.Match) -> str:
    """A field's text in the width its %[-][.][width] asks: padded, and cut when longer;
    right-aligned with `.` (squeue's way), unless `-`."""
    left, dot, width, _key = m.groups()
    if not width:
        return text
    w = int(width)
    return text[:w].rjust(w) if dot and not left else text[:w].ljust(w)

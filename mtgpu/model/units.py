"""Human sizes and durations, parsed once at the edge (config, job file, CLI).

Sizes follow Slurm's habit: a bare suffix (`K`, `M`, `G`, `T`) and the IEC
spellings (`KiB`, `MiB`, `GiB`, `TiB`) are binary (1024-based); the SI spellings
(`KB`, `MB`, `GB`, `TB`) are decimal. A bare number is bytes.
"""

from __future__ import annotations

import re

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "kb": 1000,
    "m": 1024**2,
    "mib": 1024**2,
    "mb": 1000**2,
    "g": 1024**3,
    "gib": 1024**3,
    "gb": 1000**3,
    "t": 1024**4,
    "tib": 1024**4,
    "tb": 1000**4,
    "p": 1024**5,
    "pib": 1024**5,
    "pb": 1000**5,
}

SIZE_HELP = "a size such as 512M, 20G, 200GiB or 1.5T (K/M/G/T and KiB/MiB/GiB/TiB are 1024-based, KB/MB/GB/TB 1000-based)"


class UnitError(ValueError):
    """A size or duration that cannot be read; the message says what is allowed."""


def parse_size(value: str | int | float) -> int:
    """Return the number of bytes in `value` ("20G", "200GiB", 1024)."""
    if isinstance(value, bool):
        raise UnitError(f"{value!r} is not a size; use {SIZE_HELP}")
    if isinstance(value, int):
        if value < 0:
            raise UnitError(f"{value!r} is negative; use {SIZE_HELP}")
        return value
    if isinstance(value, float):
        if value < 0 or value != value or value == float("inf"):
            raise UnitError(f"{value!r} is not a size; use {SIZE_HELP}")
        return int(value)
    if not isinstance(value, str):
        raise UnitError(f"{value!r} is not a size; use {SIZE_HELP}")
    m = _SIZE_RE.match(value)
    if not m:
        raise UnitError(f"{value!r} is not a size; use {SIZE_HELP}")
    number, unit = m.group(1), m.group(2).lower()
    if unit not in _SIZE_UNITS:
        raise UnitError(f"{value!r} has an unknown unit {m.group(2)!r}; use {SIZE_HELP}")
    result = float(number) * _SIZE_UNITS[unit]
    if result > 2**63:
        raise UnitError(f"{value!r} is too large; use {SIZE_HELP}")
    return int(result)


def format_size(n_bytes: int | float) -> str:
    """Short binary form for tables and messages: 20G, 512M, 1.5T."""
    n = float(n_bytes)
    for unit, factor in (("P", 1024**5), ("T", 1024**4), ("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if n >= factor:
            v = n / factor
            return f"{v:.0f}{unit}" if abs(v - round(v)) < 0.05 else f"{v:.1f}{unit}"
    return f"{int(n)}B"


_DURATION_HELP = (
    "a duration such as 90 (minutes, as Slurm), 30s, 45m, 2h, 1d, 1:30:00 (h:m:s), 10:00 (m:s) or 2-12:00:00 (d-h:m:s)"
)
_DUR_SUFFIX_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd])\s*$", re.IGNORECASE)
_DUR_CLOCK_RE = re.compile(r"^\s*(?:([0-9]+)-)?([0-9]+)(?::([0-9]+))?(?::([0-9]+))?\s*$")


def parse_duration(value: str | int | float) -> float:
    """Return seconds. A bare number is minutes, as in Slurm's `--time`."""
    if isinstance(value, bool):
        raise UnitError(f"{value!r} is not a duration; use {_DURATION_HELP}")
    if isinstance(value, (int, float)):
        if value <= 0 or value != value or value == float("inf"):
            raise UnitError(f"{value!r} is not a positive duration; use {_DURATION_HELP}")
        return float(value) * 60.0
    if not isinstance(value, str):
        raise UnitError(f"{value!r} is not a duration; use {_DURATION_HELP}")
    m = _DUR_SUFFIX_RE.match(value)
    if m:
        seconds = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2).lower()]
    else:
        m = _DUR_CLOCK_RE.match(value)
        if not m:
            raise UnitError(f"{value!r} is not a duration; use {_DURATION_HELP}")
        days, a, b, c = m.groups()
        parts = [int(x) for x in (a, b, c) if x is not None]
        if days is not None:
            # d-h[:m[:s]]
            while len(parts) < 3:
                parts.append(0)
            seconds = int(days) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
        elif len(parts) == 1:
            seconds = parts[0] * 60
        elif len(parts) == 2:
            seconds = parts[0] * 60 + parts[1]
        else:
            seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    if seconds <= 0 or seconds > 366 * 86400 * 10:
        raise UnitError(f"{value!r} is out of range; use {_DURATION_HELP}")
    return float(seconds)


def format_duration(seconds: float) -> str:
    s = int(round(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}-" if d else "") + f"{h:02d}:{m:02d}:{s:02d}"

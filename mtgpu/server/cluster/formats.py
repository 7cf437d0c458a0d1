"""Which state formats the members of a cluster apply (state/commands.py "State formats").

Each member's report says the newest state format its mtgpu applies (and its version);
the scheduler keeps what each member said last and answers every report with the floor:
the newest format every member of the cluster applies. A member that has not said (an
mtgpu from before formats, or one not heard since this scheduler started) counts as
format 1, and so does a member the cluster still lists but has not heard from (it may
come back with the old version: `mtgpu-admin node remove` one that will not), and one
silent for SILENT_S (it may be restarting with another version: its format is known again
from its next report, which says it). A member
that does not schedule proposes with the floor the scheduler last told it, within SILENT_S
(1 until then, and once that answer is older).
No command of a format above the floor is proposed (state/raft.py format_gate): during a
rolling upgrade the upgraded members write what the others still apply."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable

from ...state import commands as C

log = logging.getLogger(__name__)

FORMAT_BEFORE_FORMATS = 1  # what a member whose report names no format applies
SILENT_S = 2.0  # a member unheard this long counts as FORMAT_BEFORE_FORMATS (it reports every second)
NEWER_STATE_EXIT = 3  # the server's exit status when the replicated state is of a newer format


def _format(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


class StateFormats:
    def __init__(self, own_name: str, clock=time.monotonic) -> None:
        self.own = own_name
        self.clock = clock
        self._heard: dict[str, tuple[int, str, float]] = {}  # member -> (its format, its version, when)
        self._told = (FORMAT_BEFORE_FORMATS, 0.0)  # the floor in the scheduler's last answer, and when

    def heard(self, name: str, report: dict) -> None:
        """On the scheduler: what a member's report says of its mtgpu."""
        fmt = _format(report.get("state_format")) or FORMAT_BEFORE_FORMATS
        version = str(report.get("mtgpu_version") or "from before state formats")[:40]
        if self._heard.get(name, (None,))[0] != fmt:
            log.info("member %s applies state format %d (mtgpu %s)", name, fmt, version)
        self._heard[name] = (fmt, version, self.clock())

    def told(self, value) -> None:
        """On a member that does not schedule: the floor in the scheduler's answer (absent
        from an mtgpu from before formats: it writes format 1 only)."""
        self._told = (_format(value) or FORMAT_BEFORE_FORMATS, self.clock())

    def floor_of(self, members: Iterable[str]) -> int:
        """The newest format every one of `members` applies (this member: its own)."""
        floor, now = C.STATE_FORMAT, self.clock()
        for name in members:
            if name == self.own:
                continue
            fmt, _version, at = self._heard.get(name, (FORMAT_BEFORE_FORMATS, "", 0.0))
            floor = min(floor, fmt if now - at <= SILENT_S else FORMAT_BEFORE_FORMATS)
        return floor

    def floor(self, leading: bool, members: Iterable[str]) -> int:
        if leading:
            return self.floor_of(members)
        told, at = self._told
        # an answer older than SILENT_S (no scheduler heard since: it may have changed) says nothing
        return min(told if self.clock() - at <= SILENT_S else FORMAT_BEFORE_FORMATS, C.STATE_FORMAT)

    def versions(self) -> dict[str, dict]:
        """What each member said: {name: {"state_format", "mtgpu_version"}}."""
        return {n: {"state_format": f, "mtgpu_version": v} for n, (f, v, _at) in sorted(self._heard.items())}


def stop_on_newer_state(why: str) -> None:
    """The replicated state holds a command (or a snapshot) of a newer state format than
    this mtgpu applies: the member stops, with the reason in its log, rather than serve
    a state that stopped short (its replica applies nothing past that entry). Its jobs
    run on under their own supervisors; once upgraded it starts and applies the rest."""
    log.critical("%s; this member stops (exit status %d) until it is upgraded; its jobs keep running",
                 why, NEWER_STATE_EXIT)
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - leaving anyway
            pass
    os._exit(NEWER_STATE_EXIT)

"""Idle culling of workspaces (`[CONTAINERS] idle_timeout`): pure, with time passed in.

A workspace is busy while any of these holds: a session is attached (a shell, an exec,
an SSH login), a connection to one of its published ports is open, its processes use
CPU above a small threshold, or one of its GPUs does work. Busy is active: a long
computation with nobody attached is never culled. A workspace idle for `timeout_s` is
stopped (its GPUs released, its layer kept) with the reason this module words, which
the owner sees in `mt-container show`.

The agent samples each workspace now and then (`Activity`), folds each sample into its
`IdleState` with `observe()`, and asks `verdict()`; nothing here reads a clock or a file.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

CPU_BUSY_FRACTION = 0.05  # of one core, averaged between two samples
GPU_BUSY_PCT = 1.0


@dataclass(frozen=True, slots=True)
class Activity:
    """One sample of a workspace, as measured at `at`."""

    at: float
    sessions: int = 0  # attached terminals, exec sessions, SSH logins
    port_connections: int = 0  # established connections to its published ports
    cpu_seconds: float = 0.0  # CPU time its processes used so far (cumulative)
    gpu_util_pct: float = 0.0  # the busiest of its GPUs, now


@dataclass(frozen=True, slots=True)
class IdleState:
    """What culling remembers of one workspace."""

    last_active_at: float  # the last moment it was seen busy (or started)
    last_sample: Activity | None = None
    why_active: str = "started"  # what made it busy last


def started(at: float) -> IdleState:
    """A workspace that (re)started at `at` counts as busy then."""
    return IdleState(last_active_at=at)


def busy_because(prev: Activity | None, now: Activity) -> str | None:
    """What makes the workspace busy in this sample, or None when it is idle."""
    if now.sessions > 0:
        return f"{now.sessions} session{'s' if now.sessions != 1 else ''} attached"
    if now.port_connections > 0:
        return f"{now.port_connections} connection{'s' if now.port_connections != 1 else ''} to its ports"
    if now.gpu_util_pct >= GPU_BUSY_PCT:
        return f"GPU at {now.gpu_util_pct:g}%"
    if prev is not None and now.at > prev.at:
        used = now.cpu_seconds - prev.cpu_seconds
        if used < 0:  # its processes were replaced: the counter started again
            used = now.cpu_seconds
        rate = used / (now.at - prev.at)
        if rate >= CPU_BUSY_FRACTION:
            return f"CPU at {rate * 100:.0f}% of a core"
    return None


def observe(state: IdleState, sample: Activity) -> IdleState:
    """Fold one sample in; samples older than the last one are ignored."""
    prev = state.last_sample
    if prev is not None and sample.at <= prev.at:
        return state
    why = busy_because(prev, sample)
    if why is None:
        return replace(state, last_sample=sample)
    return IdleState(last_active_at=sample.at, last_sample=sample, why_active=why)


def verdict(state: IdleState, now: float, timeout_s: float | None) -> str | None:
    """The reason to stop the workspace now, or None to keep it. `timeout_s` None: off."""
    if timeout_s is None or timeout_s <= 0:
        return None
    idle_for = now - state.last_active_at
    if idle_for < timeout_s:
        return None
    return (f"stopped after {_duration(idle_for)} idle (idle_timeout {_duration(timeout_s)}): no session attached, "
            f"no connection to its ports, CPU under {CPU_BUSY_FRACTION * 100:.0f}% of a core and no GPU work "
            f"since it was last busy ({state.why_active}); its layer is kept: mt-container start brings it back")


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 120:
        return f"{m}m"
    return f"{m // 60}h{m % 60:02d}m"

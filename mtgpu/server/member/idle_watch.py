"""Idle culling on a member (`[CONTAINERS] idle_timeout`): measure each workspace that
runs here now and then, and stop the ones the pure `workspaces.idle` calls idle.

What is measured (workspaces/idle.Activity): the exec sessions podman has open in its
container (`mt-container shell`/`exec`, an SSH login into it, VS Code's server), the
established connections to its published ports on this machine's loopback, the CPU time
of its job cgroup (the container's processes live in it), and its GPUs' utilization
from this member's telemetry. Stopping it is the same `workspace.stop.v1` as
`mt-container stop`, with the reason `mt-container show` prints.
"""

from __future__ import annotations

import logging

import psutil

from ...model.job import Job
from ...state import commands as C
from ...state.store import try_commit
from ...workspaces.idle import Activity, IdleState, observe, started, verdict
from ..ports import tcp_connections

log = logging.getLogger(__name__)


def established_ends() -> set[tuple]:
    """The (local, remote) ends of this machine's ESTABLISHED TCP connections, whoever holds
    them (a socket shared by several processes is one connection); empty when psutil is
    refused the table (the sample then shows no port activity)."""
    try:
        conns = tcp_connections()
    except (psutil.Error, OSError):
        return set()
    return {(c.laddr, c.raddr) for c in conns if c.status == psutil.CONN_ESTABLISHED and c.laddr}


def established_to(ports: set[int], ends: set[tuple] | None = None) -> int:
    """Connections in ESTABLISHED state whose local port is one of `ports` on this machine
    (`ends`: established_ends(), read once for several workspaces)."""
    return sum(1 for local, _remote in (established_ends() if ends is None else ends) if local.port in ports)


class IdleWatch:
    def __init__(self, store, agent, node_name: str, timeout_s: float | None, every_s: float | None = None) -> None:
        self.store = store
        self.agent = agent
        self.node_name = node_name
        self.timeout_s = timeout_s
        self.every_s = every_s if every_s is not None else (min(30.0, max(2.0, timeout_s / 10)) if timeout_s else 0)
        self._states: dict[tuple[int, int], IdleState] = {}
        self._next_at = 0.0

    def run_once(self, now: float, running: list[Job], at: float | None = None) -> None:
        """`running`: the workspaces the state runs on this member now. `now`: the monotonic
        clock (idleness is an interval, which a wall-clock jump must not move); `at`: the
        wall clock, for the record of a stop (default `now`)."""
        if not self.timeout_s or now < self._next_at:
            return
        self._next_at = now + self.every_s
        runner = self.agent.runner
        if not hasattr(runner, "workspace_sessions"):
            return
        gpus = {g.index: g.utilization_pct for g in self.agent.last_gpus()}
        ends = None  # this machine's TCP table: read once a pass (psutil maps every socket to its process)
        keys = set()
        for job in running:
            key = (job.id, job.attempt)
            keys.add(key)
            state = self._states.get(key) or started(now)
            ports = {int(h) for h in (job.ws.get("ports") or {}).values()}
            my_gpus = [g.index for a in job.allocations if a.node == self.node_name for g in a.gpus]
            if ports and ends is None:
                ends = established_ends()
            sample = Activity(at=now, sessions=runner.workspace_sessions(job.id),
                              port_connections=established_to(ports, ends) if ports else 0,
                              cpu_seconds=runner.cgroups.cpu_seconds(job.id) or 0.0,
                              gpu_util_pct=max((gpus.get(i, 0.0) for i in my_gpus), default=0.0))
            state = observe(state, sample)
            self._states[key] = state
            why = verdict(state, now, self.timeout_s)
            if why:
                log.info("workspace %s (job %d): %s", job.spec.workspace.name, job.id, why)
                r = try_commit(self.store, C.WORKSPACE_STOP, job_id=job.id, at=now if at is None else at, reason=why,
                               attempt=job.attempt)
                if r is not None and r["ok"]:
                    keys.discard(key)
        self._states = {k: v for k, v in self._states.items() if k in keys}

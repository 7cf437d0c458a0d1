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


def established_to(ports: set[int]) -> int:
    """Connections in ESTABLISHED state whose local port is one of `ports` on this machine,
    whoever holds them (a connection whose owning process cannot be seen counts too); 0
    when psutil is refused the table (the sample then shows no port activity)."""
    try:
        conns = tcp_connections()
    except (psutil.Error, OSError):
        return 0
    # A socket shared by several processes is one connection: count each pair of ends once.
    return len({(c.laddr, c.raddr) for c in conns
                if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port in ports})


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
        keys = set()
        for job in running:
            key = (job.id, job.attempt)
            keys.add(key)
            state = self._states.get(key) or started(now)
            ports = {int(h) for h in (job.ws.get("ports") or {}).values()}
            my_gpus = [g.index for a in job.allocations if a.node == self.node_name for g in a.gpus]
            sample = Activity(at=now, sessions=runner.workspace_sessions(job.id),
                              port_connections=established_to(ports) if ports else 0,
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

"""One member's life cycle: the store (journal or Raft), the agent loop, the
scheduler role when this member holds it, and the loop thread that drives them.

The loop wakes on every submission, cancellation and applied command, and at
least every TICK_S. Standalone: the node is always the scheduler. Cluster: the
Raft leader with a quorum is; every member runs its agent.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from ...agent.local import LocalAgent
from ...config import Config
from ...state import commands as C
from ...state.raft_files import FULL_DISK_ERRNOS, stop_for_disk
from ...state.store import Store, try_commit
from ..cluster.lease import Lease, lease_s
from ..cluster.standalone import Link, StandaloneLink
from ...storage.shared import interpreter_publish_root, publish_read_only
from .accounts_agent import AccountsAgent
from .agent_loop import AgentLoop
from .scheduler_role import SchedulerRole
from .view import NodeTelemetry, PreemptPolicy

log = logging.getLogger(__name__)


def _cgroups_of(pid: int) -> str:
    """/proc/PID/cgroup on one line (for a log line)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return " ".join(f.read().split())
    except OSError as e:
        return f"unreadable: {e}"

TICK_S = 0.2
TELEMETRY_EVERY_S = 1.0
IDLE_TICK_S = 1.0  # the loop's pace while nothing is queued or running (_may_rest)
# Passes take at most about a fortieth of a core: after a pass that used C seconds of CPU
# the next one starts PASS_REST_PER_CPU x C later at the earliest, never more than
# PASS_REST_MAX_S. A pass over a few nodes uses a millisecond (the next may start 39 ms
# later); over a thousand nodes x 8 GPUs some 15-30 ms, and jobs submitted meanwhile are
# placed together by the next pass, within a second (docs/SCHEDULING.md).
PASS_REST_PER_CPU = 39.0
PASS_REST_MAX_S = 1.0


class Member:
    """This machine in its cluster: the store, the link to the other members (a stand-in
    on a standalone node), the agent, and the loop that drives them."""

    def __init__(self, config: Config, agent: LocalAgent, store: Store, link: Link | None = None, clock=time.time,
                 down_after_s: float = 10.0) -> None:
        self.config = config
        self.node_name = config.NODE_NAME
        self.state_dir = Path(config.STATE_DIR)
        self._registered = False  # this process registered this member (see _register)
        self.agent = agent
        self.store = store
        self.link: Link = link if link is not None else StandaloneLink(self.node_name)
        self.clock = clock
        pre = config.PREEMPTION
        self.scheduler = SchedulerRole(store, self.node_name, clock, down_after_s=down_after_s,
                                       job_retention_s=config.job_retention_s, tenant_retention_s=config.tenant_retention_s,
                                       preempt=PreemptPolicy(pre.enabled, pre.grace_s, pre.max_per_window, pre.window_s))
        self.lease = Lease(self.state_dir / "agent" / "lease", lease_s(down_after_s)) if self.link.is_cluster \
            else None
        host = config.listen_host_port()[0]
        self.agent_loop = AgentLoop(store, agent, self.node_name, str(config.TENANT_HOME_ROOT), self.state_dir,
                                    clock, advertise_host=host, lease=self.lease,
                                    fetch_image=self.link.fetch_image if self.link.is_cluster else None,
                                    idle_timeout_s=config.CONTAINERS.idle_timeout_s,
                                    vram_policy=config.GPU_POLICY.vram_overuse,
                                    vram_grace_s=config.GPU_POLICY.vram_grace_s)
        cgroups = getattr(agent.runner, "cgroups", None)  # the tenant sshd goes beside the member's services
        self.accounts = AccountsAgent(store, config, self.node_name, clock, config.CLUSTER_ID or self.node_name,
                                      place_sshd=self._place_sshd if cgroups is not None else None)
        self.local_telemetry: NodeTelemetry | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_telemetry = -1e18
        self._next_schedule_at = 0.0
        self.directlink_id = ""  # set by the DirectLink service (server/member/directlink.py) before start

    # ------------------------------------------------------------ life cycle
    def start(self) -> None:
        self.publish_shared_data()
        self.refresh_telemetry(force=True)
        self.agent_loop.recover()
        self._thread = threading.Thread(target=self._loop, name="mtgpu-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=5)
        self.link.stop()
        self.accounts.stop()
        self.store.close()
        self.agent.close()

    def _place_sshd(self, pid: int, again: bool = False) -> None:
        """`again`: the periodic check of a running sshd; it is moved (and that said) only when
        some hierarchy no longer has it in the sessions group."""
        cgroups = self.agent.runner.cgroups
        if again:
            misses = cgroups.sessions_misses(pid)
            if not misses:
                return
            log.warning("the tenant sshd (PID %d) was found outside its sessions group (%s; in %s): moved back, so "
                        "that tenants' sessions do not get this member's CPU weight", pid, ", ".join(misses),
                        _cgroups_of(pid))
        why = cgroups.place_sessions(pid)
        if why:
            log.warning("the tenant sshd stays in this member's services cgroup (%s): tenants' sessions get its "
                        "CPU weight", why)

    def wake(self) -> None:
        self._wake.set()

    def publish_shared_data(self) -> list[str]:
        """DATASETS_DIRECTORIES and PYTHON_INTERPRETERS: readable by every tenant, writable by none."""
        paths = [Path(p) for p in self.config.DATASETS_DIRECTORIES]
        paths += [interpreter_publish_root(Path(i.path)) for i in self.config.PYTHON_INTERPRETERS]
        if not paths:
            return []
        lines = publish_read_only(paths)
        for line in lines:
            (log.info if line.startswith("fixed: ") else log.warning)("shared data: %s", line)
        return lines

    def is_scheduler(self) -> bool:
        return self.store.is_leader()

    # ------------------------------------------------------------ the loop
    def _loop(self) -> None:
        last = 0.0
        while not self._stop.is_set():
            woken = self._wake.wait(TICK_S)
            self._wake.clear()
            if not woken and self._may_rest(time.monotonic() - last):
                continue
            last = time.monotonic()
            delay = self._next_schedule_at - time.monotonic()
            if not woken and 0 < delay < TICK_S:
                self._stop.wait(delay)  # a tick: the full pass when it may run (woken: a quick pass now)
            try:
                self.run_once()
            except OSError as e:
                self._pass_failed(e)
            except Exception:  # the loop must outlive any one bad pass
                log.exception("pass failed")

    def _pass_failed(self, e: OSError) -> None:
        """A write into STATE_DIR that the disk refused: a cluster member stops with one
        line (it can keep neither its jobs' lease nor its run records; the others take its
        jobs over), a standalone node says so in one line and goes on (its journal refuses
        what it cannot make durable)."""
        where = _filename_of(e) or (str(self.state_dir) if e.errno in FULL_DISK_ERRNOS and
                                    _full(self.state_dir) else "")
        if e.errno not in FULL_DISK_ERRNOS or not where or not Path(where).is_relative_to(self.state_dir):
            log.exception("pass failed")
            return
        if self.link.is_cluster:
            stop_for_disk(f"writing {Path(where).name}", Path(where).parent, e, log, self.state_dir)
        log.error("a pass failed: writing %s: %s; free space on the disk of STATE_DIR (%s)", where,
                  e.strerror or e, self.state_dir)

    def _may_rest(self, since_s: float) -> bool:
        """Whether a tick may pass without a pass: nothing is queued or running in the
        cluster, this member's role is the one it acts in, and the last pass is less than
        IDLE_TICK_S ago. (Every command applied wakes the loop, so a submission is not kept
        waiting; an idle member's loop costs little this way: issue 28 target 5.)"""
        if since_s >= IDLE_TICK_S or self.store.machine.has_active_jobs():
            return False
        return self.store.is_leader() == (self.scheduler.epoch is not None)

    def run_once(self) -> None:
        now = self.clock()
        self.refresh_telemetry()
        if self.store.is_leader():
            if time.monotonic() >= self._next_schedule_at:
                t0, cpu0 = time.monotonic(), time.thread_time()
                placed = self.scheduler.placements
                self.scheduler.run_once(now, self.store.term())
                # A pass over a long queue is costly: leave the CPU to the API and the
                # replication for twice as long as the pass took, five times when it
                # placed nothing (the queue waits for capacity), bounded by a tick; and
                # keep passes to about 2.5% of a core (PASS_REST_PER_CPU).
                spent, cpu = time.monotonic() - t0, time.thread_time() - cpu0
                rest = max(min(TICK_S, (2 if self.scheduler.placements > placed else 5) * spent),
                           min(PASS_REST_MAX_S, PASS_REST_PER_CPU * cpu))
                self._next_schedule_at = t0 + spent + rest if spent > 0.002 else 0.0
            else:
                self.scheduler.quick_place(now)  # jobs submitted since, while the full pass rests
        elif self.scheduler.epoch is not None:
            log.info("%s no longer schedules", self.node_name)
            self.scheduler.step_down()
        # In sync first, then the lease: a member found in sync has had a report taken
        # (which renewed the lease), and the scheduler renews its own here, so every job
        # the agent starts in this pass starts on a live lease.
        in_sync = self.link.in_sync()
        self.link.renew_lease()
        tel = self.local_telemetry
        self.agent_loop.run_once({g.vendor for g in tel.gpus} if tel else set(), in_sync)
        self.accounts.run_once()

    def refresh_telemetry(self, force: bool = False) -> None:
        mono = time.monotonic()  # the interval on the monotonic clock: a wall-clock jump does not stall it
        if not force and mono - self._last_telemetry < TELEMETRY_EVERY_S:
            return
        gpus, host = self.agent.sample()
        self.local_telemetry = NodeTelemetry(gpus=gpus, host=host, reported_at=self.clock(), heard_mono=mono)
        self.scheduler.report(self.node_name, self.local_telemetry)
        self._last_telemetry = mono
        self._register()

    def register_now(self) -> bool:
        """Record this member's inventory at once (e.g. an image `mt-container save` just
        staged), not at the next telemetry pass: True once committed here."""
        return self._register() is not False

    def _directlink_record(self) -> dict | None:
        """How clients reach this member through a relay, and its sshd's host key to pin."""
        if not self.directlink_id:
            return None
        try:
            host_key = " ".join((self.state_dir / "ssh" / "ssh_host_ed25519_key.pub").read_text().split()[:2])
        except OSError:  # no tenant yet, so no sshd yet: the next registration has it
            host_key = ""
        return {"id": self.directlink_id, "ssh_host_key": host_key}

    def _register(self) -> bool | None:
        """Record (or update) this member's inventory in the durable state: False when the
        change could not be committed now (the next pass tries again)."""
        tel = self.local_telemetry
        gpus = [{"index": g.index, "vendor": g.vendor, "model": g.model, "vram_total_bytes": g.vram_total_bytes}
                for g in tel.gpus]
        wanted = {"gpus": gpus, "cpus": float(tel.host.cpu_count), "mem_total_bytes": tel.host.mem_total_bytes,
                  "address": self.config.LISTEN,
                  "containers": self.agent.containers.capabilities() if self.agent.containers else None,
                  "directlink": self._directlink_record()}
        rec = self.store.machine.nodes.get(self.node_name)
        if rec is not None and all(rec.to_dict()[k] == v for k, v in wanted.items()):
            self._registered = True
            return True
        if self._registered and self.node_name in self.store.machine.removed:
            return True  # an admin removed this running member: it stays out until it is restarted
        # The first registration since this process started rejoins a member an admin removed.
        r = try_commit(self.store, C.NODE_REGISTER, name=self.node_name, at=self.clock(),
                       rejoin=not self._registered, **wanted)
        if r is None:
            return False  # the next second tries again
        if r["ok"]:
            self._registered = True
        elif self.node_name in self.store.machine.removed:
            log.warning("%s was removed from the cluster by an admin: it stays out until it is restarted",
                        self.node_name)
        return True


def _filename_of(e: BaseException | None) -> str:
    """The file a failed write named: its own, or that of the error it happened in the
    handling of (a write that fails on a full disk often fails again as its file is
    closed, and that second error names no file)."""
    while e is not None:
        if isinstance(e, OSError) and e.filename:
            return str(e.filename)
        e = e.__cause__ or e.__context__
    return ""


def _full(directory: Path) -> bool:
    """Whether the disk of `directory` has (next to) no room left: a failed write that names
    no file was then most likely one into it."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < (1 << 20)

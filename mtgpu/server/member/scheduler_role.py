"""The scheduler role: run on exactly one member (the standalone node, or the Raft
leader with a quorum). It decides; agents act.

A pass: make sure this scheduler's epoch is committed (so plans of any earlier
scheduler are refused by the state machine), mark members that stopped reporting
as down and deal with their jobs, ask the pure scheduler for a plan over the
committed state plus the soft telemetry, and commit each placement, fenced by the
epoch and re-checked by the state machine against the state it is applied to.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from ...model.job import JobState
from ...sched import Scheduler
from ...state import commands as C
from ...state.store import ReplicationError, Store, try_commit
from ..metrics import SchedulerTimings
from .retention import RETENTION_EVERY_S, apply_retention, retention_report
from .view import (NodeTelemetry, PreemptPolicy, build_queue, build_snapshot, build_usage, hold_dependents,
                   hold_preempted, pass_inputs)

log = logging.getLogger(__name__)

NEWS_AFTER_S = 2.0  # a report after this long a silence (members report once a second) is news
STALL_MIN_S = 2.0  # the shortest pause between two checks of the members taken for the scheduler's own stall
STALL_EXCUSED_EVERY = 3  # a stall of its own excused at most once per this many MEMBER_DOWN_AFTER_S


@dataclass
class SchedulerRole:
    store: Store
    node_name: str
    clock: object
    down_after_s: float = 10.0
    telemetry: dict[str, NodeTelemetry] = field(default_factory=dict)
    pending_reasons: dict[int, str] = field(default_factory=dict)
    epoch: int | None = None  # None: not (yet) the scheduler
    leader_since: float = 0.0
    # Silence is measured on the monotonic clock, which a step of the wall clock cannot move.
    monotonic: Callable[[], float] = time.monotonic
    leader_since_mono: float = 0.0
    placements: int = 0
    last_placement_at: float = 0.0
    _usage: dict = field(default_factory=dict)
    timings: SchedulerTimings = field(default_factory=SchedulerTimings)  # /metrics reads it (server/metrics.py)
    _usage_at: float = -1e18
    # The longest time between two reports of each member taken by this scheduler (soft,
    # since it schedules; its own member's are its loop's telemetry passes): how close a
    # busy member came to MEMBER_DOWN_AFTER_S (nodes --json, bench/busy_members.py).
    longest_gap_s: dict[str, float] = field(default_factory=dict)
    _last_check_mono: float | None = None  # when _check_members last ran
    _resumed_mono: float = -1e18  # when this scheduler last came back from a stall of its own

    def report(self, node: str, telemetry: NodeTelemetry) -> bool:
        """Keep a member's report; True when a pass should see it at once: the member's
        first report to this scheduler, or its first after a silence. Any other report
        is read by the next pass, at most a tick later (runtime.TICK_S): a pass woken by
        each report would run back to back once a thousand members report each second."""
        before = self.telemetry.get(node)
        self.telemetry[node] = telemetry
        if before is None:
            return True
        gap = telemetry.heard_mono - before.heard_mono
        if self.epoch is not None:
            counted = telemetry.heard_mono - max(before.heard_mono, self.leader_since_mono)
            if counted > self.longest_gap_s.get(node, 0.0):
                self.longest_gap_s[node] = counted
        return gap > NEWS_AFTER_S

    def step_down(self) -> None:
        self.epoch = None
        self.pending_reasons = {}
        self._last = None

    preempt: PreemptPolicy = field(default_factory=PreemptPolicy)  # [PREEMPTION]
    # The last full pass, for quick_place: (its engine, the state machine and its
    # capacity_version then, the ids of the jobs queued then)
    _last: tuple | None = None
    quick_placements: int = 0  # jobs placed by quick passes (read by tests)
    job_retention_s: float = 30 * 86400.0
    tenant_retention_s: float = 180 * 86400.0
    _next_retention_at: float = 0.0

    def run_once(self, now: float, term: int) -> None:
        if self.epoch != term:
            if not self._elect(term, now):
                return
            self._next_retention_at = self.monotonic() + 60.0  # settle first; then hourly
        began = self.monotonic()
        self._check_members(now)
        if self._place(now):  # a pass over an empty queue is not timed: it would hide the real ones
            self.timings.pass_done(self.monotonic() - began)
        if self.monotonic() >= self._next_retention_at:  # a wall-clock jump neither stalls nor hurries it
            self._next_retention_at = self.monotonic() + RETENTION_EVERY_S
            with self.store.lock:
                report = retention_report(self.store.machine, now, self.job_retention_s, self.tenant_retention_s,
                                          dry_run=False)
            try:
                apply_retention(self.store, report)
            except ReplicationError as e:  # next hour again
                log.warning("retention pass failed: %s", e)

    # ------------------------------------------------------------ epoch
    def _elect(self, term: int, now: float) -> bool:
        r = try_commit(self.store, C.SCHED_ELECT, node=self.node_name, epoch=term, at=now)
        if r is None or not r["ok"]:
            return False
        self.epoch = term
        self.leader_since = now
        self.leader_since_mono = self.monotonic()
        self.longest_gap_s = {}
        self._last_check_mono = None
        log.info("%s schedules now (epoch %d)", self.node_name, term)
        return True

    # ------------------------------------------------------------ health of members
    def _check_members(self, now: float) -> None:
        machine = self.store.machine
        mono = self.monotonic()
        if (self._last_check_mono is not None and mono - self._last_check_mono > self._stall_s()
                and mono - self._resumed_mono > STALL_EXCUSED_EVERY * self.down_after_s):
            # This scheduler did not run for a while itself (its machine starved it, or a
            # commit waited): reports may wait unread in its sockets, so a silence it saw
            # is not the members'. Silence counts again from now. Marking a member down
            # later is always safe (lease.py); marking it down for one's own stall is not
            # what MEMBER_DOWN_AFTER_S is for. Once per STALL_EXCUSED_EVERY x that at most:
            # a scheduler that stalls again and again still marks a dead member down.
            log.warning("%s did not check its members for %.1fs: their silence counts from now",
                        self.node_name, mono - self._last_check_mono)
            self._resumed_mono = mono
        self._last_check_mono = mono
        for node in list(machine.nodes.values()):
            if node.name == self.node_name:
                continue
            tel = self.telemetry.get(node.name)
            silent_s = mono - max(tel.heard_mono if tel else 0.0, self.leader_since_mono, self._resumed_mono)
            if not node.down and silent_s > self.down_after_s:
                reason = f"no report for {silent_s:.0f}s"
                log.warning("member %s is down: %s", node.name, reason)
                if try_commit(self.store, C.NODE_DOWN, name=node.name, reason=reason, at=now) is not None:
                    self._evict(node.name, reason, now)
            elif node.down and tel is not None and mono - tel.heard_mono < self.down_after_s / 2:
                log.info("member %s reports again", node.name)
                try_commit(self.store, C.NODE_UP, name=node.name, at=now)
            if node.down:
                self._evict(node.name, node.down_reason, now)  # finish what an earlier pass left undone

    def _stall_s(self) -> float:
        """A pause of this scheduler's own checks longer than this is its stall, not the
        members' silence: passes come every tick, or at most PASS_REST_MAX_S apart."""
        return max(STALL_MIN_S, self.down_after_s / 2)

    def _evict(self, node: str, reason: str, now: float) -> None:
        """Jobs with a rank on a down node: a single job is lost and requeued (unless it
        opted out with requeue=no: then it is `lost`); a gang fails, naming the rank."""
        for job in self.store.machine.running_jobs():
            ranks = [r for r, a in enumerate(job.allocations) if a.node == node]
            if not ranks:
                continue
            if len(job.allocations) > 1:
                try_commit(self.store, C.JOB_FINISH, job_id=job.id, at=now, state="failed", attempt=job.attempt,
                           rank=ranks[0], reason=f"rank {ranks[0]} on {node}: the node is down ({reason}); "
                                                 "the other ranks were stopped")
            elif job.spec.requeue:
                try_commit(self.store, C.JOB_REQUEUE, job_id=job.id, at=now, attempt=job.attempt,
                           reason=f"lost on {node} (node down: {reason}); requeued")
            else:
                try_commit(self.store, C.JOB_FINISH, job_id=job.id, at=now, state="lost", attempt=job.attempt,
                           reason=f"lost on {node} (node down: {reason}); the job asked not to be requeued")

    # ------------------------------------------------------------ placement
    def _place(self, now: float) -> bool:
        """One placement pass; False when the queue was empty (nothing was planned)."""
        machine = self.store.machine
        with self.store.lock:  # held briefly: the Raft thread needs it to apply anything (view.PassInputs)
            taken = pass_inputs(machine)
            snapshot = build_snapshot(machine, self.telemetry, self.preempt, now) if taken.queued else None
            version = machine.capacity_version
        self._last = None
        queue, waiting, never = hold_dependents(taken.jobs, build_queue(taken.queued, taken.running))
        if any(j.history for j in taken.queued):
            queue, held = hold_preempted(taken.jobs, queue, now)
            waiting.update(held)
        if queue and self.monotonic() - self._usage_at > 1.0:  # fair-share usage changes slowly; not every pass
            self._usage, self._usage_at = build_usage(taken.tenants, taken.jobs.values(), now), self.monotonic()
        usage = self._usage
        for job_id, why in never.items():  # a dependency that can never be met: as Slurm does, cancel
            try_commit(self.store, C.JOB_CANCEL, job_id=job_id, at=self.clock(), by="the scheduler", reason=why)
        if not queue:
            self.pending_reasons = waiting
            return False
        engine = Scheduler(snapshot)
        plan = engine.run(queue, now, usage)
        if not plan.preemptions:
            self._last = (engine, machine, version, {j.id for j in taken.queued})
        reasons = dict(plan.pending)
        reasons.update(plan.rejected)
        reasons.update(waiting)
        for placement in plan.placements:
            r = self._start(placement)
            if r is None:
                return True  # lost the cluster mid-pass; the next scheduler takes over
            if not r["ok"]:
                reasons[placement.job_id] = f"placement refused: {r['error']}"
                if "epoch" in r["error"]:
                    self.step_down()
                    return True
        for p in plan.preemptions:
            self._preempt(p, now, reasons)
        self.pending_reasons = reasons
        return True

    def quick_place(self, now: float) -> bool:
        """Between full passes (which rest after a long queue, up to PASS_REST_MAX_S): start
        jobs submitted since the last one at once, against what it left (Scheduler.place_new),
        while no command gave capacity back since (then only a full pass may decide: a job
        it found blocked may fit now). True when it placed something."""
        last = self._last
        if last is None or self.epoch is None:
            return False
        engine, machine, version, seen = last
        with self.store.lock:
            if self.store.machine is not machine or machine.capacity_version != version:
                self._last = None
                return False
            new = [j for j in machine.queued_jobs() if j.id not in seen and not j.history]
        if not new:
            return False
        seen.update(j.id for j in new)  # each is tried once here; the next full pass has the rest
        placements = engine.place_new(build_queue(new, ()), now, self._usage)
        for placement in placements:
            r = self._start(placement)
            if r is None or not r["ok"]:
                self._last = None  # the state and the engine disagree: a full pass next
                if r is not None and "epoch" in r["error"]:
                    self.step_down()
                return True
            if not r.get("skipped"):
                self.quick_placements += 1
                self.pending_reasons.pop(placement.job_id, None)
        return bool(placements)

    def _start(self, placement) -> dict | None:
        """Commit one placement (JOB_START, fenced by this scheduler's epoch): the commit's
        answer, {"ok": True, "skipped": True} for a job no longer queued (nothing to do), None
        when the cluster could not be reached."""
        job = self.store.machine.jobs.get(placement.job_id)
        if job is None or job.state is not JobState.QUEUED:
            return {"ok": True, "skipped": True}
        at = self.clock()
        r = try_commit(self.store, C.JOB_START, job_id=job.id, at=at, attempt=job.attempt,
                       epoch=self.epoch, allocations=[a.to_dict() for a in placement.allocations])
        if r is not None and r["ok"]:
            self.placements += 1
            self.last_placement_at = self.clock()
            self.timings.job_started(job, at)  # a start leaves submitted_at and history as they were
        return r

    def _preempt(self, p, now: float, reasons: dict[int, str]) -> None:
        """Tell an opportunistic job to stop for a guaranteed one (its member sends the signals)."""
        victim = self.store.machine.jobs.get(p.victim)
        if victim is None or victim.state is not JobState.RUNNING:
            return
        r = try_commit(self.store, C.JOB_PREEMPT, job_id=p.victim, by=p.for_job, at=self.clock(),
                       grace_s=self.preempt.grace_s, attempt=victim.attempt, epoch=self.epoch)
        if r is not None and r["ok"]:
            log.info("job %d preempted for job %d on %s (grace %gs)", p.victim, p.for_job, p.node, self.preempt.grace_s)
        elif r is not None:
            reasons[p.for_job] = f"preempting job {p.victim} was refused: {r['error']}"

"""A member's standing in its cluster, as people read it: in touch, or cut off since when,
and what still works on it then. Pure: the link (link.py) gathers the facts, this module
decides and words them; the API's health and nodes answers, `mtgpu-admin nodes`,
`mtgpu-setup status` and the dashboard show the result.

A scheduler cut off in a minority may still lead in pysyncobj's eyes for a few seconds
(leaderFallbackTimeout), then it is a follower that took no report since it started: both
read "lost the majority at HH:MM:SS", the moment a majority of the voters last answered
it. A plain member says since when it has reached no scheduler (the last report one took),
and "since it started" only when none ever took one since it started.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Facts:
    """What the link knows, on the monotonic clock (`now`) and the wall clock (`wall_now`),
    read at one moment."""

    node: str
    now: float
    wall_now: float
    leads: bool                   # the Raft leader with a quorum (store.is_leader())
    majority_heard_at: float      # when a majority of the voters last answered it as the leader (0: never)
    report_taken_at: float        # when the scheduler last took a report it sent (0: never)
    started_at: float             # when this member started
    stale_after_s: float          # a leader this long without a majority's answer places nothing
    report_fresh_s: float         # a member whose last report taken is younger is in touch
    lease_ends_at: float | None = None  # when the jobs' lease here lapses and the shims stop them (None: no lease)
    other_leader: bool = False    # its replica knows a Raft leader other than itself
    jobs_here: int = 0            # jobs and workspaces running here, as its replica has them


@dataclass(frozen=True)
class Standing:
    in_touch: bool
    lost: str | None = None        # "majority" (it was the scheduler) or "scheduler" (a member), when cut off
    since_wall: float | None = None  # the last moment it heard the cluster (None: never since it started)
    since_s: float | None = None
    jobs_stop_wall: float | None = None
    jobs_stopped: bool = False     # the lease already lapsed: the shims stopped the jobs that ran here
    problem: str | None = None     # one line: what is wrong since when, and what that means
    reason: str | None = None      # a short form, for the member's own row in a table of members
    works: list[str] = field(default_factory=list)
    fails: list[str] = field(default_factory=list)

    @property
    def health(self) -> str:
        return "up" if self.in_touch else "degraded"

    def role(self, role: str) -> str:
        """The member's own role as its replica has it, marked when cut off."""
        if self.lost == "majority":
            return "scheduler (no majority)"
        if self.lost == "scheduler":
            return f"{role} (no scheduler)"
        return role

    def to_json(self) -> dict:
        """The fields every answer that shows a member's standing carries (wall-clock
        seconds; the `_at` fields are None when not cut off or not known)."""
        return {
            "in_touch": self.in_touch,
            "health": self.health,
            "lost": self.lost,
            "majority_lost_at": self.since_wall if self.lost == "majority" else None,
            "scheduler_reached_at": self.since_wall if self.lost == "scheduler" else None,
            "cut_off_s": None if self.since_s is None else round(self.since_s, 1),
            "jobs_stop_at": self.jobs_stop_wall,
            "jobs_stopped": self.jobs_stopped,
            "problem": self.problem,
            "works": list(self.works),
            "fails": list(self.fails),
        }


def clock_text(wall: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(wall))


def _ago(age_s: float) -> str:
    return f"{age_s:.0f}s ago"


def decide(f: Facts) -> Standing:
    """The member's standing from its facts (see the module's docstring)."""
    if f.leads and f.now - f.majority_heard_at <= f.stale_after_s:
        return Standing(True)
    if not f.leads and f.report_taken_at and f.now - f.report_taken_at < f.report_fresh_s:
        return Standing(True)
    # A scheduler that just handed over to another leader counts as in touch until its
    # first report is taken (within a report or two). One that Raft stopped calling the
    # leader because it hears no majority knows no other leader: it is cut off.
    if not f.leads and f.other_leader and f.majority_heard_at and f.now - f.majority_heard_at < f.report_fresh_s:
        return Standing(True)
    was_scheduler = f.leads or (f.majority_heard_at > 0 and f.majority_heard_at >= f.report_taken_at)
    heard = f.majority_heard_at if was_scheduler else f.report_taken_at
    since_s = f.now - (heard or f.started_at)
    since_wall = f.wall_now - since_s if heard else None
    jobs_stop = f.wall_now - (f.now - f.lease_ends_at) if f.lease_ends_at is not None else None
    stopped = f.lease_ends_at is not None and f.now >= f.lease_ends_at
    if was_scheduler:
        when = f"at {clock_text(since_wall)} ({_ago(since_s)})"
        problem = (f"{f.node} was the scheduler and lost the majority of the voters {when}: it places nothing and "
                   "records no change; what it shows is its last state, maybe out of date")
        reason = f"lost the majority {when}"
        lost = "majority"
    else:
        when = (f"since {clock_text(since_wall)} ({_ago(since_s)})" if heard
                else f"since it started ({_ago(since_s)})")
        problem = (f"no scheduler reachable from {f.node} {when}: what is shown is the last state it knew, maybe out "
                   "of date (members, roles and jobs); a majority of the voters must be up for the cluster to place "
                   "work")
        reason = f"no scheduler reachable {when}"
        lost = "scheduler"
    return Standing(False, lost, since_wall, since_s, jobs_stop, stopped, problem, reason,
                    _works(f, jobs_stop, stopped), _fails())


def _works(f: Facts, jobs_stop_wall: float | None, stopped: bool) -> list[str]:
    works = ["reading the last state it knew: jobs, members, tenants (maybe out of date)",
             "logs of the jobs that ran on this member",
             "SSH logins and terminals on this member"]
    if jobs_stop_wall is None:
        return works
    at = clock_text(jobs_stop_wall)
    if stopped:
        works.append(f"none of its jobs: their lease ended at {at} and they were stopped, so that none runs twice "
                     "(the majority's scheduler requeues them)")
    else:
        running = f"its {f.jobs_here} running job(s) and workspace(s)" if f.jobs_here else "jobs running here"
        works.append(f"{running}, until {at} (in {f.lease_ends_at - f.now:.0f}s), when their lease ends: then "
                     "they are stopped, so that none runs twice (the majority's scheduler requeues them)")
    return works


def _fails() -> list[str]:
    return ["submitting, cancelling or changing anything (every change needs a majority of the voters)",
            "placing jobs, and starting any on this member",
            "logs of jobs on members it cannot reach"]

"""The durable commands: every change to tenants, nodes, jobs and allocations is one
of these, applied to the one deterministic state machine (state.machine).

Each command has an explicit, versioned name that is written to the journal (and,
in cluster mode, to the Raft log). Names are never reused or renumbered: a change
of a command's meaning gets a new version (`job.submit.v2`) and the machine keeps
applying the old one for journals written before.

A command is a plain dict: {"cmd": NAME, "args": {...}}. Time enters only through
the `at` argument, stamped by whoever proposes the command.
"""

from __future__ import annotations

TENANT_ENSURE = "tenant.ensure.v1"
TENANT_INVITE = "tenant.invite.v1"
TENANT_JOIN = "tenant.join.v1"
TENANT_ASSIGN = "tenant.assign.v1"
TENANT_REMOVE = "tenant.remove.v1"
TENANT_SEEN = "tenant.seen.v1"
TENANT_SHARE = "tenant.share.v1"
NODE_REGISTER = "node.register.v1"
NODE_DRAIN = "node.drain.v1"
NODE_RESUME = "node.resume.v1"
NODE_DOWN = "node.down.v1"
NODE_UP = "node.up.v1"
NODE_REMOVE = "node.remove.v1"  # journals before the removed members' list: no tombstone
NODE_REMOVE_V2 = "node.remove.v2"  # and the member is kept out until it restarts (node.register rejoin=)
SCHED_ELECT = "scheduler.elect.v1"
JOB_SUBMIT = "job.submit.v1"
JOB_SUBMIT_BATCH = "job.submit-batch.v1"
JOB_START = "job.start.v1"
JOB_ANNOTATE = "job.annotate.v1"
JOB_FINISH = "job.finish.v1"
JOB_CANCEL = "job.cancel.v1"
JOB_REQUEUE = "job.requeue.v1"
JOB_PREEMPT = "job.preempt.v1"
JOB_LATE_REPORT = "job.late-report.v1"
JOB_FORGET = "job.forget.v1"
CLUSTER_BARRIER = "cluster.barrier.v1"
WORKSPACE_STOP = "workspace.stop.v1"
WORKSPACE_START = "workspace.start.v1"

ALL_COMMANDS = (
    TENANT_ENSURE,
    TENANT_INVITE,
    TENANT_JOIN,
    TENANT_ASSIGN,
    TENANT_REMOVE,
    TENANT_SEEN,
    TENANT_SHARE,
    NODE_REGISTER,
    NODE_DRAIN,
    NODE_RESUME,
    NODE_DOWN,
    NODE_UP,
    NODE_REMOVE,
    NODE_REMOVE_V2,
    SCHED_ELECT,
    JOB_SUBMIT,
    JOB_SUBMIT_BATCH,
    JOB_START,
    JOB_ANNOTATE,
    JOB_FINISH,
    JOB_CANCEL,
    JOB_REQUEUE,
    JOB_PREEMPT,
    JOB_LATE_REPORT,
    JOB_FORGET,
    CLUSTER_BARRIER,
    WORKSPACE_STOP,
    WORKSPACE_START,
)


def command(cmd_name: str, /, **args) -> dict:
    """Build a command; `name` must be one of the names above."""
    if cmd_name not in ALL_COMMANDS:
        raise ValueError(f"unknown state-machine command {cmd_name!r}")
    return {"cmd": cmd_name, "args": args}

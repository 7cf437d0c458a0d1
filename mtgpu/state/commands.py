"""The durable commands: every change to tenants, nodes, jobs and allocations is one
of these, applied to the one deterministic state machine (state.machine).

Each command has an explicit, versioned name that is written to the journal (and,
in cluster mode, to the Raft log). Names are never reused or renumbered: a change
of a command's meaning gets a new version (`job.submit.v2`) and the machine keeps
applying the old one for journals written before.

A command is a plain dict: {"cmd": NAME, "args": {...}}. Time enters only through
the `at` argument, stamped by whoever proposes the command.

State formats (docs/INSTALL.md "Versions that mix"). Every command belongs to the state
format that introduced it (FORMAT_OF); STATE_FORMAT is the newest this mtgpu applies. A
command of a format above 1 carries it ({"cmd", "args", "format": F}): a member that
does not know the command can then say that it is newer, and which format, instead of
taking it for damage; an older mtgpu ignores the key. A member refuses a command or a
snapshot of a newer format (NewerFormat: it stops rather than apply part of the log),
and a member never proposes a command of a format some member of its cluster cannot
apply yet (state/raft.py's format floor, fed by the members' reports). Format 1 is
every command up to the one that brought this rule: mtgpu before it writes format 1.
"""

from __future__ import annotations

TENANT_ENSURE = "tenant.ensure.v1"
TENANT_INVITE = "tenant.invite.v1"
TENANT_JOIN = "tenant.join.v1"
TENANT_ASSIGN = "tenant.assign.v1"
TENANT_ASSIGN_V2 = "tenant.assign.v2"  # and where each cluster answers (servers): format 2
TENANT_ADMIT = "tenant.admit.v1"  # a tenant assigned here by another cluster's admin: format 2
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
STATE_SEED = "state.seed.v1"  # a new cluster takes a backup's state (setup/restore.py)

ALL_COMMANDS = (
    TENANT_ENSURE,
    TENANT_INVITE,
    TENANT_JOIN,
    TENANT_ASSIGN,
    TENANT_ASSIGN_V2,
    TENANT_ADMIT,
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
    STATE_SEED,
)


STATE_FORMAT = 2  # the newest state format this mtgpu applies and writes
# The format that introduced each command: a new command (or a new version of one) gets
# the next format number, and STATE_FORMAT moves up with it.
FORMAT_OF: dict[str, int] = {name: 1 for name in ALL_COMMANDS} | {
    TENANT_ASSIGN_V2: 2, TENANT_ADMIT: 2,  # many clusters, one admin (issue 29 point 3)
}


class NewerFormat(Exception):
    """A command or a snapshot of a state format this mtgpu does not apply: written by a
    newer mtgpu. Nothing of it was applied."""

    def __init__(self, what: str, found: int | None) -> None:
        self.found = found
        written = f"state format {found}" if found else "a state format newer than this one knows"
        super().__init__(f"{what} is of {written}, and this mtgpu applies state format {STATE_FORMAT} at most "
                         "(written by a newer mtgpu): upgrade mtgpu on this machine to the version the other members "
                         "run (mtgpu-setup upgrade --from ...)")


def format_of(cmd_name: str) -> int:
    """The state format of a command this mtgpu knows (1 for the names of format 1)."""
    return FORMAT_OF[cmd_name]


def command(cmd_name: str, /, **args) -> dict:
    """Build a command; `name` must be one of the names above."""
    if cmd_name not in ALL_COMMANDS:
        raise ValueError(f"unknown state-machine command {cmd_name!r}")
    fmt = FORMAT_OF[cmd_name]
    return {"cmd": cmd_name, "args": args} if fmt == 1 else {"cmd": cmd_name, "args": args, "format": fmt}


def newer_than_known(command: dict) -> NewerFormat | None:
    """Why this mtgpu must not apply `command` (it is of a newer state format), or None.
    An unknown name without a format is not newer (damage, or a foreign command: the
    machine answers it as unknown, as before)."""
    name = command.get("cmd")
    fmt = command.get("format")
    if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt > STATE_FORMAT:
        return NewerFormat(f"the command {name!r}", fmt)
    return None

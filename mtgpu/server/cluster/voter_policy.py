"""Which members vote, and who schedules: a pure decision, one step at a time.

The scheduler (the Raft leader) calls `plan_voters` about once a second with what
it knows of every registered member and carries out the one step it returns
(server/voter_keeper.py). Over a few steps the voters become the most capable
members and the most capable voter schedules:

- The voters are a small odd set: 5 once the cluster has five members, 3 once it
  has three, else 1. They are the first members in `rank` order: members not
  marked down, then more GPUs, more GPU memory, more CPUs, more
  memory; the name breaks ties, so every scheduler computes the same set.
- Raft changes membership one voter at a time, so a swap adds the new voter first
  (for a moment there is one voter more, an even number, whose majority still
  holds) and only then drops the weaker one, once every other voter has caught up.
- The scheduler hands its role to the best voter that has caught up when that one
  is more capable, or when the scheduler itself is no longer among the wanted voters.

No I/O and no clock here: everything comes in as arguments (tests/unit/server/).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_VOTERS = 5


@dataclass(frozen=True)
class MemberState:
    name: str
    raft: str                 # its Raft address
    capability: tuple         # larger is more capable (capability())
    healthy: bool             # reports to the scheduler and is not marked down
    down: bool                # marked down by the scheduler
    role: str | None          # what it last said its replica runs as: "voter", "member", or None (no word yet)
    settled: bool             # its replica has caught up with the leader


@dataclass(frozen=True)
class Step:
    action: str               # "promote", "demote", "remove" or "transfer"
    name: str
    raft: str
    why: str


def capability(rec) -> tuple:
    """How capable a member (its NodeRecord) is: GPUs, then their memory, then CPUs,
    then memory."""
    return (len(rec.gpus), sum(g.vram_total_bytes for g in rec.gpus), rec.cpus, rec.mem_total_bytes)


def voter_count(members: int) -> int:
    """How many voters a cluster of `members` members has: 5, 3 or 1."""
    return MAX_VOTERS if members >= MAX_VOTERS else 3 if members >= 3 else 1


def rank(members: list[MemberState]) -> list[MemberState]:
    # Marked down, not merely late with a report: a voter that misses one report
    # keeps its place (no swap back and forth over a blip).
    return sorted(members, key=lambda m: (m.down, tuple(-x for x in m.capability), m.name))


def plan_voters(members: list[MemberState], config: set[str], leader: str) -> Step | None:
    """The next step towards the wanted voters, or None when there is nothing to do.
    `config` holds the Raft addresses of the voters now; `leader` is the scheduler's name."""
    me = next((m for m in members if m.name == leader), None)
    if me is None or me.raft not in config:
        return None  # not registered yet: wait for the inventory
    by_raft = {m.raft: m for m in members}
    ranked = rank(members)
    k = voter_count(len(members))
    wanted = {m.name for m in ranked[:k]}

    # A voter that runs as a non-voting member (it lost its role, e.g. restarted from
    # an old record, or a promotion did not reach it) is taken out; it may be promoted
    # again properly later.
    for addr in sorted(config):
        m = by_raft.get(addr)
        if m is not None and m.name != leader and m.role == "member" and m.settled:
            return Step("remove", m.name, addr, f"{m.name} is a voter in the configuration but runs as a member")

    # The scheduler role goes to the best voter that has caught up.
    voters = [m for m in ranked if m.raft in config and (m is me or (m.healthy and m.role == "voter" and m.settled))]
    best = voters[0]
    if best is not me and (me.name not in wanted or best.capability > me.capability):
        why = "it is more capable" if best.capability > me.capability else f"{leader} is no longer a wanted voter"
        return Step("transfer", best.name, best.raft, f"the scheduler role moves to {best.name}: {why}")

    # Grow: the most capable wanted member that does not vote yet.
    if len(config) <= k:
        for m in ranked[:k]:
            if m.raft not in config and m.healthy and m.role == "member":
                return Step("promote", m.name, m.raft, f"{m.name} is among the {k} most capable members")

    # Shrink: above k voters, drop an unwanted one; a member marked down first, and a
    # live one only once every other voter has caught up (their majority must hold).
    if len(config) > k:
        for m in reversed(ranked):
            if m.raft not in config or m.name in wanted or m is me:
                continue
            if m.down:
                return Step("remove", m.name, m.raft, f"{m.name} is marked down and a more capable member votes now")
            if not m.healthy:
                continue  # not reporting for a moment: wait until it reports or is marked down
            others = [by_raft.get(a) for a in config if a not in (m.raft, me.raft)]
            if all(o is not None and o.role == "voter" and o.settled for o in others):
                return Step("demote", m.name, m.raft, f"{m.name} is not among the {k} most capable members")
    return None

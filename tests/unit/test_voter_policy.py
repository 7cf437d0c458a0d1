"""The voter and scheduler choice (server/voter_policy.py), step by step, with no I/O."""

from __future__ import annotations

from mtgpu.server.cluster.voter_policy import MemberState, plan_voters, voter_count

G = 24 << 30


def member(name: str, gpus: int = 2, role: str | None = "voter", healthy: bool = True, down: bool = False,
           settled: bool = True, cpus: int = 16) -> MemberState:
    return MemberState(name=name, raft=f"{name}:1", capability=(gpus, gpus * G, cpus, 64 << 30),
                       healthy=healthy and not down, down=down, role=role, settled=settled)


def config(*names: str) -> set[str]:
    return {f"{n}:1" for n in names}


def run_to_rest(members: dict[str, MemberState], voters: set[str], leader: str, limit: int = 20):
    """Carry out the steps the way the keeper does (a promoted member reopens as a
    voter, a demoted one as a member) until there is nothing to do."""
    steps = []
    for _ in range(limit):
        step = plan_voters(list(members.values()), voters, leader)
        if step is None:
            return voters, leader, steps
        steps.append((step.action, step.name))
        m = members[step.name]
        if step.action == "promote":
            voters = voters | {m.raft}
            members[m.name] = MemberState(**{**m.__dict__, "role": "voter"})
        elif step.action == "demote":
            voters = voters - {m.raft}
            members[m.name] = MemberState(**{**m.__dict__, "role": "member"})
        elif step.action == "remove":
            voters = voters - {m.raft}
        elif step.action == "transfer":
            leader = step.name
    raise AssertionError(f"no rest after {limit} steps: {steps}")


def test_voter_counts_are_odd_and_at_most_five():
    assert [voter_count(n) for n in range(1, 9)] == [1, 1, 3, 3, 5, 5, 5, 5]


def test_equal_members_keep_their_voters_and_scheduler():
    ms = {n: member(n) for n in ("m0", "m1", "m2")} | {"m3": member("m3", role="member")}
    assert plan_voters(list(ms.values()), config("m0", "m1", "m2"), "m1") is None


def test_a_more_capable_joiner_becomes_a_voter_then_schedules_and_the_weakest_steps_down():
    ms = {n: member(n) for n in ("m0", "m1", "m2")} | {"m3": member("m3", gpus=8, role="member")}
    voters, leader, steps = run_to_rest(ms, config("m0", "m1", "m2"), "m0")
    assert steps == [("promote", "m3"), ("transfer", "m3"), ("demote", "m2")]
    assert voters == config("m3", "m0", "m1") and leader == "m3"


def test_a_weak_scheduler_hands_over_before_it_is_demoted():
    ms = {n: member(n, gpus=4) for n in ("m0", "m1")} | {"m2": member("m2", gpus=1), "m3": member("m3", gpus=4, role="member")}
    voters, leader, steps = run_to_rest(ms, config("m0", "m1", "m2"), "m2")
    assert voters == config("m0", "m1", "m3") and leader == "m0"
    assert steps.index(("transfer", "m0")) < steps.index(("demote", "m2"))
    # Never more than one voter above the wanted three, never a demotion of the scheduler itself.
    assert ("demote", "m2") == steps[-1]


def test_growing_to_five_members_makes_five_voters_one_at_a_time():
    ms = {n: member(n) for n in ("m0", "m1", "m2")} | {n: member(n, role="member") for n in ("m3", "m4")}
    voters, _, steps = run_to_rest(ms, config("m0", "m1", "m2"), "m0")
    assert steps == [("promote", "m3"), ("promote", "m4")] and len(voters) == 5


def test_a_two_member_cluster_has_one_voter():
    ms = {"a": member("a"), "b": member("b", gpus=1)}
    voters, leader, steps = run_to_rest(ms, config("a", "b"), "a")
    assert voters == config("a") and steps == [("demote", "b")]


def test_a_voter_marked_down_is_replaced_by_a_healthy_member():
    ms = {"m0": member("m0"), "m1": member("m1"), "m2": member("m2", down=True), "m3": member("m3", role="member")}
    voters, _, steps = run_to_rest(ms, config("m0", "m1", "m2"), "m0")
    assert steps == [("promote", "m3"), ("remove", "m2")] and voters == config("m0", "m1", "m3")


def test_a_voter_late_with_one_report_is_not_swapped_out():
    ms = {"m0": member("m0"), "m1": member("m1"), "m2": member("m2", healthy=False), "m3": member("m3", role="member")}
    assert plan_voters(list(ms.values()), config("m0", "m1", "m2"), "m0") is None


def test_no_demotion_while_another_voter_still_catches_up():
    ms = {n: member(n) for n in ("m0", "m1")} | {"m2": member("m2", gpus=1), "m3": member("m3", gpus=2, settled=False)}
    step = plan_voters(list(ms.values()), config("m0", "m1", "m2", "m3"), "m0")
    assert step is None
    ms["m3"] = member("m3", gpus=2)
    step = plan_voters(list(ms.values()), config("m0", "m1", "m2", "m3"), "m0")
    assert (step.action, step.name) == ("demote", "m2")


def test_a_voter_running_as_a_member_is_taken_out_and_promoted_again():
    ms = {"m0": member("m0"), "m1": member("m1"), "m2": member("m2", role="member")}
    voters, _, steps = run_to_rest(ms, config("m0", "m1", "m2"), "m0")
    assert steps == [("remove", "m2"), ("promote", "m2")] and voters == config("m0", "m1", "m2")


def test_no_word_yet_means_no_step_for_that_member():
    ms = {"m0": member("m0"), "m1": member("m1"), "m2": member("m2"), "m3": member("m3", gpus=8, role=None)}
    assert plan_voters(list(ms.values()), config("m0", "m1", "m2"), "m0") is None


def test_an_unregistered_scheduler_waits_for_its_inventory():
    ms = {"m1": member("m1"), "m2": member("m2")}
    assert plan_voters(list(ms.values()), config("m0", "m1", "m2"), "m0") is None

"""Which exec sessions of a workspace count as attached (agent/podman/exec_sessions.py): a
running one (it has a conmon), a new quiet one (it may be starting); quiet at two samples in a
row, it is a dead one (a failed `podman exec` podman never removed) and is removed."""

from mtgpu.agent.podman.exec_sessions import split_sessions


def test_a_running_session_counts_at_every_sample():
    active, dead, quiet = split_sessions(["s1"], live={"s1"}, quiet_before={"s1"})
    assert active == ["s1"] and dead == [] and quiet == set()


def test_a_session_without_a_conmon_counts_once_then_is_removed_as_dead():
    active, dead, quiet = split_sessions(["s1", "s2"], live={"s2"}, quiet_before=set())
    assert active == ["s1", "s2"] and dead == [] and quiet == {"s1"}
    active, dead, quiet = split_sessions(["s1", "s2"], live={"s2"}, quiet_before=quiet)
    assert active == ["s2"] and dead == ["s1"]


def test_a_session_whose_conmon_came_between_two_samples_is_kept():
    active, dead, _ = split_sessions(["s1"], live={"s1"}, quiet_before={"s1"})
    assert active == ["s1"] and not dead

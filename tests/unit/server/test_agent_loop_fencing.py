"""A job whose supervisor (shim) died runs on with nobody to fence it: the member's server
kills it once its lease has lapsed, as the shim would have (agent_loop._fence_unsupervised)."""

from __future__ import annotations

from types import SimpleNamespace

from mtgpu.server.member.agent_loop import AgentLoop
from tests.unit.server.agent_loop_builders import agent_loop, hand_moved_clock


class FakeAgent:
    containers = None

    def __init__(self) -> None:
        self.fenced: list[str] = []

    def fence_unsupervised(self, why: str) -> list[int]:
        self.fenced.append(why)
        return [7]


def loop_with(tmp_path, lease) -> tuple[AgentLoop, FakeAgent]:
    agent = FakeAgent()
    return agent_loop(tmp_path, agent, lease)[0], agent


def test_unsupervised_jobs_are_fenced_only_once_the_lease_has_lapsed(tmp_path, monkeypatch):
    clock = hand_moved_clock(monkeypatch)
    lease = SimpleNamespace(at=995.0, timeout_s=7.0)
    loop, agent = loop_with(tmp_path, lease)
    assert loop._fence_unsupervised() == [] and agent.fenced == []  # 5 s old: live
    clock[0] = 1002.0
    assert loop._fence_unsupervised() == []  # exactly the timeout: still live
    clock[0] = 1002.1
    assert loop._fence_unsupervised() == [7]
    assert agent.fenced[0].startswith("fenced: ") and "more than 7s" in agent.fenced[0]


def test_a_standalone_node_has_no_lease_and_fences_nothing(tmp_path, monkeypatch):
    clock = hand_moved_clock(monkeypatch)
    loop, agent = loop_with(tmp_path, None)
    clock[0] = 1e9
    assert loop._fence_unsupervised() == [] and agent.fenced == []

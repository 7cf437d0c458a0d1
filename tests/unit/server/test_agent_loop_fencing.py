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


class StartingAgent(FakeAgent):
    """An agent that records what it was asked to start (and has no images, GPUs, ...)."""

    gpu_devices: dict = {}
    runner = None

    def __init__(self) -> None:
        super().__init__()
        self.started: list[int] = []

    def gpu_indices(self) -> list[int]:
        return []

    def start(self, launch, attempt: int) -> dict:
        self.started.append(launch.job_id)
        return {}


def test_a_job_placed_here_while_the_lease_has_lapsed_waits_until_it_is_renewed(tmp_path, monkeypatch, caplog):
    """A member whose lease has lapsed (its first report not taken yet, as when a cluster is
    just formed, or cut off) does not start a job placed on it: its shim would fence it at
    once and the job be requeued for nothing. It starts it once the lease is renewed."""
    from mtgpu.model.job import Job, JobSpec, JobState, NodeAllocation
    from mtgpu.server.member import agent_loop as mod

    monkeypatch.setattr(mod, "supplementary_groups", lambda user, gid: ())
    clock = hand_moved_clock(monkeypatch)
    lease = SimpleNamespace(at=990.0, timeout_s=2.0, path=tmp_path / "lease")  # 10 s old: lapsed
    agent = StartingAgent()
    loop = agent_loop(tmp_path, agent, lease)[0]
    job = Job(id=5, tenant="alice", uid=250005, gid=250005, spec=JobSpec(script="true\n"), state=JobState.RUNNING,
              submitted_at=0.0, allocations=(NodeAllocation("m1", (), 0.0, 0, None),))
    with caplog.at_level("INFO", logger=mod.log.name):
        loop._start(job, 0)
        loop._start(job, 0)
    assert agent.started == []
    assert sum("not started yet: this member's lease lapsed" in r.getMessage() for r in caplog.records) == 1
    lease.at = clock[0] - 0.5  # a report taken: renewed
    loop._start(job, 0)
    assert agent.started == [5]

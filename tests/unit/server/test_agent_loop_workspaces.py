"""The agent loop removes the containers of removed workspaces (agent_loop.remove_workspaces):
each one once, and it looks for them (a scan of every job) at most once a second on the
monotonic clock, not on every pass, so that a removal still happens within about a second."""

from __future__ import annotations

from types import SimpleNamespace

from mtgpu.model.job import Job, JobSpec, JobState, WorkspaceSpec
from mtgpu.server.member.agent_loop import WORKSPACE_SWEEP_EVERY_S
from tests.unit.server.agent_loop_builders import agent_loop, hand_moved_clock


class FakeRunner:
    def __init__(self) -> None:
        self.removed: list[tuple[int, int, int, str]] = []

    def remove_workspace(self, job_id: int, uid: int, gid: int, home: str) -> bool:
        self.removed.append((job_id, uid, gid, home))
        return True


def workspace_job(job_id: int, state: JobState, node: str = "m1") -> Job:
    uid = 3_000_000_000 + job_id  # no OS account: the home is the one under the home root
    return Job(job_id, f"t{job_id}", uid, uid, JobSpec(workspace=WorkspaceSpec(f"ws{job_id}")), state=state,
               ws={"node": node, "removed": False, "container": f"c{job_id}"})


def test_a_removed_workspace_is_removed_once_and_the_jobs_are_scanned_at_most_once_a_second(tmp_path, monkeypatch):
    clock = hand_moved_clock(monkeypatch)
    runner = FakeRunner()
    loop, store = agent_loop(tmp_path, SimpleNamespace(runner=runner, containers=None))
    jobs = store.machine.jobs
    jobs[1] = workspace_job(1, JobState.CANCELLED)
    jobs[2] = workspace_job(2, JobState.RUNNING)  # still running: kept
    jobs[3] = workspace_job(3, JobState.CANCELLED, node="m2")  # another member's
    jobs[4] = workspace_job(4, JobState.CANCELLED)  # cancelled, its run still being stopped here: not yet

    t0 = clock[0]
    loop.remove_workspaces({4})
    assert runner.removed == [(1, jobs[1].uid, jobs[1].gid, "/homes/t1")]
    assert jobs[1].ws["removed"] is True
    assert [c["args"] for c in store.committed] == [{"job_id": 1, "ws": {"removed": True}}]

    # Within the second no pass looks again, however many there are...
    jobs[2].state = JobState.CANCELLED
    for k in range(1, 100):
        clock[0] = t0 + k * WORKSPACE_SWEEP_EVERY_S / 100
        loop.remove_workspaces(set())
    assert [r[0] for r in runner.removed] == [1]
    # ...and the first pass a second after the last look removes what was removed since.
    clock[0] = t0 + WORKSPACE_SWEEP_EVERY_S
    loop.remove_workspaces(set())
    assert sorted(r[0] for r in runner.removed) == [1, 2, 4]
    assert all(jobs[j].ws["removed"] is True for j in (1, 2, 4)) and jobs[3].ws["removed"] is False

    clock[0] += WORKSPACE_SWEEP_EVERY_S
    loop.remove_workspaces(set())  # each once: nothing is removed twice
    assert sorted(r[0] for r in runner.removed) == [1, 2, 4]
    assert len(store.committed) == 3


def test_a_runner_without_workspaces_is_never_asked(tmp_path):
    loop, store = agent_loop(tmp_path, SimpleNamespace(runner=SimpleNamespace(), containers=None))
    store.machine.jobs[1] = workspace_job(1, JobState.CANCELLED)
    loop.remove_workspaces(set())
    assert store.committed == [] and loop._next_ws_sweep == 0.0

"""`mt-job attach` on the node's side (server/api/sessions.py): which jobs a session may join
and what it is told, with a stand-in member (the moving itself is tested with real cgroups
and real SSH sessions in tests/integration/test_session_gpus.py)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from mtgpu.model.gpu import GpuInfo
from mtgpu.model.job import GpuSlot, Job, JobState, NodeAllocation
from mtgpu.server.api import sessions
from mtgpu.server.api.identity import Caller
from mtgpu.server.api.service import ServiceError
from tests.unit.sched.builders import make_spec

ALICE = Caller(uid=os.getuid(), gid=os.getgid(), pid=os.getpid(), name="alice", is_admin=False)


class Cgroups:
    def __init__(self, jobs):
        self.jobs, self.entered = set(jobs), []

    def get(self, job_id):
        return object() if job_id in self.jobs else None

    def enter(self, job_id, pid):
        self.entered.append((job_id, pid))


def make_job(job_id=7, state=JobState.RUNNING, node="m1", gpus=(1,), uid=ALICE.uid, tenant="alice", slurm=False):
    spec = make_spec("1" if gpus else None)
    if slurm:
        from dataclasses import replace
        spec = replace(spec, slurm=True)
    allocs = (NodeAllocation(node, tuple(GpuSlot(i) for i in gpus), cpus=2, vendor="nvidia" if gpus else None),) \
        if state is not JobState.QUEUED else ()
    return Job(id=job_id, tenant=tenant, uid=uid, gid=uid, spec=spec, state=state, allocations=allocs)


def make_service(*jobs, cgroup_jobs=None, node="m1"):
    cgroups = Cgroups(cgroup_jobs if cgroup_jobs is not None else [j.id for j in jobs])
    agent = SimpleNamespace(runner=SimpleNamespace(cgroups=cgroups), gpu_devices={},
                            last_gpus=lambda: [GpuInfo(0, "nvidia", "RTX 4090", 24 << 30),
                                               GpuInfo(1, "nvidia", "RTX 4090", 24 << 30)])
    machine = SimpleNamespace(jobs={j.id: j for j in jobs}, nodes={},
                              running_jobs=lambda: [j for j in jobs if j.state is JobState.RUNNING])
    service = SimpleNamespace(node_name=node, store=SimpleNamespace(machine=machine),
                              member=SimpleNamespace(agent=agent, agent_loop=SimpleNamespace(mps=False)),
                              config=SimpleNamespace(TENANT_HOME_ROOT="/home/mtgpu"),
                              _check_peer=lambda caller: None)
    return service, cgroups


def refusal(service, caller, job_id) -> tuple[int, str]:
    with pytest.raises(ServiceError) as e:
        sessions.attach(service, caller, job_id)
    return e.value.status, str(e.value)


def test_attach_moves_the_caller_into_its_running_job_and_hands_it_the_jobs_variables():
    service, cgroups = make_service(make_job())
    got = sessions.attach(service, ALICE, 7)
    assert cgroups.entered == [(7, ALICE.pid)]
    assert got["job_id"] == 7 and got["node"] == "m1" and got["gpus"] == [1]
    env = got["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["MTGPU_JOB_ID"] == "7" and env["MTGPU_NODE"] == "m1"
    assert not {"PATH", "HOME", "SHELL", "USER"} & set(env)  # the session keeps its own


def test_a_slurm_jobs_session_sees_its_slurm_variables_too():
    service, _ = make_service(make_job(slurm=True))
    env = sessions.attach(service, ALICE, 7)["env"]
    assert env["SLURM_JOB_ID"] == "7" and env["SLURM_JOB_GPUS"] == "1"


def test_another_tenants_job_is_no_job_of_yours_and_nothing_is_moved():
    service, cgroups = make_service(make_job(uid=ALICE.uid + 1, tenant="bob"))
    assert refusal(service, ALICE, 7) == (404, "no job 7 of yours; `mt-job list` shows your jobs")
    admin = Caller(uid=ALICE.uid, gid=ALICE.gid, pid=ALICE.pid, name="root-ish", is_admin=True)
    status, message = refusal(service, admin, 7)
    assert status == 403 and "job 7 is bob's" in message
    assert cgroups.entered == []


@pytest.mark.parametrize("state, words", [
    (JobState.COMPLETED, "job 7 is completed: only a running job can be attached to; `mt-job submit`"),
    (JobState.CANCELLED, "job 7 is cancelled: only a running job"),
    (JobState.QUEUED, "job 7 is queued, not running: attach once it runs (`mt-job show 7` says why it waits)"),
])
def test_a_job_that_is_not_running_is_refused_saying_so(state, words):
    service, cgroups = make_service(make_job(state=state))
    status, message = refusal(service, ALICE, 7)
    assert status == 409 and words in message, message
    assert cgroups.entered == []


def test_a_job_running_on_another_member_is_refused_naming_where_to_run_it():
    service, cgroups = make_service(make_job(node="m2"), node="m1")
    status, message = refusal(service, ALICE, 7)
    assert status == 409 and message == "job 7 runs on m2, not on m1: log in to m2 and run `mt-job attach 7` there"
    assert cgroups.entered == []


def test_a_job_with_no_cgroup_here_is_refused_rather_than_joined_unfenced():
    service, cgroups = make_service(make_job(), cgroup_jobs=[])
    status, message = refusal(service, ALICE, 7)
    assert status == 409 and "job 7 has no cgroup on m1" in message
    assert cgroups.entered == []


def test_the_gpu_view_names_each_gpus_device_nodes_and_the_callers_job_on_it():
    service, _ = make_service(make_job(), make_job(8, uid=ALICE.uid + 1, tenant="bob", gpus=(0,)))
    service.member.agent.gpu_devices = {0: ("/dev/nvidia0",), 1: ("/dev/nvidia1",)}
    got = sessions.local_gpus(service, ALICE)
    assert [(g["index"], g["devices"], g["your_jobs"]) for g in got] == [
        (0, ["/dev/nvidia0"], []), (1, ["/dev/nvidia1"], [7])]  # bob's job on GPU 0 is not named


def test_an_ssh_login_with_mtgpu_job_runs_mt_job_attach_in_tmux_or_not(monkeypatch):
    from mtgpu.ssh.wrapper import job_argv

    monkeypatch.setenv("MTGPU_PYTHON", "/venv/bin/python")
    monkeypatch.setenv("MTGPU_SOCKET", "/var/lib/mtgpu/mtgpu.sock")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    base = ["/venv/bin/python", "-m", "mtgpu.cli.job", "attach"]
    assert job_argv("12", "nvidia-smi -L", True, "/usr/bin/tmux", "main", "/bin/bash") == \
        base + ["12", "--", "/bin/bash", "-c", "nvidia-smi -L"]  # a command: never in tmux
    assert job_argv("12", None, True, "/usr/bin/tmux", "main", "/bin/bash") == \
        ["/usr/bin/tmux", "new-session", "-A", "-s", "job-12",
         "env MTGPU_SOCKET=/var/lib/mtgpu/mtgpu.sock /venv/bin/python -m mtgpu.cli.job attach --hold 12"]
    assert job_argv("12", None, True, "/usr/bin/tmux", "train", "/bin/bash")[4] == "train"  # MTGPU_TERMINAL=tmux:train
    assert job_argv("12", None, False, None, "main", "/bin/bash") == base + ["12"]
    assert job_argv("12; rm -rf ~", None, False, None, "main", "/bin/bash") is None
    assert job_argv("lab", None, False, None, "main", "/bin/bash") is None


def test_session_gpus_defaults_to_none_takes_all_and_refuses_anything_else_naming_the_choices():
    from mtgpu.config.loader import ConfigError, config_from_dict

    assert config_from_dict({}).SESSION_GPUS == "none"
    assert config_from_dict({"SESSION_GPUS": "all"}).SESSION_GPUS == "all"
    with pytest.raises(ConfigError) as e:
        config_from_dict({"SESSION_GPUS": "some"})
    assert 'SESSION_GPUS = "some": allowed: "none" or "all"' in str(e.value)

"""The /metrics collector (server/metrics.py) with stand-in objects: Prometheus names and
labels, no tenant name unless an admin opts in, the histograms' waits, who may scrape,
and the `[METRICS]` section's validation."""

from __future__ import annotations

import re
import threading
from collections import Counter
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mtgpu.config import ConfigError, config_from_dict
from mtgpu.model.job import GpuSlot, Job, JobSpec, JobState, NodeAllocation, WorkspaceSpec
from mtgpu.server.metrics import (
    DirectLinkFigures,
    Figures,
    GpuFigures,
    MemberFigures,
    RaftFigures,
    SchedulerTimings,
    exposition,
    families,
    member_registry,
    read_figures,
    scrape_refusal,
)

NAME_RE = re.compile(r"^mtgpu_[a-z][a-z0-9_]*$")
LABEL_RE = re.compile(r"^[a-z][a-z0-9_]*$")


def make_figures(**kw) -> Figures:
    base = dict(
        node="gpu-1",
        gpus=[GpuFigures(0, "nvidia", "H200", 42.0, 10 * 2**30, 141 * 2**30, 20 * 2**30, 0.5),
              GpuFigures(1, "nvidia", "H200", None, None, 141 * 2**30, 0, 0.0)],
        members=[MemberFigures("gpu-1", "scheduler", "up"), MemberFigures("gpu-2", "voter", "drained"),
                 MemberFigures("gpu-3", "member", "down")],
        jobs=Counter({("job", "running", "alice"): 2, ("job", "queued", "bob"): 1,
                      ("workspace", "stopped", "alice"): 1}),
        tenant_gpus={"alice": 1.5},
        raft=RaftFigures(True, True, 7, 120, 119, 3),
        directlink=DirectLinkFigures(True, 2, 1),
        is_scheduler=True, placements=5,
    )
    base.update(kw)
    return Figures(**base)


def samples(fams) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams for s in f.samples}


def value(fams, name: str, **labels) -> float:
    return samples(fams)[(name, tuple(sorted(labels.items())))]


def test_every_family_follows_the_prometheus_naming_conventions():
    fams = families(make_figures(), tenant_labels=True)
    for f in fams:
        assert NAME_RE.match(f.name), f.name
        assert f.documentation, f.name
        for s in f.samples:
            assert all(LABEL_RE.match(k) for k in s.labels), (f.name, s.labels)
            assert "job" not in s.labels and "instance" not in s.labels  # Prometheus' own target labels
        if f.type == "counter":
            assert all(s.name.endswith("_total") for s in f.samples), f.name
        else:
            assert not f.name.endswith("_total"), f.name


def test_gpu_series_are_this_members_gpus_in_base_units():
    fams = families(make_figures())
    assert value(fams, "mtgpu_gpu_utilization_ratio", node="gpu-1", gpu="0") == pytest.approx(0.42)
    assert value(fams, "mtgpu_gpu_memory_used_bytes", node="gpu-1", gpu="0") == 10 * 2**30
    assert value(fams, "mtgpu_gpu_memory_total_bytes", node="gpu-1", gpu="1") == 141 * 2**30
    assert value(fams, "mtgpu_gpu_memory_reserved_bytes", node="gpu-1", gpu="0") == 20 * 2**30
    assert value(fams, "mtgpu_gpu_committed_ratio", node="gpu-1", gpu="0") == 0.5
    assert value(fams, "mtgpu_gpu_info", node="gpu-1", gpu="1", vendor="nvidia", model="H200") == 1
    # a GPU not measured yet has no utilization or usage sample rather than a made-up zero
    keys = samples(fams)
    assert ("mtgpu_gpu_utilization_ratio", (("gpu", "1"), ("node", "gpu-1"))) not in keys
    assert ("mtgpu_gpu_memory_used_bytes", (("gpu", "1"), ("node", "gpu-1"))) not in keys


def test_members_jobs_raft_and_directlink_figures():
    fams = families(make_figures())
    assert value(fams, "mtgpu_member_up", node="gpu-3") == 0 and value(fams, "mtgpu_member_up", node="gpu-2") == 1
    assert value(fams, "mtgpu_member_drained", node="gpu-2") == 1
    assert value(fams, "mtgpu_member_role", node="gpu-1", role="scheduler") == 1
    assert value(fams, "mtgpu_member_role", node="gpu-1", role="voter") == 0
    assert value(fams, "mtgpu_jobs", state="running") == 2 and value(fams, "mtgpu_jobs", state="lost") == 0
    assert value(fams, "mtgpu_workspaces", state="stopped") == 1
    assert ("mtgpu_jobs", (("state", "stopped"),)) not in samples(fams)  # stopped is a workspace's state
    assert value(fams, "mtgpu_raft_commit_index") == 120 and value(fams, "mtgpu_raft_term") == 7
    assert value(fams, "mtgpu_raft_leader") == 1 and value(fams, "mtgpu_raft_voters") == 3
    assert value(fams, "mtgpu_scheduler_placements_total") == 5
    assert value(fams, "mtgpu_directlink_sessions", path="direct") == 2
    assert value(fams, "mtgpu_directlink_sessions", path="relay") == 1
    assert value(fams, "mtgpu_directlink_relay_connected") == 1


def test_no_tenant_name_appears_unless_an_admin_opts_in():
    hidden = families(make_figures())
    assert not any("tenant" in s.labels for f in hidden for s in f.samples)
    assert not any(name in repr(k) for k in samples(hidden) for name in ("alice", "bob"))
    shown = families(make_figures(), tenant_labels=True)
    assert value(shown, "mtgpu_tenant_jobs", tenant="alice", kind="job", state="running") == 2
    assert value(shown, "mtgpu_tenant_gpus_allocated", tenant="alice") == 1.5


def make_job(job_id: int, state: JobState, tenant: str = "alice", workspace: bool = False, gpus: int = 0) -> Job:
    spec = JobSpec(script="true", workspace=WorkspaceSpec(name=f"ws{job_id}") if workspace else None)
    allocs = (NodeAllocation("gpu-1", tuple(GpuSlot(i) for i in range(gpus))),) if gpus else ()
    return Job(id=job_id, tenant=tenant, uid=200000, gid=200000, spec=spec, state=state, submitted_at=100.0,
               allocations=allocs)


def stand_in_service(jobs: list[Job]):
    """What read_figures reads of a standalone MemberService, and no more."""
    view = [{"name": "gpu-1", "role": "scheduler", "state": "up", "reported_at": 5.0,
             "gpus": [{"index": 0, "vendor": "nvidia", "model": "H200", "utilization_pct": 50.0,
                       "vram_used_bytes": 1, "vram_total_bytes": 2, "committed_vram_bytes": 2,
                       "committed_fraction": 1.0}]},
            {"name": "gpu-2", "role": "member", "state": "up", "reported_at": None, "gpus": []}]
    machine = SimpleNamespace(jobs={j.id: j for j in jobs}, applied=42)
    store = SimpleNamespace(lock=threading.RLock(), machine=machine, is_leader=lambda: True, term=lambda: 1)
    link = SimpleNamespace(is_cluster=False, quorum_problem=lambda: None)
    member = SimpleNamespace(link=link, is_scheduler=lambda: True,
                             scheduler=SimpleNamespace(placements=3, timings=SchedulerTimings()))
    return SimpleNamespace(member=member, store=store, node_name="gpu-1", nodes_view=lambda: view, directlink=None)


def test_read_figures_from_a_standalone_service():
    service = stand_in_service([make_job(1, JobState.RUNNING, gpus=2), make_job(2, JobState.QUEUED, tenant="bob"),
                                make_job(3, JobState.RUNNING, workspace=True, gpus=1)])
    f = read_figures(service)
    assert [g.index for g in f.gpus] == [0] and f.gpus[0].utilization_pct == 50.0
    assert [m.name for m in f.members] == ["gpu-1", "gpu-2"]
    assert f.jobs == Counter({("job", "running", ""): 1, ("job", "queued", ""): 1, ("workspace", "running", ""): 1})
    assert f.tenant_gpus == {}
    assert f.raft == RaftFigures(True, True, 1, 42, 42, 1)  # the journal: a log of one that commits what it applies
    assert f.directlink == DirectLinkFigures(False, 0, 0) and f.placements == 3
    shown = read_figures(service, tenant_labels=True)
    assert shown.tenant_gpus == {"alice": 3.0} and shown.jobs[("job", "queued", "bob")] == 1


def test_the_exposition_parses_and_holds_the_histograms():
    service = stand_in_service([make_job(1, JobState.RUNNING)])
    service.member.scheduler.timings.job_started(make_job(9, JobState.QUEUED), 112.0)
    text = exposition(member_registry(service)).decode()
    names = {f.name: f for f in text_string_to_metric_families(text)}
    assert names["mtgpu_job_queue_wait_seconds"].type == "histogram"
    assert names["mtgpu_scheduling_pass_seconds"].type == "histogram"
    assert 'mtgpu_job_queue_wait_seconds_sum{kind="job"} 12.0' in text
    assert 'mtgpu_job_queue_wait_seconds_count{kind="workspace"} 0.0' in text  # every series from the start
    assert "alice" not in text


def test_queue_wait_counts_from_the_last_requeue_and_submit_to_start_from_submission():
    timings = SchedulerTimings()
    job = make_job(1, JobState.QUEUED)
    job.history = [{"attempt": 0, "started_at": 110.0, "ended_at": 150.0, "outcome": "requeued"}]
    timings.job_started(job, 160.0)
    assert timings.queue_wait.labels("job")._sum.get() == 10.0
    assert timings.submit_to_start.labels("job")._sum.get() == 60.0
    timings.job_started(make_job(2, JobState.QUEUED), 90.0)  # the clock stepped back: no negative wait
    assert timings.queue_wait.labels("job")._sum.get() == 10.0


# ---------------------------------------------------------------- who may scrape


def metrics_settings(**section):
    return config_from_dict({"METRICS": section}).METRICS


def test_scrapes_are_refused_when_off_through_a_proxy_or_from_an_address_not_allowed():
    off = scrape_refusal(metrics_settings(), "127.0.0.1", {})
    assert off[0] == 404 and "[METRICS] enabled = true" in off[1]
    on = metrics_settings(enabled=True, allow=["10.0.0.0/24", "::1"])
    assert scrape_refusal(on, "10.0.0.9", {}) is None
    assert scrape_refusal(on, "::ffff:10.0.0.9", {}) is None  # IPv4 through a dual-stack socket
    assert scrape_refusal(on, "::1", {}) is None
    far = scrape_refusal(on, "10.0.1.9", {})
    assert far[0] == 403 and "10.0.1.9" in far[1] and "[METRICS] allow" in far[1]
    assert scrape_refusal(on, "testclient", {})[0] == 403
    assert scrape_refusal(on, "10.0.0.9", {"x-forwarded-for": "10.0.0.9"})[0] == 403


def only_problem(d: dict) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(d)
    assert len(info.value.problems) == 1, info.value.problems
    return info.value.problems[0]


def test_metrics_section_defaults_off_loopback_only_no_tenant_labels():
    m = config_from_dict({}).METRICS
    assert m.enabled is False and m.allow == ["127.0.0.1", "::1"] and m.tenant_labels is False


@pytest.mark.parametrize("section, fragment", [
    ({"allow": ["10.0.0.1/8"]}, 'METRICS.allow[0] = "10.0.0.1/8": must be an address or a network'),
    ({"allow": ["scraper.lan"]}, "METRICS.allow[0]"),
    ({"allow": "10.0.0.1"}, "METRICS.allow"),
    ({"enabled": "yes"}, "METRICS.enabled"),
    ({"tenant_labels": 1}, "METRICS.tenant_labels"),
    ({"token": "x"}, "unknown key 'METRICS.token'"),
])
def test_bad_metrics_settings_name_the_key(section, fragment):
    problem = only_problem({"METRICS": section})
    assert fragment in problem, problem


def test_loopback_scrapers_are_refused_with_directlink_relays_because_tenants_arrive_from_loopback():
    cluster = {"CLUSTER_MODE": "cluster", "CLUSTER_ID": "lab", "DIRECTLINK": {"relays": ["relay.lan:7443"]}}
    problem = only_problem({**cluster, "METRICS": {"enabled": True}})
    assert problem.startswith("METRICS: allow names 127.0.0.1, ::1 (loopback)") and "DirectLink" in problem, problem
    assert "0.0.0.0/0" in only_problem({**cluster, "METRICS": {"enabled": True, "allow": ["0.0.0.0/0"]}})
    ok = config_from_dict({**cluster, "METRICS": {"enabled": True, "allow": ["10.0.0.5"]}})
    assert ok.METRICS.allows("10.0.0.5") and not ok.METRICS.allows("127.0.0.1")
    assert config_from_dict({**cluster, "METRICS": {"enabled": False}}).METRICS.enabled is False

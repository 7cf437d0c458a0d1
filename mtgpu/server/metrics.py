"""`GET /metrics`: this member's figures in the Prometheus text format (docs/METRICS.md).

Gauges are read at scrape time from what the member already keeps (its telemetry,
its copy of the replicated state, its Raft or journal store, its DirectLink side) by
a custom collector, so no other module updates a gauge. In two steps: `read_figures`
takes one consistent reading from the member's service, `families` turns a reading
into metric families without touching anything. The histograms are observed by the
scheduler role where a job's start is committed (`SchedulerTimings`): the state
machine, which records the start, reads no clock and does no I/O.

Cluster-wide series (jobs, workspaces, members) come from the replicated state and
are the same on every member; GPU series are this member's own GPUs only, so scraping
every member gives each GPU once. No tenant or job name is a label unless
`[METRICS] tenant_labels = true`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from ..model.job import Job, JobState

# From a quick job on an idle node to a day's wait behind a busy queue.
WAIT_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)
# A pass over a short queue takes a millisecond; over 10,000 jobs, around a second.
PASS_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
KINDS = ("job", "workspace")
ROLES = ("scheduler", "voter", "member")
JOB_STATES = tuple(s.value for s in JobState if s is not JobState.STOPPED)  # stopped: workspaces only
WORKSPACE_STATES = tuple(s.value for s in JobState)


def kind_of(job: Job) -> str:
    return "workspace" if job.spec.workspace is not None else "job"


class SchedulerTimings:
    """The histograms the scheduler role observes: how long a job waited in the queue
    (this attempt: since its submission or its last requeue), from submission to start
    (over every attempt), and how long a scheduling pass took. Not registered globally:
    the node's collector reads them at scrape time."""

    def __init__(self) -> None:
        self.queue_wait = Histogram(
            "mtgpu_job_queue_wait_seconds", "Time a job or workspace waited in the queue before this start "
            "(since its submission or its last requeue)", ["kind"], buckets=WAIT_BUCKETS_S, registry=None)
        self.submit_to_start = Histogram(
            "mtgpu_job_submit_to_start_seconds", "Time from a job's or workspace's submission to this start, "
            "over every attempt", ["kind"], buckets=WAIT_BUCKETS_S, registry=None)
        self.scheduling_pass = Histogram(
            "mtgpu_scheduling_pass_seconds", "Time one scheduling pass took on this member (health of members, "
            "placement and committing the placements)", buckets=PASS_BUCKETS_S, registry=None)
        for kind in KINDS:  # every series exists from the start, at zero
            self.queue_wait.labels(kind)
            self.submit_to_start.labels(kind)

    def job_started(self, job: Job, at: float) -> None:
        """`job` started at `at` (its submission and its history of attempts say since when it waited)."""
        queued_since = job.history[-1].get("ended_at") if job.history else None
        queued_since = job.submitted_at if queued_since is None else queued_since
        kind = kind_of(job)
        self.queue_wait.labels(kind).observe(max(0.0, at - queued_since))  # a clock step back is no wait
        self.submit_to_start.labels(kind).observe(max(0.0, at - job.submitted_at))

    def pass_done(self, seconds: float) -> None:
        self.scheduling_pass.observe(max(0.0, seconds))

    def collect(self) -> Iterator[Metric]:
        for histogram in (self.queue_wait, self.submit_to_start, self.scheduling_pass):
            yield from histogram.collect()


@dataclass(frozen=True)
class GpuFigures:
    index: int
    vendor: str
    model: str
    utilization_pct: float | None
    vram_used_bytes: int | None
    vram_total_bytes: int
    vram_reserved_bytes: int
    committed_fraction: float


@dataclass(frozen=True)
class MemberFigures:
    name: str
    role: str  # scheduler, voter or member
    state: str  # up, drained or down


@dataclass(frozen=True)
class RaftFigures:
    """The replicated log as this member sees it; a standalone node's journal is a log of
    one member that is always its leader and commits what it appends."""

    is_leader: bool
    is_voter: bool
    term: int
    commit_index: int
    applied_index: int
    voters: int


@dataclass(frozen=True)
class DirectLinkFigures:
    relay_connected: bool
    sessions_direct: int
    sessions_relayed: int


@dataclass(frozen=True)
class Figures:
    """One reading of a member, in plain values (a test builds one by hand)."""

    node: str
    gpus: list[GpuFigures] = field(default_factory=list)
    members: list[MemberFigures] = field(default_factory=list)
    # (kind, state, tenant) -> count; tenant "" unless tenant labels are on
    jobs: Counter = field(default_factory=Counter)
    # tenant -> GPUs its running jobs and workspaces hold (fractions add up); only with tenant labels
    tenant_gpus: dict[str, float] = field(default_factory=dict)
    raft: RaftFigures = RaftFigures(True, True, 0, 0, 0, 1)
    directlink: DirectLinkFigures = DirectLinkFigures(False, 0, 0)
    is_scheduler: bool = False
    in_quorum: bool = True
    placements: int = 0


def read_figures(service, tenant_labels: bool = False) -> Figures:
    """Read a member's figures from its service (server/api/service.MemberService):
    its view of the members, its jobs, its store and its DirectLink side."""
    member, store = service.member, service.store
    view = service.nodes_view()
    mine = next((n for n in view if n["name"] == service.node_name), None)
    gpus = [GpuFigures(g["index"], g["vendor"], g["model"], g["utilization_pct"] if mine.get("reported_at") else None,
                       g["vram_used_bytes"] if mine.get("reported_at") else None, g["vram_total_bytes"],
                       g["committed_vram_bytes"], g["committed_fraction"]) for g in (mine or {}).get("gpus", ())]
    members = [MemberFigures(n["name"], n["role"], n["state"]) for n in view]
    jobs: Counter = Counter()
    tenant_gpus: dict[str, float] = {}
    with store.lock:
        machine = store.machine
        for job in machine.jobs.values():
            jobs[(kind_of(job), job.state.value, job.tenant if tenant_labels else "")] += 1
            if tenant_labels and job.state is JobState.RUNNING:
                held = sum(g.fraction for a in job.allocations for g in a.gpus)
                tenant_gpus[job.tenant] = tenant_gpus.get(job.tenant, 0.0) + held
        applied = machine.applied
    if member.link.is_cluster:  # a RaftState
        raft = RaftFigures(store.is_leader(), store.is_voter(), store.term(), store.commit_index(),
                           store.applied_index(), len(store.voters()))
    else:  # the journal: every command it applied is committed
        raft = RaftFigures(store.is_leader(), True, store.term(), applied, applied, 1)
    dl = service.directlink.summary() if service.directlink is not None else None
    directlink = DirectLinkFigures(bool(dl["relay"]), dl["sessions_direct"], dl["sessions_relayed"]) if dl \
        else DirectLinkFigures(False, 0, 0)
    return Figures(node=service.node_name, gpus=gpus, members=members, jobs=jobs, tenant_gpus=tenant_gpus,
                   raft=raft, directlink=directlink, is_scheduler=member.is_scheduler(),
                   in_quorum=member.link.quorum_problem() is None, placements=member.scheduler.placements)


def _gauge(name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _single(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=float(value))


def families(f: Figures, tenant_labels: bool = False) -> list[Metric]:
    """The metric families of one reading. Names follow the Prometheus conventions:
    `mtgpu_` prefix, base units (`_bytes`, `_seconds`, `_ratio` for 0..1), `_total` on counters."""
    node = f.node
    info = _gauge("mtgpu_gpu_info", "A GPU of this member: its vendor and model (always 1)",
                  ["node", "gpu", "vendor", "model"])
    util = _gauge("mtgpu_gpu_utilization_ratio", "GPU compute utilization as last measured, 0 to 1", ["node", "gpu"])
    used = _gauge("mtgpu_gpu_memory_used_bytes", "GPU memory in use as last measured", ["node", "gpu"])
    total = _gauge("mtgpu_gpu_memory_total_bytes", "GPU memory the GPU has", ["node", "gpu"])
    reserved = _gauge("mtgpu_gpu_memory_reserved_bytes", "GPU memory reserved by the allocations of running jobs "
                      "and workspaces", ["node", "gpu"])
    committed = _gauge("mtgpu_gpu_committed_ratio", "Share of the GPU allocated to running jobs and workspaces, "
                       "0 to 1 (an exclusive allocation is 1)", ["node", "gpu"])
    for g in f.gpus:
        gpu = str(g.index)
        info.add_metric([node, gpu, g.vendor, g.model], 1)
        if g.utilization_pct is not None:
            util.add_metric([node, gpu], g.utilization_pct / 100.0)
        if g.vram_used_bytes is not None:
            used.add_metric([node, gpu], g.vram_used_bytes)
        total.add_metric([node, gpu], g.vram_total_bytes)
        reserved.add_metric([node, gpu], g.vram_reserved_bytes)
        committed.add_metric([node, gpu], g.committed_fraction)

    up = _gauge("mtgpu_member_up", "1 unless the member is marked down (it stopped reporting)", ["node"])
    drained = _gauge("mtgpu_member_drained", "1 when an admin drained the member (no new placements)", ["node"])
    role = _gauge("mtgpu_member_role", "1 for the member's role (scheduler, voter or member), 0 for the others",
                  ["node", "role"])
    for m in f.members:
        up.add_metric([m.name], 0 if m.state == "down" else 1)
        drained.add_metric([m.name], 1 if m.state == "drained" else 0)
        for r in ROLES:
            role.add_metric([m.name, r], 1 if m.role == r else 0)

    jobs = _gauge("mtgpu_jobs", "Batch jobs by state (the cluster's, as this member's copy of the state has them)",
                  ["state"])
    workspaces = _gauge("mtgpu_workspaces", "Workspaces by state (the cluster's)", ["state"])
    counts: Counter = Counter()
    for (kind, state, _tenant), n in f.jobs.items():
        counts[(kind, state)] += n
    for state in JOB_STATES:
        jobs.add_metric([state], counts[("job", state)])
    for state in WORKSPACE_STATES:
        workspaces.add_metric([state], counts[("workspace", state)])
    out = [info, util, used, total, reserved, committed, up, drained, role, jobs, workspaces]

    if tenant_labels:
        by_tenant = _gauge("mtgpu_tenant_jobs", "Jobs and workspaces of each tenant by kind and state "
                           "([METRICS] tenant_labels = true)", ["tenant", "kind", "state"])
        for (kind, state, tenant), n in sorted(f.jobs.items()):
            by_tenant.add_metric([tenant, kind, state], n)
        held = _gauge("mtgpu_tenant_gpus_allocated", "GPUs the tenant's running jobs and workspaces hold (shares "
                      "of a GPU add up) ([METRICS] tenant_labels = true)", ["tenant"])
        for tenant, n in sorted(f.tenant_gpus.items()):
            held.add_metric([tenant], n)
        out += [by_tenant, held]

    r = f.raft
    out += [
        _single("mtgpu_raft_leader", "1 when this member leads the replicated log (a standalone node always does)",
                r.is_leader),
        _single("mtgpu_raft_voter", "1 when this member votes in Raft elections", r.is_voter),
        _single("mtgpu_raft_term", "The Raft term this member is in", r.term),
        _single("mtgpu_raft_commit_index", "Index of the last log entry known to be committed", r.commit_index),
        _single("mtgpu_raft_applied_index", "Index of the last log entry this member applied to its state",
                r.applied_index),
        _single("mtgpu_raft_voters", "Voting members this member knows of, itself included", r.voters),
        _single("mtgpu_scheduler_active", "1 when this member is the scheduler", f.is_scheduler),
        _single("mtgpu_quorum_ok", "1 when this member hears a quorum of the cluster (a standalone node always "
                "does)", f.in_quorum),
    ]
    placements = CounterMetricFamily("mtgpu_scheduler_placements", "Jobs and workspaces this member placed while "
                                     "it was the scheduler, since it started")
    placements.add_metric([], f.placements)
    sessions = _gauge("mtgpu_directlink_sessions", "Open DirectLink sessions of this member by path: direct "
                      "(through NAT, peer to peer) or relay", ["path"])
    sessions.add_metric(["direct"], f.directlink.sessions_direct)
    sessions.add_metric(["relay"], f.directlink.sessions_relayed)
    relay = _gauge("mtgpu_directlink_relay_connected", "1 while this member is connected to a DirectLink relay")
    relay.add_metric([], float(f.directlink.relay_connected))
    return out + [placements, sessions, relay]


class MemberCollector(Collector):
    """Collects one member's figures at scrape time, and its scheduler's histograms."""

    def __init__(self, service, tenant_labels: bool = False) -> None:
        self.service = service
        self.tenant_labels = tenant_labels

    def collect(self) -> Iterator[Metric]:
        yield from families(read_figures(self.service, self.tenant_labels), self.tenant_labels)
        yield from self.service.member.scheduler.timings.collect()


def member_registry(service, tenant_labels: bool = False) -> CollectorRegistry:
    """A registry of its own for one member (not the process-wide default, which also
    holds the Python process collectors and would mix members run in one process)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MemberCollector(service, tenant_labels))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


# The text format every Prometheus reads (2.x included); our names need none of 1.0.0's escaping.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PROXY_HEADERS = ("forwarded", "x-forwarded-for")


def scrape_refusal(settings, host: str | None, headers) -> tuple[int, str] | None:
    """Why a scrape from `host` is refused, as (HTTP status, message), or None to serve it.
    `settings` is the config's [METRICS]. A request that names a forwarded address is
    refused: uvicorn puts that address in place of a loopback peer's, and a DirectLink
    tenant's session reaches LISTEN from loopback."""
    if not settings.enabled:
        return 404, ("metrics are off on this node: an admin sets [METRICS] enabled = true (and the scrapers' "
                     "addresses in [METRICS] allow) in the config and restarts mtgpu-server")
    if any(h in headers for h in PROXY_HEADERS):
        return 403, "refused: /metrics is not served through a proxy (the request carries a forwarded address)"
    if not settings.allows(host):
        return 403, (f"refused: {host or 'an unknown address'} may not scrape /metrics here; an admin adds it "
                     f"to [METRICS] allow (now {', '.join(settings.allow) or 'empty'})")
    return None

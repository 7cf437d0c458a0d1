"""Issue 9: the four copies of the fit rule agree, on random node states and requests.

The rule of docs/SCHEDULING.md ("Fit rules") is written four times: `NodeState`
(sched/nodefit.py, the reference), `Fleet` (sched/fleet.py, its numpy mirror), the
state machine's re-check of a placement (`_check_fits`, state/machine.py) and the
"can never fit" verdict (sched/satisfiable.py). A disagreement books a GPU twice or
refuses a feasible job, so these properties tie them:

1. Mirror. For every node and rank request, the `Fleet.gpu_ok` row equals, GPU by GPU,
   `GpuState.matches and GpuState.admits` (False in the padding of smaller nodes), and
   `Fleet.host_ok` equals `schedulable and NodeState.host_fits`; still so after each
   placement of a pass (`Scheduler.place`: `NodeState.take`, then `Fleet.refresh`).
2. Commit. The state machine sees commitments only; nodefit sees them and telemetry
   (usable = min(capacity - commitments, measured free)), so:
   a. whatever `NodeState.fit` gives, `job.start.v1` accepts against the same
      commitments, whatever telemetry says (else a placement is refused every pass);
   b. when telemetry measures nothing (no GPU memory used, no host memory reported),
      the state machine accepts some allocation of the request iff `NodeState.fit`
      finds one, and for a one-GPU request, GPU by GPU: it accepts the slot on GPU g
      iff the node is schedulable, `host_fits` and g `admits` the request. "An
      allocation of the request": `gpu_count` distinct GPUs that match its vendor/model,
      with the slots nodefit makes for it (`GpuState.slot`), and its cpus/mem. The state
      machine checks capacity, not the request's kind, so the GPUs are also held to what
      the hardware must have: for exclusive and oversubscribe, total VRAM >= `vram=` (a
      shared slot carries its `vram=` and is checked). With outside load measured, the
      state machine is rightly more permissive, so only (a) holds then.
3. Never. For every node (drained or down included) and rank request:
   `never_reason(node, req) is None` == `Fleet.able(req)[node]` ==
   `NodeState.fit(req)` succeeds on the node emptied (same hardware, nothing committed,
   nothing measured, schedulable). And `Scheduler.never_fits(spec)` ==
   `check_satisfiable(spec, snapshot)`, gangs and `server=` included.
4. Engine. On a one-node snapshot, `Scheduler.place(spec)` returns an allocation iff
   `NodeState.fit` does for some alternative (the reference taking what the engine
   placed, job after job), and the state machine accepts every such allocation.
5. Safety net. Whatever well-formed plan it is handed (slots with a share in [0, 1]
   and VRAM in [0, total], the same GPU twice included), the state machine never
   commits more than a node has: a GPU held exclusively holds nothing else, shares
   sum to at most 1, guaranteed VRAM to at most the total, CPUs and memory likewise.

Node states are built through the state machine (random placements by nodefit, raw
plans it accepts, jobs ending), so commitments are real; telemetry is random on top.
Each state is checked against the drawn requests and a fixed CATALOGUE of requests (every
mode, whole and fractional, with and without vram=). Runs derandomized, with no example
database, so CI sees the same examples every time.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtgpu.model.cluster import GpuView, NodeView
from mtgpu.model.gpu import VENDORS, GpuInfo, HostInfo
from mtgpu.model.job import GpuAlternative, GpuMode, GpuSlot, JobSpec, NodeAllocation
from mtgpu.sched import Scheduler, check_satisfiable, rank_requests
from mtgpu.sched.fleet import Fleet
from mtgpu.sched.nodefit import NodeState
from mtgpu.sched.request import EPS, RankRequest
from mtgpu.sched.satisfiable import never_reason
from mtgpu.server.member.view import NodeTelemetry, build_snapshot
from mtgpu.state import commands as C
from mtgpu.state.machine import CommandRejected, StateMachine

from builders import G

PROPERTY = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# (vendor, model as the backend reports it, total VRAM); one odd size so f * total truncates.
KINDS = (
    ("nvidia", "NVIDIA GeForce RTX 4090", 24 * G),
    ("nvidia", "A100-SXM4-80GB", 80 * G),
    ("nvidia", "NVIDIA A10", 24 * G),
    ("nvidia", "Tesla T4", 10 * G + 7),
    ("amd", "AMD Instinct MI300X", 192 * G),
    ("intel", "Intel Data Center GPU Max 1550", 128 * G),
)
ASKED_KINDS = (None, "nvidia", "amd", "intel", "rtx4090", "a100", "a10", "t4", "mi300x", "h200")
FRACTIONS = (0.01, 0.25, 0.3, 0.5, 0.75, 0.99)
VRAMS = (1 * G, 8 * G, 12 * G, 16 * G, 20 * G, 24 * G, 80 * G, 256 * G)


# ---- what a test draws: plain data, so a failing example prints readably ----------------

@dataclass(frozen=True)
class RawPlan:
    """A plan made by hand (not by nodefit): one slot per (GPU position, mode, share, VRAM),
    the position taken modulo the node's GPU count, VRAM as "0", "f" (share x total),
    "12G" or "total" (at most the total)."""

    slots: tuple[tuple[int, GpuMode, float, str], ...]
    cpus: float = 0.0
    mem_bytes: int = 0

    def allocation(self, node: str, gpus: tuple[tuple[str, str, int], ...]) -> NodeAllocation:
        out = []
        for pos, mode, frac, vram in self.slots if gpus else ():
            i = pos % len(gpus)
            total = gpus[i][2]
            if mode is GpuMode.EXCLUSIVE:
                out.append(GpuSlot(i, 1.0, total, mode))
            elif mode is GpuMode.OVERSUBSCRIBE:
                out.append(GpuSlot(i, 0.0, 0, mode))
            else:
                v = {"0": 0, "f": int(frac * total), "12G": 12 * G, "total": total}[vram]
                out.append(GpuSlot(i, frac, min(v, total), mode))
        vendor = gpus[out[0].index][0] if out else None
        return NodeAllocation(node, tuple(out), self.cpus, self.mem_bytes, vendor)


@dataclass(frozen=True)
class Finish:
    """The `pick`-th running job (modulo how many run) ends."""

    pick: int


@dataclass(frozen=True)
class NodeSetup:
    gpus: tuple[tuple[str, str, int], ...]
    cpus: float
    mem_bytes: int
    history: tuple  # JobSpec (placed where nodefit fits it), RawPlan or Finish, in order
    unavailable: str = ""  # "", "drain" or "down", applied after the history
    used: tuple[int, ...] | None = None  # measured VRAM used per GPU; None: nothing reported
    util: tuple[float, ...] = ()
    mem_available: int | None = None


def _alternative(kind: str | None, count: float) -> GpuAlternative:
    """`gpus=KIND:COUNT`, KIND a vendor, a model or None (any GPU)."""
    return GpuAlternative(count, kind, None) if kind in VENDORS else GpuAlternative(count, None, kind)


def _spec(kind: str | None, count: float, mode: GpuMode, vram: int | None = None, cpus: float | None = None,
          mem: int | None = None) -> JobSpec:
    alts = (_alternative(kind, count),) if count else ()
    return JobSpec(gpus=alts, vram_bytes=vram if alts else None, cpus=cpus, mem_bytes=mem, gpu_mode=mode)


# What came before the state under test, one draw per step: requests placed by nodefit,
# hand-made plans (which the state machine alone judges) and jobs ending.
HISTORY_STEPS = (
    tuple(_spec(kind, count, mode, vram, cpus, mem)
          for kind in (None, "nvidia", "rtx4090", "a100", "t4")
          for count in (0, 1.0, 2.0, 0.25, 0.5, 0.75)
          for mode in GpuMode if not (count < 1 and count and mode is GpuMode.EXCLUSIVE)
          for vram, cpus, mem in ((None, None, None), (1 * G, 1.0, None), (12 * G, None, 16 * G)))
    + tuple(RawPlan(((pos, mode, frac, vram),), cpus, mem)
            for pos in (0, 1) for mode in GpuMode for frac in (0.0, 0.25, 0.75, 1.0)
            for vram in ("0", "f", "12G", "total") for cpus, mem in ((0.0, 0), (1.0, 1 * G))
            if mode is GpuMode.SHARED or (frac, vram) == (1.0, "total"))
    + tuple(RawPlan(((0, m0, 0.5, "f"), (1, m1, 0.5, "f")), 0.5, 0) for m0 in GpuMode for m1 in GpuMode)
    + tuple(Finish(k) for k in range(4)) * 8
)


ALTERNATIVES = st.sampled_from(tuple(_alternative(kind, count) for kind in ASKED_KINDS
                                     for count in (1.0, 1.0, 2.0, 3.0, 5.0) + FRACTIONS))
N_ALTERNATIVES = st.sampled_from((0, 1, 1, 1, 2, 3))
MODES = {True: st.sampled_from((GpuMode.SHARED, GpuMode.OVERSUBSCRIBE)), False: st.sampled_from(tuple(GpuMode))}
REQUEST_SIZES = st.tuples(st.sampled_from((None,) * 4 + VRAMS),  # vram=
                          st.sampled_from((None, 0.5, 1.0, 2.0, 4.0, 8.0, 32.0, 64.0)),  # cpus=
                          st.sampled_from((None, 1 * G, 16 * G, 64 * G, 512 * G)))  # mem=
GANG_SIZES = st.sampled_from((1, 1, 2, 3))


@st.composite
def job_specs(draw, gangs: bool = False, servers: tuple[str, ...] = ()) -> JobSpec:
    """A request the job-file parser accepts: CPU-only, whole or fractional GPUs, modes,
    vram=, cpus=, mem=, `|`-alternatives of vendors and models."""
    alts = tuple(draw(ALTERNATIVES) for _ in range(draw(N_ALTERNATIVES)))
    mode = draw(MODES[any(a.fractional for a in alts)])
    vram, cpus, mem = draw(REQUEST_SIZES)
    nodes = draw(GANG_SIZES) if gangs else 1
    server = draw(st.sampled_from((None, None) + servers + ("nowhere",))) if servers else None
    return JobSpec(gpus=alts, vram_bytes=vram if alts else None, cpus=cpus, mem_bytes=mem, gpu_mode=mode,
                   nodes=nodes, server=server)


# Checked on every drawn node state besides the drawn requests: each kind of request on
# each mode, with and without vram=, so a state is never wasted on one request.
CATALOGUE = tuple(dict.fromkeys(
    r for kind in (None, "nvidia", "a100", "t4") for count in (1.0, 2.0, 0.25, 0.75) for mode in GpuMode
    if not (count < 1 and mode is GpuMode.EXCLUSIVE)
    for vram in (None, 12 * G, 24 * G)
    for r in rank_requests(_spec(kind, count, mode, vram))))

GPU_KINDS = st.lists(st.sampled_from(KINDS), max_size=4)
NODE_SIZES = st.tuples(st.sampled_from((1.0, 4.0, 8.0, 32.0)), st.sampled_from((8 * G, 64 * G, 256 * G)),
                       st.sampled_from(("", "", "", "drain", "down")))
HISTORY = st.lists(st.sampled_from(HISTORY_STEPS), max_size=6)
USED = st.sampled_from(("0", "0", "half", "all", "1G"))
UTIL = st.sampled_from((0.0, 50.0, 100.0))
MEM_AVAILABLE = st.sampled_from((None, "0", "half", "all"))
_LEVEL = {"0": lambda t: 0, "half": lambda t: t // 2, "all": lambda t: t, "1G": lambda t: min(t, 1 * G)}


@st.composite
def node_setups(draw, telemetry: bool = True) -> NodeSetup:
    gpus = tuple(draw(GPU_KINDS))
    cpus, mem, unavailable = draw(NODE_SIZES)
    history = tuple(draw(HISTORY))
    used = util = None
    mem_available = None
    if telemetry and draw(st.booleans()):
        used = tuple(_LEVEL[draw(USED)](t) for _, _, t in gpus)
        util = tuple(draw(UTIL) for _ in gpus)
        level = draw(MEM_AVAILABLE)
        mem_available = None if level is None else _LEVEL[level](mem)
    return NodeSetup(gpus, cpus, mem, history, unavailable, used, util or (), mem_available)


# ---- building real states through the state machine ---------------------------------------

def new_machine() -> StateMachine:
    sm = StateMachine()
    assert sm.apply(C.command(C.TENANT_ENSURE, name="alice", uid=2001, gid=2001, at=0.0))["ok"]
    return sm


def submit(sm: StateMachine, spec: JobSpec) -> int:
    r = sm.apply(C.command(C.JOB_SUBMIT, tenant="alice", uid=2001, gid=2001, spec=spec.to_dict(), at=1.0))
    assert r["ok"], r
    return r["job_id"]


def start(sm: StateMachine, job_id: int, allocs: tuple[NodeAllocation, ...]) -> dict:
    return sm.apply(C.command(C.JOB_START, job_id=job_id, allocations=[a.to_dict() for a in allocs], at=2.0))


def accepts(sm: StateMachine, alloc: NodeAllocation) -> bool:
    """Would `job.start.v1` take this allocation? It runs `_check_fits` on each allocation
    of a plan before it commits any; asked directly, it changes nothing."""
    try:
        sm._check_fits(0, alloc)
    except CommandRejected:
        return False
    return True


def first_fit(state: NodeState, spec: JobSpec) -> NodeAllocation | None:
    for req in rank_requests(spec):
        a = state.fit(req)
        if a is not None:
            return a
    return None


def build(setups: list[NodeSetup]) -> tuple[StateMachine, dict[str, NodeTelemetry]]:
    """Register the nodes, play each one's history through the state machine, then
    mark drained/down nodes; returns the machine and the telemetry to view it with."""
    sm = new_machine()
    telemetry: dict[str, NodeTelemetry] = {}
    for i, s in enumerate(setups):
        name = f"n{i}"
        gpus = [{"index": j, "vendor": v, "model": m, "vram_total_bytes": t} for j, (v, m, t) in enumerate(s.gpus)]
        assert sm.apply(C.command(C.NODE_REGISTER, name=name, gpus=gpus, cpus=s.cpus,
                                  mem_total_bytes=s.mem_bytes, at=0.0))["ok"]
        for op in s.history:
            if isinstance(op, Finish):
                mine = [j for j in sm.running_jobs() if j.allocations[0].node == name]
                if mine:
                    job = mine[op.pick % len(mine)]
                    assert sm.apply(C.command(C.JOB_FINISH, job_id=job.id, exit_code=0, at=3.0))["ok"]
                continue
            if isinstance(op, RawPlan):
                jid, alloc = submit(sm, JobSpec()), op.allocation(name, s.gpus)
            else:
                jid = submit(sm, op)
                alloc = first_fit(NodeState(view_of(sm, {}, name)), op)
            if alloc is None or not start(sm, jid, (alloc,))["ok"]:
                assert sm.apply(C.command(C.JOB_CANCEL, job_id=jid, at=3.0))["ok"]
        if s.unavailable == "drain":
            sm.apply(C.command(C.NODE_DRAIN, name=name, reason="drained for the test", at=4.0))
        elif s.unavailable == "down":
            sm.apply(C.command(C.NODE_DOWN, name=name, reason="stopped reporting", at=4.0))
        if s.used is not None:
            host = None if s.mem_available is None else HostInfo(int(s.cpus), 0.0, s.mem_bytes, s.mem_available)
            telemetry[name] = NodeTelemetry(
                gpus=[GpuInfo(j, v, m, t, s.used[j], s.util[j]) for j, (v, m, t) in enumerate(s.gpus)], host=host)
    return sm, telemetry


def view_of(sm: StateMachine, telemetry: dict[str, NodeTelemetry], name: str) -> NodeView:
    return next(n for n in build_snapshot(sm, telemetry).nodes if n.name == name)


def emptied(node: NodeView) -> NodeView:
    """The same hardware with nothing committed, nothing measured, schedulable."""
    return NodeView(node.name, [GpuView(g.index, g.vendor, g.model, g.vram_total_bytes) for g in node.gpus],
                    node.cpus_total, node.mem_total_bytes)


def allocations_of(state: NodeState, req: RankRequest) -> list[NodeAllocation]:
    """Every allocation of one rank of `req` on this node (property 2b's meaning)."""
    static = [g for g in state.gpus if g.matches(req)
              and (req.vram_bytes is None or req.mode is GpuMode.SHARED or g.total >= req.vram_bytes)]
    out = []
    for combo in itertools.combinations(static, req.gpu_count):
        vendor = combo[0].vendor if combo else None
        out.append(NodeAllocation(state.name, tuple(g.slot(req) for g in combo), req.cpus, req.mem_bytes, vendor))
    return out


def assert_fleet_mirrors_nodefit(fleet: Fleet, req: RankRequest) -> None:
    rows = slice(0, fleet.n)
    gpu_ok, host_ok = fleet.gpu_ok(req, rows), fleet.host_ok(req, rows)
    for i, s in enumerate(fleet.states):
        want = [g.matches(req) and g.admits(req) for g in s.gpus] + [False] * (fleet.width - len(s.gpus))
        assert gpu_ok[i].tolist() == want, (s.name, req)
        assert bool(host_ok[i]) == (s.schedulable and s.host_fits(req)), (s.name, req)


# ---- the properties -----------------------------------------------------------------------

@PROPERTY
@given(setups=st.lists(node_setups(), min_size=1, max_size=3), specs=st.lists(job_specs(), min_size=1, max_size=4))
def test_fleet_arrays_admit_exactly_what_nodefit_admits(setups, specs):
    sm, telemetry = build(setups)
    sched = Scheduler(build_snapshot(sm, telemetry))
    drawn = [r for spec in specs for r in rank_requests(spec)]
    for job_id, spec in enumerate(specs):
        for req in drawn:
            assert_fleet_mirrors_nodefit(sched.fleet, req)
        sched.place(spec, job_id)
    for req in CATALOGUE + tuple(drawn):
        assert_fleet_mirrors_nodefit(sched.fleet, req)


@PROPERTY
@given(setup=node_setups(), specs=st.lists(job_specs(), min_size=1, max_size=4))
def test_state_machine_accepts_every_allocation_nodefit_makes(setup, specs):
    sm, telemetry = build([setup])
    state = NodeState(view_of(sm, telemetry, "n0"))
    for req in CATALOGUE:
        alloc = state.fit(req)
        assert alloc is None or accepts(sm, alloc), (req, alloc)
    for spec in specs:  # placed one after the other, each on the commitments the last one left
        jid = submit(sm, spec)
        alloc = first_fit(NodeState(view_of(sm, telemetry, "n0")), spec)
        if alloc is not None:
            r = start(sm, jid, (alloc,))
            assert r["ok"], (alloc, r)


@PROPERTY
@given(setup=node_setups(telemetry=False), specs=st.lists(job_specs(), max_size=3))
def test_nodefit_fits_exactly_what_the_state_machine_accepts_when_nothing_is_measured(setup, specs):
    sm, _ = build([setup])
    state = NodeState(view_of(sm, {}, "n0"))
    for req in CATALOGUE + tuple(r for spec in specs for r in rank_requests(spec)):
        allocs = allocations_of(state, req)
        accepted = [a for a in allocs if accepts(sm, a)]
        assert (state.fit(req) is not None) == bool(accepted), (req, accepted[:1])
        if req.gpu_count == 1:  # the same GPU by GPU, where one node has several
            host = state.schedulable and state.host_fits(req)
            for a in allocs:
                g = next(g for g in state.gpus if g.index == a.gpus[0].index)
                assert (host and g.admits(req)) == (a in accepted), (req, a)


@PROPERTY
@given(setups=st.lists(node_setups(), min_size=1, max_size=3), data=st.data())
def test_never_fits_exactly_when_the_node_emptied_cannot_fit(setups, data):
    sm, telemetry = build(setups)
    snap = build_snapshot(sm, telemetry)
    specs = data.draw(st.lists(job_specs(gangs=True, servers=tuple(n.name for n in snap.nodes)), max_size=3),
                      label="specs")
    fleet = Fleet(snap)
    empty = [NodeState(emptied(n)) for n in snap.nodes]
    for req in CATALOGUE + tuple(r for spec in specs for r in rank_requests(spec)):
        able = fleet.able(req)
        for row, node in enumerate(snap.nodes):
            never = never_reason(node, req)
            fits_empty = empty[row].fit(req) is not None
            assert (never is None) == bool(able[row]) == fits_empty, (node.name, req, never)
    sched = Scheduler(snap)
    for spec in specs:
        assert sched.never_fits(spec) == check_satisfiable(spec, snap), spec


@PROPERTY
@given(setup=node_setups(), specs=st.lists(job_specs(), min_size=1, max_size=5))
def test_engine_places_a_job_exactly_when_nodefit_fits_it(setup, specs):
    sm, telemetry = build([setup])
    snap = build_snapshot(sm, telemetry)
    sched, ref = Scheduler(snap), NodeState(snap.nodes[0])
    for job_id, spec in enumerate(specs):
        expected = first_fit(ref, spec)
        got = sched.place(spec, job_id)
        assert (got is not None) == (expected is not None), (spec, expected, got)
        jid = submit(sm, spec)
        if got is not None:
            ref.take(got[0])
            r = start(sm, jid, got)
            assert r["ok"], (got, r)
            assert sched.never_fits(spec) is None
        assert sched.never_fits(spec) == check_satisfiable(spec, snap)


# Plans as a stale or faulty scheduler could send them: up to three slots, the same GPU twice included.
RAW_SLOTS = tuple((pos, mode, frac, vram) for pos in range(3) for mode in GpuMode for frac in (0.0, 0.25, 0.75, 1.0)
                  for vram in ("0", "f", "12G", "total") if mode is GpuMode.SHARED or (frac, vram) == (1.0, "total"))


RAW_PLANS = st.builds(lambda slots, cpus, mem: RawPlan(tuple(slots), cpus, mem),
                      st.lists(st.sampled_from(RAW_SLOTS), max_size=3),
                      st.sampled_from((0.0, 0.5, 1.0, 4.0)), st.sampled_from((0, 1 * G, 16 * G)))
FINISHES = st.sampled_from(tuple(Finish(k) for k in range(4)))


@PROPERTY
@given(setup=node_setups(telemetry=False), plans=st.lists(st.one_of(RAW_PLANS, FINISHES), max_size=8))
def test_state_machine_never_overbooks_a_node_whatever_plan_it_is_handed(setup, plans):
    sm, _ = build([setup])
    rec = sm.nodes["n0"]
    for op in plans:
        if isinstance(op, Finish):
            running = sm.running_jobs()
            if running:
                sm.apply(C.command(C.JOB_FINISH, job_id=running[op.pick % len(running)].id, exit_code=0, at=3.0))
        else:
            start(sm, submit(sm, JobSpec()), (op.allocation("n0", setup.gpus),))
        c = sm.commitment("n0")
        assert c.cpus <= rec.cpus + EPS and c.mem_bytes <= rec.mem_total_bytes, c
        for index, g in c.gpus.items():
            total = rec.gpus[index].vram_total_bytes
            assert g.exclusive in (0, 1), (index, g)
            if g.exclusive:
                assert g.shared == 0 and g.oversubscribed == 0 and g.vram_bytes == 0, (index, g)
            assert g.fraction <= 1 + EPS and g.vram_bytes <= total, (index, g)

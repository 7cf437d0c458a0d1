"""Issue 23: the fit rule at its edges, decided the same way by all four copies.

test_fit_rules_agree.py ties the copies together on drawn examples, but an exact fill
(a request that takes exactly what is left) or a one-unit over-commit is drawn only by
luck, and whether hypothesis finds one depended on what else ran in the process: with
`>` changed to `>=` in the state machine's memory check the file passed alone and
failed in its folder; with a one-byte slack nothing failed at all. These cases are
written out, so every run checks them, alone or after anything else:

for memory, CPUs, shared VRAM, a GPU's share, and `vram=` on an exclusive GPU, on a
node where part is already committed through the state machine, taking exactly what is
left is accepted, and one unit more (a byte, a millionth of a CPU or of a
share) is refused, by `NodeState.fit`, by the `Fleet` arrays, by the state machine's
re-check at commit (`job.start.v1`), and, against the node's whole capacity, by the
"can never fit" verdict (`never_reason`, `Fleet.able`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from mtgpu.model.job import GpuMode, GpuSlot, JobSpec, NodeAllocation
from mtgpu.sched import Scheduler, rank_requests
from mtgpu.sched.nodefit import NodeState
from mtgpu.sched.satisfiable import never_reason
from mtgpu.server.member.view import build_snapshot

from builders import G
from test_fit_rules_agree import NodeSetup, _alternative, _spec, accepts, build, emptied, start, submit

RTX = ("nvidia", "NVIDIA GeForce RTX 4090", 24 * G)
NODE = dict(gpus=(RTX,), cpus=8.0, mem_bytes=64 * G)


@dataclass(frozen=True)
class Edge:
    """`held` is placed first (through nodefit and the state machine); then `left` is what
    remains of the resource, and `unit` the smallest step of it a request can ask for."""

    name: str
    held: JobSpec
    request: object  # (amount) -> JobSpec
    left: float
    unit: float
    capacity: float
    allocation: object  # (amount) -> NodeAllocation, as a scheduler would hand it to the state machine


def _host(cpus: float, mem: int) -> NodeAllocation:
    return NodeAllocation("n0", (), cpus, mem, None)


def _shared(fraction: float, vram: int) -> NodeAllocation:
    return NodeAllocation("n0", (GpuSlot(0, fraction, vram, GpuMode.SHARED),), 0.0, 0, "nvidia")


EDGES = (
    Edge("memory", _spec(None, 0, GpuMode.EXCLUSIVE, mem=16 * G),
         lambda m: _spec(None, 0, GpuMode.EXCLUSIVE, mem=int(m)), 48 * G, 1, 64 * G,
         lambda m: _host(0.0, int(m))),
    Edge("cpus", _spec(None, 0, GpuMode.EXCLUSIVE, cpus=3.0),
         lambda c: _spec(None, 0, GpuMode.EXCLUSIVE, cpus=c), 5.0, 1e-6, 8.0,
         lambda c: _host(c, 0)),
    Edge("shared VRAM", _spec("rtx4090", 0.25, GpuMode.SHARED, vram=12 * G),
         lambda v: _spec("rtx4090", 0.25, GpuMode.SHARED, vram=int(v)), 12 * G, 1, 24 * G,
         lambda v: _shared(0.25, int(v))),
    Edge("GPU share", _spec("rtx4090", 0.75, GpuMode.SHARED),
         lambda f: _spec("rtx4090", f, GpuMode.SHARED), 0.25, 1e-6, 1.0,
         lambda f: _shared(f, 0)),  # no VRAM reserved: the share alone is checked
)


def _placed(edge: Edge):
    """The node with `edge.held` committed, and the scheduler's view of it."""
    sm, _ = build([NodeSetup(history=(edge.held,), **NODE)])
    assert sm.running_jobs(), f"{edge.name}: the held job was not placed"
    snap = build_snapshot(sm, {})
    return sm, snap


def _verdicts(sm, snap, spec: JobSpec, alloc: NodeAllocation) -> dict[str, bool]:
    node = snap.nodes[0]
    (req,) = rank_requests(spec)
    sched = Scheduler(snap)
    rows = slice(0, 1)
    return {
        "nodefit": NodeState(node).fit(req) is not None,
        "fleet": bool(sched.fleet.host_ok(req, rows)[0]) and (not req.gpu_count or bool(sched.fleet.gpu_ok(req, rows)[0].any())),
        "state machine": accepts(sm, alloc),
    }


@pytest.mark.parametrize("edge", EDGES, ids=lambda e: e.name)
def test_what_is_left_exactly_is_taken_by_every_copy(edge):
    sm, snap = _placed(edge)
    got = _verdicts(sm, snap, edge.request(edge.left), edge.allocation(edge.left))
    assert got == dict.fromkeys(got, True), f"{edge.name}: an exact fill of {edge.left} refused: {got}"
    jid = submit(sm, edge.request(edge.left))
    assert start(sm, jid, (edge.allocation(edge.left),))["ok"]


@pytest.mark.parametrize("edge", EDGES, ids=lambda e: e.name)
def test_one_unit_more_than_is_left_is_refused_by_every_copy(edge):
    sm, snap = _placed(edge)
    over = edge.left + edge.unit
    got = _verdicts(sm, snap, edge.request(over), edge.allocation(over))
    assert got == dict.fromkeys(got, False), f"{edge.name}: {edge.unit} over what is left accepted: {got}"
    r = start(sm, submit(sm, edge.request(over)), (edge.allocation(over),))
    assert not r["ok"] and "n0" in r["error"], r


@pytest.mark.parametrize("edge", EDGES, ids=lambda e: e.name)
def test_the_whole_capacity_can_fit_and_one_unit_more_never_can(edge):
    sm, snap = _placed(edge)
    node = snap.nodes[0]
    sched = Scheduler(snap)
    for amount, possible in ((edge.capacity, True), (edge.capacity + edge.unit, False)):
        spec = edge.request(amount)
        (req,) = rank_requests(spec)
        assert (never_reason(node, req) is None) == possible, (edge.name, amount)
        assert bool(sched.fleet.able(req)[0]) == possible, (edge.name, amount)
        assert (NodeState(emptied(node)).fit(req) is not None) == possible, (edge.name, amount)
        assert (sched.never_fits(spec) is None) == possible, (edge.name, amount)


@pytest.mark.parametrize("asked, fits", [(24 * G, True), (24 * G + 1, False)])
def test_exclusive_vram_is_held_to_the_gpus_total_to_the_byte(asked, fits):
    sm, _ = build([NodeSetup(history=(), **NODE)])
    snap = build_snapshot(sm, {})
    spec = JobSpec(gpus=(_alternative("rtx4090", 1.0),), vram_bytes=asked)
    (req,) = rank_requests(spec)
    node = snap.nodes[0]
    assert (NodeState(node).fit(req) is not None) == fits
    assert bool(Scheduler(snap).fleet.gpu_ok(req, slice(0, 1))[0][0]) == fits
    assert (never_reason(node, req) is None) == fits

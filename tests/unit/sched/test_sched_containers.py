"""Container jobs go only where their image can run: nodes with containers on, and an
image the cluster offers (any member can fetch a staged one) or a node that runs
tenants' own images. A job no node could ever run is refused with the setting to change."""

from __future__ import annotations

from mtgpu.model.cluster import NodeContainers
from mtgpu.sched import check_satisfiable, schedule

from tests.unit.sched.builders import cluster, make_job, make_node, make_spec

BASE = "localhost/base:1"
OFFERS = NodeContainers(frozenset({BASE}), user_images=False)
FETCHES = NodeContainers(frozenset(), user_images=False)  # containers on, stages nothing itself
OWN = NodeContainers(frozenset(), user_images=True)


def test_a_container_job_is_placed_only_on_a_node_with_containers_on():
    snap = cluster(make_node("a", 2), make_node("b", 2, containers=OFFERS))
    plan = schedule(snap, [make_job(i, "1", container=BASE) for i in range(1, 4)], now=0)
    assert {p.allocations[0].node for p in plan.placements} == {"b"}
    assert len(plan.placements) == 2 and 3 in plan.pending
    assert "a: containers are off there" in plan.pending[3]


def test_a_node_without_the_image_takes_a_job_in_an_image_another_member_offers():
    snap = cluster(make_node("a", 1, containers=OFFERS, cpus_committed=32), make_node("b", 1, containers=FETCHES))
    plan = schedule(snap, [make_job(1, "1", cpus=1, container=BASE)], now=0)
    assert [p.allocations[0].node for p in plan.placements] == ["b"]


def test_an_image_no_member_offers_runs_only_where_tenants_own_images_are_allowed():
    snap = cluster(make_node("a", 1, containers=OFFERS), make_node("b", 1, containers=OWN))
    plan = schedule(snap, [make_job(1, "1", container="localhost/mine:2")], now=0)
    assert [p.allocations[0].node for p in plan.placements] == ["b"]


def test_refusals_name_the_directive_and_the_setting_to_change():
    none_on = cluster(make_node("a", 1), make_node("b", 1))
    why = check_satisfiable(make_spec("1", container=BASE), none_on)
    assert why.startswith(f"container={BASE}: no node of this cluster runs containers") and "enabled = true" in why
    offered = cluster(make_node("a", 1, containers=OFFERS))
    why = check_satisfiable(make_spec("1", container="localhost/other:1"), offered)
    assert "localhost/other:1" in why and BASE in why and "allow_user_images" in why
    assert check_satisfiable(make_spec("1", container=BASE), offered) is None
    plan = schedule(none_on, [make_job(1, "1", container=BASE)], now=0)
    assert "no node of this cluster runs containers" in plan.rejected[1]


def test_a_container_gang_needs_as_many_container_nodes_as_ranks():
    snap = cluster(make_node("a", 1, containers=OFFERS), make_node("b", 1), make_node("c", 1, containers=FETCHES))
    plan = schedule(snap, [make_job(1, "1", nodes=2, container=BASE)], now=0)
    assert sorted(a.node for a in plan.placements[0].allocations) == ["a", "c"]
    why = check_satisfiable(make_spec("1", nodes=3, container=BASE), snap)
    assert why is not None and "only 2 nodes" in why and "b: containers are off" in why


def test_server_and_container_pins_combine():
    snap = cluster(make_node("a", 1, containers=OFFERS), make_node("b", 1))
    plan = schedule(snap, [make_job(1, "1", server="b", container=BASE)], now=0)
    assert 1 in plan.rejected and "containers are off" in plan.rejected[1]

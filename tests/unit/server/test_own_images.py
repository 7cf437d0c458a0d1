"""What a member checks at submit for a job in a tenant's own image (server/member/own_images.py):
the tenant's store on the member taking the request, when the job may run there; pinned there
when found; nothing checked where the store that counts is another member's."""

from __future__ import annotations

from dataclasses import replace

from mtgpu.model.cluster import NodeContainers
from mtgpu.server.member.own_images import name_problem, own_image_check, pinned, unreadable_image
from tests.unit.sched.builders import cluster, make_node, make_spec

BASE = "localhost/base:1"
OWN = "localhost/mine:1"
OFFERS = NodeContainers(frozenset({BASE}), user_images=True)
USER = NodeContainers(frozenset(), user_images=True)
STAGED_ONLY = NodeContainers(frozenset(), user_images=False)


def test_an_image_the_cluster_offers_is_never_looked_for_in_a_tenants_store():
    snap = cluster(make_node("a", containers=OFFERS), make_node("b", containers=USER))
    assert own_image_check(make_spec(container=BASE), snap, "a") is None
    assert own_image_check(make_spec(container=BASE), snap, "b") is None
    assert own_image_check(make_spec(), snap, "a") is None


def test_any_other_image_is_looked_for_in_the_store_of_the_member_taking_the_request():
    snap = cluster(make_node("a", containers=USER), make_node("b", containers=STAGED_ONLY))
    check = own_image_check(make_spec(container=OWN), snap, "a")
    assert check is not None and (check.image, check.node, check.others_could) == (OWN, "a", False)
    assert own_image_check(make_spec(container=OWN, server="a"), snap, "a") is not None


def test_nothing_is_checked_where_the_store_that_counts_is_not_this_members():
    snap = cluster(make_node("a", containers=USER), make_node("b", containers=USER), make_node("c"))
    assert own_image_check(make_spec(container=OWN, server="b"), snap, "a") is None
    assert own_image_check(make_spec(container=OWN, nodes=2), snap, "a") is None
    assert own_image_check(replace(make_spec(container=OWN), exclude=("a",)), snap, "a") is None
    assert own_image_check(make_spec(container=OWN), snap, "c") is None  # c runs no containers


def test_a_job_whose_image_is_found_here_is_pinned_here_and_told_so_when_others_could_have_run_it():
    alone = cluster(make_node("a", containers=USER), make_node("b", containers=STAGED_ONLY))
    spec, note = pinned(make_spec(container=OWN), own_image_check(make_spec(container=OWN), alone, "a"))
    assert spec.server == "a" and note is None
    two = cluster(make_node("a", containers=USER), make_node("b", containers=USER))
    spec, note = pinned(make_spec(container=OWN), own_image_check(make_spec(container=OWN), two, "a"))
    assert spec.server == "a" and "your store on a" in note and "server=MEMBER" in note
    spec, note = pinned(make_spec(container=OWN, server="a"), own_image_check(make_spec(container=OWN), two, "a"))
    assert spec.server == "a" and note is None


def test_an_image_not_offered_must_be_an_image_name_podman_reads_as_one():
    """The image is handed to podman as an argument: `--help` (a workspace's --image is free
    text) was read as an option (`podman image exists --help` answered 0, "found"), and
    `Foo:1` answered 500 with podman's 'repository name must be lowercase'. Names as
    containers/image's reference grammar reads them (checked against podman 4.3's answers)."""
    for good in ("ubuntu", "localhost/base:1", "docker.io/library/python:3.12", "localhost:5000/a/b:x",
                 "my__img", "a-b--c", "Registry.Example.com/x/y", "sha256:" + "a" * 64, "x@sha256:" + "0" * 64,
                 "localhost/mtgpu-saved/alice/ws:latest",
                 "Foo/bar", "MyReg/x:1"):  # podman 4.3 reads an upper-case first part as a registry
        assert name_problem(good) is None, good
    for bad, why in (("--help", "'--help' is not lower-case letters"), ("Foo:1", "'Foo' is not in lower case"),
                     ("localhost/UP", "'UP' is not in lower case"), ("x..y", "is not lower-case letters"),
                     ("a___b", "is not lower-case"), ("localhost/x:", "has a tag that is not"),
                     ("x@sha256:zz", "has a digest that is not"), ("/bin/sh", "is not an image name"),
                     ("a b", "is not lower-case"), ("x" * 256, "more than 255"),
                     ("sha256:9", "sha256: takes 64 hexadecimal digits")):
        problem = name_problem(bad)
        assert problem is not None and why in problem, (bad, problem)
    snap = cluster(make_node("a", containers=OFFERS))
    assert unreadable_image(make_spec(container="--help"), snap).startswith("image '--help' is not an image name")
    assert "[REGISTRY/]NAME[:TAG][@DIGEST]" in unreadable_image(make_spec(container="Foo:1"), snap)
    assert unreadable_image(make_spec(container=BASE), snap) is None
    assert unreadable_image(make_spec(), snap) is None

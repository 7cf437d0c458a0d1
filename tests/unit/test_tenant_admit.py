"""Many clusters, one admin (issue 29 point 3), in the state machine: a tenant assigned to
another cluster is admitted there with the same name, ids and keys (tenant.admit.v1), its
clusters and their servers are kept (tenant.assign.v2), and what would give one person two
identities, or one id two people, is refused naming both."""

from __future__ import annotations

from mtgpu.state import commands as C
from mtgpu.state.machine import StateMachine


def admit(sm: StateMachine, name="alice", uid=300000, gid=300000, clusters=("lab-a", "lab-b"), **kw) -> dict:
    args = dict(name=name, uid=uid, gid=gid, keys=["ssh-ed25519 AAAA alice"], clusters=list(clusters),
                servers={"lab-a": "10.0.0.1:7070", "lab-z": "10.0.0.9:7070"}, at=5.0)
    return sm.apply(C.command(C.TENANT_ADMIT, **{**args, **kw}))


def test_a_tenant_of_another_cluster_is_admitted_with_its_ids_keys_clusters_and_servers():
    sm = StateMachine()
    r = admit(sm)
    assert r["ok"] and r["created"], r
    t = sm.tenants["alice"]
    assert (t.uid, t.gid, t.managed, t.keys) == (300000, 300000, True, ["ssh-ed25519 AAAA alice"])
    assert t.clusters == ["lab-a", "lab-b"] and t.servers == {"lab-a": "10.0.0.1:7070"}  # lab-z: not hers
    snap = sm.to_dict()
    assert snap["version"] == 2 and StateMachine.from_dict(snap).tenants["alice"].servers == t.servers
    # again, with her clusters changed there: this cluster is taken away, the record stays
    r = admit(sm, clusters=["lab-a"])
    assert r["ok"] and not r["created"] and sm.tenants["alice"].clusters == ["lab-a"]


def test_one_person_keeps_one_identity_and_an_id_is_never_given_to_two():
    sm = StateMachine()
    assert sm.apply(C.command(C.TENANT_ENSURE, name="bob", uid=300000, gid=300000, at=1.0))["ok"]
    r = admit(sm)
    assert not r["ok"] and "belong to tenant 'bob'" in r["error"] and "same ids on every cluster" in r["error"], r
    assert "alice" not in sm.tenants
    assert admit(sm, uid=300001, gid=300001)["ok"]
    r = admit(sm, uid=300002, gid=300002)
    assert not r["ok"] and "is here with uid 300001" in r["error"], r
    r = admit(sm, name="bob", uid=300000, gid=300000)
    assert not r["ok"] and "a local user of this node" in r["error"], r
    r = admit(sm, name="not a name")
    assert not r["ok"], r


def test_assign_v2_keeps_the_servers_of_the_tenants_clusters_only_and_a_format_1_state_is_written_as_before():
    sm = StateMachine()
    assert sm.apply(C.command(C.TENANT_ENSURE, name="carol", uid=300005, gid=300005, at=1.0))["ok"]
    before = sm.to_dict()
    assert before["version"] == 1 and "servers" not in before["tenants"][0]
    r = sm.apply(C.command(C.TENANT_ASSIGN_V2, name="carol", clusters=["lab-a", "lab-b"],
                           servers={"lab-b": "10.0.0.2:7070", "lab-c": "10.0.0.3:7070"}, at=2.0))
    assert r["ok"], r
    t = sm.tenants["carol"]
    assert t.clusters == ["lab-a", "lab-b"] and t.servers == {"lab-b": "10.0.0.2:7070"}
    assert sm.to_dict()["version"] == 2
    assert C.command(C.TENANT_ASSIGN_V2, name="carol", clusters=[], servers={}, at=3.0)["format"] == 2

"""accounts.plan: deterministic ids, tenant names, and what a node is told to create."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtgpu.accounts.plan import (
    MAX_ID,
    SUBID_BASE,
    SUBID_BLOCKS,
    SUBID_COUNT,
    AccountPlan,
    GroupToCreate,
    HomeToCheck,
    HomeToCreate,
    IdRangeExhausted,
    OsAccounts,
    SubIdsToAdd,
    TenantSpec,
    UserToCreate,
    allocate_ids,
    plan_accounts,
    subid_overlap,
    subid_overlap_problem,
    subordinate_range,
    validate_tenant_name,
)

RANGE = (200_000, 299_999)
ROOT = "/home/mtgpu"


def make_os(users=None, groups=None, subuids=None, subgids=None) -> OsAccounts:
    base_users = {"root": (0, 0, "/root"), "daemon": (1, 1, "/usr/sbin")}
    base_groups = {"root": 0, "daemon": 1}
    return OsAccounts(
        users={**base_users, **(users or {})},
        groups={**base_groups, **(groups or {})},
        subuids=subuids or {},
        subgids=subgids or {},
    )


def tenant(name: str, uid: int, gid: int | None = None, keys=()) -> TenantSpec:
    return TenantSpec(name, uid, uid if gid is None else gid, tuple(keys))


# ---------------------------------------------------------------- allocate_ids


def test_first_tenant_gets_the_first_id_of_the_range_as_uid_and_gid():
    assert allocate_ids({}, RANGE, set()) == (200_000, 200_000)


def test_ids_are_deterministic_and_independent_of_input_order():
    tenants = {"a": (200_000, 200_000), "b": (200_002, 200_002), "c": (200_001, 200_003)}
    answers = set()
    for perm in itertools.permutations(tenants.items()):
        answers.add(allocate_ids(dict(perm), RANGE, {200_004, 200_006}))
        answers.add(allocate_ids(dict(perm), RANGE, {200_006, 200_004}))
    assert answers == {(200_005, 200_005)}


def test_allocation_fills_the_lowest_gap_left_by_a_removed_tenant():
    assert allocate_ids({"a": (200_000, 200_000), "c": (200_002, 200_002)}, RANGE) == (200_001, 200_001)


def test_uid_and_gid_differ_only_when_no_common_free_id_is_left():
    # a range of two where 1000 is a used uid and 1001 a used gid: no id is free as both
    assert allocate_ids({"a": (1000, 1001)}, (1000, 1001)) == (1001, 1000)


def test_taken_os_ids_are_avoided_as_uid_and_gid():
    assert allocate_ids({}, RANGE, {200_000, 200_001}) == (200_002, 200_002)


def test_an_exhausted_range_is_an_error_that_names_the_setting():
    with pytest.raises(IdRangeExhausted, match="TENANT_UID_RANGE"):
        allocate_ids({"a": (5000, 5000), "b": (5001, 5001)}, (5000, 5001))


def test_a_bad_range_is_refused():
    with pytest.raises(ValueError):
        allocate_ids({}, (10, 5))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(200_000, 200_050), max_size=40), st.sets(st.integers(200_000, 200_060), max_size=10))
def test_allocated_ids_are_always_free_and_repeatable(ids, taken):
    existing = {f"t{i}": (u, u) for i, u in enumerate(ids)}
    first = allocate_ids(existing, RANGE, taken)
    shuffled = list(existing.items())
    random.Random(1).shuffle(shuffled)
    assert allocate_ids(dict(shuffled), RANGE, set(taken)) == first
    uid, gid = first
    assert uid not in set(ids) | taken and gid not in set(ids) | taken
    assert uid == gid


# ---------------------------------------------------------------- names


@pytest.mark.parametrize("name", ["alice", "bob-lab", "_svc", "a1", "x" * 32, "data_team"])
def test_portable_names_are_accepted(name):
    assert validate_tenant_name(name) is None


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("", "empty"),
        ("x" * 33, "at most 32"),
        ("Alice", "lowercase"),
        ("1abc", "starting with"),
        ("-abc", "starting with"),
        ("a.b", "lowercase"),
        ("a b", "lowercase"),
        ("al$", "lowercase"),
        ("root", "reserved"),
        ("daemon", "reserved"),
        ("nobody", "reserved"),
        ("sudo", "reserved"),
        ("mtgpu", "reserved"),
        ("mtgpu-admin", "reserved"),
        ("systemd-foo", "reserved"),
    ],
)
def test_bad_or_reserved_names_are_refused_with_a_reason(name, fragment):
    why = validate_tenant_name(name)
    assert why is not None and fragment in why


# ---------------------------------------------------------------- plan_accounts


def test_new_tenant_per_node_gets_group_user_home_keys_and_subids():
    plan = plan_accounts([tenant("alice", 200_000, keys=["ssh-ed25519 AAAA alice@laptop"])], make_os(), ROOT,
                         "per-node", False)
    assert plan.conflicts == ()
    assert plan.create_groups == (GroupToCreate("alice", 200_000),)
    assert plan.create_users == (UserToCreate("alice", 200_000, 200_000, "/home/mtgpu/alice"),)
    assert plan.create_homes == (HomeToCreate("/home/mtgpu/alice", 200_000, 200_000, 0o700),)
    assert plan.check_homes == ()
    assert [k.keys for k in plan.write_keys] == [("ssh-ed25519 AAAA alice@laptop",)]
    assert plan.write_keys[0].path == "/home/mtgpu/alice/.ssh/authorized_keys"
    assert plan.add_subids == (SubIdsToAdd("alice", SUBID_BASE, SUBID_COUNT),)


def test_plan_is_the_same_whatever_the_order_of_tenants():
    ts = [tenant("bob", 200_001), tenant("alice", 200_000), tenant("carol", 200_002)]
    plans = {plan_accounts(list(p), make_os(), ROOT, "per-node", False) for p in itertools.permutations(ts)}
    assert len(plans) == 1


def test_shared_layout_owner_node_creates_homes_and_others_only_check_them():
    ts = [tenant("alice", 200_000, keys=["ssh-ed25519 AAAA"])]
    owner = plan_accounts(ts, make_os(), ROOT, "shared", True)
    other = plan_accounts(ts, make_os(), ROOT, "shared", False)
    assert owner.create_homes and owner.write_keys and not owner.check_homes
    assert other.create_homes == () and other.write_keys == ()
    assert other.check_homes == (HomeToCheck("/home/mtgpu/alice", 200_000, 200_000),)
    # every node still creates the account itself: accounts are per node, homes are shared
    assert owner.create_users == other.create_users and owner.create_groups == other.create_groups


def test_per_node_layout_creates_homes_on_every_node():
    ts = [tenant("alice", 200_000)]
    assert plan_accounts(ts, make_os(), ROOT, "per-node", False).create_homes
    assert plan_accounts(ts, make_os(), ROOT, "per-node", True).create_homes


def test_existing_tenant_account_with_the_same_ids_is_reused_not_recreated():
    os_ = make_os(users={"alice": (200_000, 200_000, "/home/mtgpu/alice")}, groups={"alice": 200_000},
                  subuids={"alice": ((SUBID_BASE, SUBID_COUNT),)}, subgids={"alice": ((SUBID_BASE, SUBID_COUNT),)})
    plan = plan_accounts([tenant("alice", 200_000)], os_, ROOT, "per-node", False)
    assert plan.conflicts == ()
    assert plan.create_users == () and plan.create_groups == () and plan.add_subids == ()
    assert plan.create_homes  # ensured (apply leaves an existing home alone)


def test_name_clash_with_an_os_user_of_another_uid_is_a_conflict_with_the_fix():
    os_ = make_os(users={"bob": (1001, 1001, "/home/bob")}, groups={"bob": 1001})
    plan = plan_accounts([tenant("bob", 200_001), tenant("alice", 200_000)], os_, ROOT, "per-node", False)
    assert "tenant 'bob': the OS already has a user 'bob' with uid 1001; choose another name or remove that account" \
        in plan.conflicts
    assert plan.refused_tenants == ("bob",)
    # nothing at all is planned for bob; alice is unaffected
    assert [u.name for u in plan.create_users] == ["alice"]
    assert [g.name for g in plan.create_groups] == ["alice"]
    assert all("bob" not in h.path for h in plan.create_homes)


def test_group_name_clash_and_taken_ids_are_conflicts():
    os_ = make_os(users={"svc": (200_005, 50, "/srv")}, groups={"carol": 4000, "video2": 200_006})
    plan = plan_accounts(
        [tenant("carol", 200_002), tenant("dave", 200_005, 200_009), tenant("erin", 200_007, 200_006)],
        os_, ROOT, "per-node", False,
    )
    text = "\n".join(plan.conflicts)
    assert "tenant 'carol': the OS already has a group 'carol' with gid 4000" in text
    assert "tenant 'dave': uid 200005 is already the OS user 'svc'" in text
    assert "tenant 'erin': gid 200006 is already the OS group 'video2'" in text
    assert plan.refused_tenants == ("carol", "dave", "erin")
    assert plan.empty


def test_existing_user_with_a_different_home_or_group_is_a_conflict():
    os_ = make_os(users={"alice": (200_000, 200_000, "/home/alice"), "bob": (200_001, 100, "/home/mtgpu/bob")},
                  groups={"alice": 200_000})
    plan = plan_accounts([tenant("alice", 200_000), tenant("bob", 200_001)], os_, ROOT, "per-node", False)
    assert any("with home /home/alice, not /home/mtgpu/alice" in c for c in plan.conflicts)
    assert any("'bob' (uid 200001) whose group is gid 100" in c for c in plan.conflicts)


def test_invalid_names_and_duplicate_ids_among_tenants_are_conflicts():
    plan = plan_accounts([tenant("Root", 200_000), tenant("a", 200_001), tenant("b", 200_001)], make_os(), ROOT,
                         "per-node", False)
    assert any("'Root'" in c for c in plan.conflicts)
    assert any("tenant 'b': uid 200001 is also tenant 'a'" in c for c in plan.conflicts)
    assert [u.name for u in plan.create_users] == ["a"]


def test_keys_with_line_breaks_are_left_out_with_a_warning_and_duplicates_dropped():
    plan = plan_accounts([tenant("alice", 200_000, keys=["ssh-ed25519 A", "ssh-ed25519 A ", "x\ncommand=evil",
                                                          " "])], make_os(), ROOT, "per-node", False)
    assert plan.write_keys[0].keys == ("ssh-ed25519 A",)
    assert any("line break" in w for w in plan.warnings)


def test_subordinate_ranges_are_derived_from_the_uid_and_never_overlap():
    a = subordinate_range(200_000, RANGE)
    b = subordinate_range(200_001, RANGE)
    assert a == (SUBID_BASE, SUBID_COUNT) and b == (SUBID_BASE + SUBID_COUNT, SUBID_COUNT)
    assert subordinate_range(199_999, RANGE) is None
    # a tenant SUBID_BLOCKS uids into its range would share its block with the range's first
    assert subordinate_range(RANGE[0] + SUBID_BLOCKS, RANGE) is None
    assert subordinate_range(RANGE[0] + SUBID_BLOCKS - 1, RANGE) is not None
    plan = plan_accounts([tenant("zed", RANGE[1])], make_os(), ROOT, "per-node", False)
    assert plan.add_subids == () and any("no room for subordinate ids" in w for w in plan.warnings)


def test_the_first_tenants_of_two_uid_ranges_get_different_subordinate_ranges():
    """Two nodes on one machine (different TENANT_UID_RANGEs) each give index 0 a range: the
    range follows the uid, so they differ; the same uid gets the same range in any range."""
    first_a = subordinate_range(330_000, (330_000, 339_999))
    first_b = subordinate_range(340_000, (340_000, 349_999))
    assert first_a is not None and first_b is not None and first_a != first_b
    assert subordinate_range(335_000, (330_000, 339_999)) == subordinate_range(335_000, (300_000, 399_999))


def test_the_default_range_keeps_the_subordinate_ranges_its_tenants_already_have():
    """Upgrade: on the default TENANT_UID_RANGE the uid-keyed block is the one the earlier
    (uid - first) formula gave, so members added later agree with the older ones."""
    for index in (0, 1, 17, 4_096, SUBID_BLOCKS - 1):
        assert subordinate_range(RANGE[0] + index, RANGE) == (SUBID_BASE + index * SUBID_COUNT, SUBID_COUNT)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(lo=st.integers(1_000, MAX_ID - 1), width=st.integers(1, 200_000), data=st.data())
def test_two_tenants_of_one_range_never_share_subordinate_ids(lo, width, data):
    hi = min(MAX_ID, lo + width)
    u1 = data.draw(st.integers(lo, hi), label="u1")
    u2 = data.draw(st.integers(lo, hi).filter(lambda u: u != u1), label="u2")
    r1, r2 = subordinate_range(u1, (lo, hi)), subordinate_range(u2, (lo, hi))
    for r in (r1, r2):
        assert r is None or (SUBID_BASE <= r[0] and r[0] + r[1] - 1 <= MAX_ID and r[1] == SUBID_COUNT)
    if r1 is not None and r2 is not None:
        assert r1[0] + r1[1] <= r2[0] or r2[0] + r2[1] <= r1[0]


def test_other_accounts_subordinate_ids_over_a_tenant_uid_are_warned_about():
    os_ = make_os(users={"dev": (1000, 1000, "/home/dev")}, subuids={"dev": ((165_536, 65_536),)})
    plan = plan_accounts([tenant("alice", 200_000)], os_, ROOT, "per-node", False)
    assert any("'dev''s subordinate uids 165536-231071" in w and "could act as this tenant" in w
               for w in plan.warnings)
    assert plan.create_users  # a warning, not a conflict


def test_the_plan_leaves_the_free_range_check_to_the_write_under_the_lock():
    """The snapshot the plan sees may be stale by the time it is applied: the range is planned
    as the tenant's own, and apply.add_subordinate_ids checks it under /etc/subuid's lock."""
    os_ = make_os(subuids={"other": ((SUBID_BASE + 10, 5),)})
    plan = plan_accounts([tenant("alice", 200_000)], os_, ROOT, "per-node", False)
    assert plan.add_subids == (SubIdsToAdd("alice", SUBID_BASE, SUBID_COUNT),)


def test_a_tenant_keeps_the_range_it_has_and_is_told_how_to_align_it():
    """Upgrade: ranges the earlier formula gave (here a custom range's index 0) stay, since
    the tenant's containers wrote files with them; the warning gives the usermod that aligns."""
    rng = (330_000, 339_999)
    old = ((SUBID_BASE, SUBID_COUNT),)
    os_ = make_os(users={"alice": (330_000, 330_000, "/home/mtgpu/alice")}, groups={"alice": 330_000},
                  subuids={"alice": old}, subgids={"alice": old})
    plan = plan_accounts([tenant("alice", 330_000)], os_, ROOT, "per-node", False, uid_range=rng)
    assert plan.add_subids == ()
    first, count = subordinate_range(330_000, rng)
    span = f"{first}-{first + count - 1}"
    assert any(f"keeps its subordinate uids {SUBID_BASE}-{SUBID_BASE + SUBID_COUNT - 1}" in w
               and f"usermod --del-subuids {SUBID_BASE}-{SUBID_BASE + SUBID_COUNT - 1} --add-subuids {span} alice"
               in w for w in plan.warnings)
    # one that already has the cluster's range hears nothing
    same = ((first, count),)
    quiet = plan_accounts([tenant("alice", 330_000)], make_os(users=os_.users, groups=os_.groups, subuids={
        "alice": same}, subgids={"alice": same}), ROOT, "per-node", False, uid_range=rng)
    assert quiet.warnings == () and quiet.add_subids == ()


def test_subid_overlap_sees_every_owner_and_names_the_fix():
    table = {"alice": [(SUBID_BASE, SUBID_COUNT)], "admin": [(SUBID_BASE + SUBID_COUNT - 1, 10)], "1234": [(5, 5)]}
    assert subid_overlap("alice", SUBID_BASE, SUBID_COUNT, table) == ("admin", SUBID_BASE + SUBID_COUNT - 1, 10)
    assert subid_overlap("bob", 7, 1, table) == ("1234", 5, 5)
    assert subid_overlap("bob", 10, 100, table) is None  # [5, 10) ends where it starts
    text = subid_overlap_problem("bob", "uid", "/etc/subuid", SUBID_BASE, SUBID_COUNT, ("admin", SUBID_BASE, 10))
    assert f"subordinate uids {SUBID_BASE}-{SUBID_BASE + SUBID_COUNT - 1} overlap 'admin''s" in text
    assert "/etc/subuid" in text and f"usermod --del-subuids {SUBID_BASE}-{SUBID_BASE + 9} admin" in text


def test_bad_layout_and_relative_home_root_are_refused():
    with pytest.raises(ValueError):
        plan_accounts([], make_os(), ROOT, "nfs", True)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        plan_accounts([], make_os(), "home/mtgpu", "per-node", True)


def test_empty_input_gives_an_empty_plan():
    assert plan_accounts([], make_os(), ROOT, "per-node", True) == AccountPlan()

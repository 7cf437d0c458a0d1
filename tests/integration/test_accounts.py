"""Tenant accounts on two simulated nodes with separate account databases (`--prefix ROOT`).

Each node is a temporary ROOT holding copies of the machine's passwd, group, shadow,
gshadow and login.defs (TESTING.md, "Tenant processes"): the shadow tools edit those and
never the machine's own. Its subuid and subgid start empty: the machine's hold the ranges
of every other node running here, which a test must not depend on; the tests that need
someone else's range write it in themselves. Homes are real directories owned by the
tenants' uids, so file modes are what is tested. Every root and home is removed at teardown.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mtgpu.accounts.apply import apply_plan, read_os_accounts, remove_account, run_tool
from mtgpu.accounts.plan import SUBID_BASE, SUBID_COUNT, TenantSpec, allocate_ids, plan_accounts, subordinate_range
from mtgpu.accounts.shadow_lock import shadow_lock
from tests.support.laptop import join
from tests.support.node import free_port, running_node, wait_for
from tests.support.users import account_db

if sys.platform != "linux" or os.geteuid() != 0:
    pytest.skip("creating accounts needs Linux and root", allow_module_level=True)
for _tool in ("useradd", "groupadd", "usermod", "userdel", "groupdel"):
    if shutil.which(_tool) is None:
        pytest.skip(f"{_tool} is not installed", allow_module_level=True)

RANGE = (270_000, 279_999)
SUBID_FILES = ("subuid", "subgid")
KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAlice alice@laptop"


class Node:
    """One simulated node: its own account database (ROOT/etc) and its own home root."""

    def __init__(self, base: Path, name: str, home_root: Path | None = None):
        self.root = account_db(base / name)
        self.home_root = home_root or base / f"{name}-homes"

    def plan(self, tenants, layout="per-node", owner=False, uid_range=RANGE):
        return plan_accounts(tenants, read_os_accounts(self.root), str(self.home_root), layout, owner,
                             uid_range=uid_range)

    def apply(self, tenants, layout="per-node", owner=False, uid_range=RANGE):
        return apply_plan(self.plan(tenants, layout, owner, uid_range), prefix_root=self.root)

    def add_subids_line(self, line: str) -> None:
        for f in SUBID_FILES:
            with open(self.root / "etc" / f, "a") as out:
                out.write(line + "\n")

    def passwd_line(self, name: str) -> str | None:
        for line in (self.root / "etc" / "passwd").read_text().splitlines():
            if line.split(":", 1)[0] == name:
                return line
        return None


@pytest.fixture
def nodes(base):
    return Node(base, "node1"), Node(base, "node2")


def allocate(names: list[str], uid_range: tuple[int, int] = RANGE) -> list[TenantSpec]:
    """What the replicated state does: ids allocated one by one from the same state."""
    state: dict[str, tuple[int, int]] = {}
    specs = []
    for name in names:
        uid, gid = allocate_ids(state, uid_range, set())
        state[name] = (uid, gid)
        specs.append(TenantSpec(name, uid, gid, (KEY_A,) if name.endswith("a") else ()))
    return specs


def test_same_tenant_gets_the_same_uid_gid_on_two_nodes_and_another_tenant_a_different_one(nodes):
    node1, node2 = nodes
    tenants = allocate(["mtta", "mttb"])
    for node in nodes:
        report = node.apply(tenants)
        assert report.ok, report.problems
    read1, read2 = read_os_accounts(node1.root), read_os_accounts(node2.root)
    a1, a2 = read1.users["mtta"], read2.users["mtta"]
    b1, b2 = read1.users["mttb"], read2.users["mttb"]
    assert a1[:2] == a2[:2] == (RANGE[0], RANGE[0])
    assert b1[:2] == b2[:2] == (RANGE[0] + 1, RANGE[0] + 1)
    assert read1.groups["mtta"] == read2.groups["mtta"] == RANGE[0]
    assert read1.subuids["mtta"] == read2.subuids["mtta"] == (subordinate_range(RANGE[0], RANGE),)
    assert read1.subgids["mttb"] == read2.subgids["mttb"] == (subordinate_range(RANGE[0] + 1, RANGE),)
    # unlocked but passwordless: '*' (key-only SSH), never '!'
    shadow = (node1.root / "etc" / "shadow").read_text().splitlines()
    assert [line.split(":")[1] for line in shadow if line.startswith("mtta:")] == ["*"]
    # the machine's own database is untouched
    assert "mtta:" not in Path("/etc/passwd").read_text()


def test_homes_are_0700_owned_by_the_tenant_with_its_keys_and_private_to_it(nodes):
    node1, _ = nodes
    a, b = allocate(["mtta", "mttb"])
    assert node1.apply([a, b]).ok
    home = node1.home_root / "mtta"
    st = os.stat(home)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (a.uid, a.gid, 0o700)
    assert stat.S_IMODE(os.stat(node1.home_root).st_mode) == 0o755
    keys = home / ".ssh" / "authorized_keys"
    kst = os.stat(keys)
    assert (kst.st_uid, stat.S_IMODE(kst.st_mode)) == (a.uid, 0o600)
    assert stat.S_IMODE(os.stat(home / ".ssh").st_mode) == 0o700
    assert KEY_A in keys.read_text()
    # a process of tenant B cannot look into A's home; A can
    as_b = subprocess.run(["ls", str(home)], user=b.uid, group=b.gid, extra_groups=[], capture_output=True, text=True)
    assert as_b.returncode != 0 and "Permission denied" in as_b.stderr
    as_a = subprocess.run(["cat", str(keys)], user=a.uid, group=a.gid, extra_groups=[], capture_output=True, text=True)
    assert as_a.returncode == 0 and KEY_A in as_a.stdout


def test_applying_again_changes_nothing(nodes):
    node1, _ = nodes
    tenants = allocate(["mtta", "mttb"])
    assert node1.apply(tenants).ok
    passwd_before = (node1.root / "etc" / "passwd").read_bytes()
    keys_before = os.stat(node1.home_root / "mtta" / ".ssh" / "authorized_keys")
    os.chmod(node1.home_root / "mtta", 0o750)  # the tenant's own choice is kept
    again = node1.plan(tenants)
    assert again.create_users == () and again.create_groups == () and again.add_subids == ()
    report = apply_plan(again, prefix_root=node1.root)
    assert report.ok and not [d for d in report.done if not d.startswith("warning")]
    assert (node1.root / "etc" / "passwd").read_bytes() == passwd_before
    assert os.stat(node1.home_root / "mtta" / ".ssh" / "authorized_keys").st_ino == keys_before.st_ino
    assert stat.S_IMODE(os.stat(node1.home_root / "mtta").st_mode) == 0o750


def test_a_name_clashing_with_an_existing_os_account_is_refused_and_that_account_is_unchanged(nodes):
    node1, node2 = nodes
    ok, text = run_tool(["useradd", "-u", "1234", "-M", "-d", "/home/clashy", "-s", "/bin/sh",
                         "--prefix", str(node1.root), "clashy"])
    assert ok, text
    before = node1.passwd_line("clashy")
    group_before = (node1.root / "etc" / "group").read_text()
    clashy, other = allocate(["clashy", "mttok"])
    report = node1.apply([clashy, other])
    assert ("tenant 'clashy': the OS already has a user 'clashy' with uid 1234; "
            "choose another name or remove that account") in report.problems
    assert node1.passwd_line("clashy") == before
    assert "clashy:x:1234:" in group_before and (node1.root / "etc" / "group").read_text().count("clashy:") == 1
    assert not (node1.home_root / "clashy").exists()
    # the other tenant is created anyway, and on node2 (no such OS account) clashy is too
    assert read_os_accounts(node1.root).users["mttok"][:2] == (other.uid, other.gid)
    assert node2.apply([clashy, other]).ok
    assert read_os_accounts(node2.root).users["clashy"][:2] == (clashy.uid, clashy.gid)


def test_shared_layout_home_is_created_once_and_checked_elsewhere(base):
    shared_homes = base / "shared-homes"
    owner, other = Node(base, "owner", shared_homes), Node(base, "other", shared_homes)
    tenants = allocate(["mtta"])
    early = other.apply(tenants, layout="shared", owner=False)
    assert any("shared home" in p and "is missing" in p for p in early.problems)
    assert not (shared_homes / "mtta").exists()
    assert owner.apply(tenants, layout="shared", owner=True).ok
    late = other.apply(tenants, layout="shared", owner=False)
    assert late.ok and any("checked shared home" in d for d in late.done)
    # both nodes have the account with the same ids
    assert read_os_accounts(owner.root).users["mtta"][:2] == read_os_accounts(other.root).users["mtta"][:2]


def test_a_failing_shadow_tool_is_reported_with_the_command_and_stderr(nodes):
    node1, _ = nodes
    # A stale plan: made before someone took the gid on this node.
    (a,) = allocate(["mtta"])
    stale = node1.plan([a])
    ok, text = run_tool(["groupadd", "-g", str(a.gid), "--prefix", str(node1.root), "latecomer"])
    assert ok, text
    report = apply_plan(stale, prefix_root=node1.root)
    assert not report.ok
    assert report.problems[0].startswith(f"`groupadd -g {a.gid} --prefix {node1.root} mtta` failed with status 4: ")
    assert "already exists" in report.problems[0]
    assert "user mtta not created: its group could not be created" in report.problems
    assert "mtta" not in read_os_accounts(node1.root).users
    assert not (node1.home_root / "mtta").exists()


def test_remove_account_removes_a_tenant_and_never_an_os_account(nodes):
    node1, _ = nodes
    ok, text = run_tool(["useradd", "-u", "1235", "-M", "-d", "/home/osuser", "--prefix", str(node1.root), "osuser"])
    assert ok, text
    (a,) = allocate(["mtta"])
    assert node1.apply([a]).ok
    home = node1.home_root / "mtta"
    report = remove_account("mtta", uid_range=RANGE, prefix_root=node1.root, home=home)
    assert report.ok, report.problems
    after = read_os_accounts(node1.root)
    assert "mtta" not in after.users and "mtta" not in after.groups and "mtta" not in after.subuids
    assert not home.exists()
    refused = remove_account("osuser", uid_range=RANGE, prefix_root=node1.root)
    assert not refused.ok and "outside TENANT_UID_RANGE" in refused.problems[0]
    assert "osuser" in read_os_accounts(node1.root).users


# ---------------------------------------------------------------- subordinate ids on a shared machine

HALF_A, HALF_B = (RANGE[0], RANGE[0] + 4_999), (RANGE[0] + 5_000, RANGE[1])  # two clusters' TENANT_UID_RANGEs


def test_the_first_tenants_of_two_nodes_on_one_machine_get_disjoint_subordinate_ranges(base):
    machine = Node(base, "machine")  # one account database, two nodes of two clusters writing it
    (a,) = allocate(["mtta"], HALF_A)
    (b,) = allocate(["mtxa"], HALF_B)
    assert machine.apply([a], uid_range=HALF_A).ok
    report = machine.apply([b], uid_range=HALF_B)
    assert report.ok, report.problems
    got = read_os_accounts(machine.root)
    for table in (got.subuids, got.subgids):
        ((a_first, a_count),), ((b_first, b_count),) = table["mtta"], table["mtxa"]
        assert a_first + a_count <= b_first or b_first + b_count <= a_first


def test_a_tenant_has_the_same_range_on_two_members_whatever_else_the_machine_holds(base):
    """Each member's database already holds another node's first tenant at the range the
    earlier index formula gave every first tenant: the tenant still gets its own range, the
    same on both members, whatever order its tenants come in."""
    m1, m2 = Node(base, "m1"), Node(base, "m2")
    for m in (m1, m2):
        m.add_subids_line(f"othernode0:{SUBID_BASE}:{SUBID_COUNT}")
    tenants = allocate(["mtta", "mttb", "mttc"])
    assert m1.apply(tenants).ok
    assert m2.apply(tenants[2:]).ok and m2.apply(tenants).ok
    got1, got2 = read_os_accounts(m1.root), read_os_accounts(m2.root)
    for t in tenants:
        want = (subordinate_range(t.uid, RANGE),)
        assert got1.subuids[t.name] == got2.subuids[t.name] == want
        assert got1.subgids[t.name] == got2.subgids[t.name] == want


def test_an_admins_own_range_is_never_overlapped_even_when_added_after_the_plan(base):
    node = Node(base, "node")
    (a,) = allocate(["mtta"])
    first, count = subordinate_range(a.uid, RANGE)
    stale = node.plan([a])  # made before the admin's useradd below
    # The admin's own useradd gives its user an automatic range where ours would go.
    ok, text = run_tool(["useradd", "-M", "-K", f"SUB_UID_MIN={first + 1000}", "-K", f"SUB_UID_MAX={first + 200_000}",
                         "-K", "SUB_UID_COUNT=65536", "-K", f"SUB_GID_MIN={first + 1000}",
                         "-K", f"SUB_GID_MAX={first + 200_000}", "-K", "SUB_GID_COUNT=65536",
                         "--prefix", str(node.root), "adminsown"])
    assert ok, text
    admins = read_os_accounts(node.root).subuids["adminsown"]
    assert admins == ((first + 1000, 65536),)
    files_before = {f: (node.root / "etc" / f).read_text() for f in SUBID_FILES}
    report = apply_plan(stale, prefix_root=node.root)
    subuid = node.root / "etc" / "subuid"
    assert (f"tenant 'mtta': its subordinate uids {first}-{first + count - 1} overlap 'adminsown''s "
            f"{first + 1000}-{first + 1000 + 65535} in {subuid}; none added") in report.problems[0]
    assert f"usermod --del-subuids {first + 1000}-{first + 1000 + 65535} adminsown" in report.problems[0]
    assert {f: (node.root / "etc" / f).read_text() for f in SUBID_FILES} == files_before
    assert read_os_accounts(node.root).users["mtta"][:2] == (a.uid, a.gid)  # the account itself is made


def test_subordinate_ids_are_chosen_and_written_under_the_lock_the_shadow_tools_take(base):
    """While we hold ROOT/etc/subuid.lock, a real usermod waits; once we let go, it writes."""
    node = Node(base, "node")
    (a,) = allocate(["mtta"])
    assert node.apply([a]).ok
    subuid = node.root / "etc" / "subuid"
    before = subuid.read_text()
    with shadow_lock(subuid):
        usermod = subprocess.Popen(["usermod", "--add-subuids", "1500000000-1500065535", "--prefix",
                                    str(node.root), "mtta"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            usermod.wait(2.0)
        except subprocess.TimeoutExpired:
            pass
        assert usermod.poll() is None and subuid.read_text() == before  # usermod waits for our lock
    out, _ = usermod.communicate(timeout=60)
    assert usermod.returncode == 0, out
    assert read_os_accounts(node.root).subuids["mtta"][-1] == (1_500_000_000, 65_536)


def test_a_range_written_while_the_node_waits_for_the_lock_is_seen_and_not_overlapped(base):
    """A shadow tool holds ROOT/etc/subuid.lock (its pid, as they write it) and adds a range
    where the tenant's goes; the node, waiting for the lock, checks what is there once it
    has it, and refuses."""
    node = Node(base, "node")
    (a,) = allocate(["mtta"])
    first, _count = subordinate_range(a.uid, RANGE)
    plan = node.plan([a])
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    lock = node.root / "etc" / "subuid.lock"
    try:
        lock.write_bytes(f"{holder.pid}\0".encode())
        reports = []
        applying = threading.Thread(target=lambda: reports.append(apply_plan(plan, prefix_root=node.root)))
        applying.start()
        applying.join(1.0)
        assert applying.is_alive() and "mtta:" not in (node.root / "etc" / "subuid").read_text()
        node.add_subids_line(f"holders:{first + 5}:10")
        lock.unlink()
        applying.join(60)
    finally:
        holder.kill()
        holder.wait()
    assert not applying.is_alive()
    (report,) = reports
    assert any(f"overlap 'holders''s {first + 5}-{first + 14}" in p for p in report.problems), report.problems
    got = read_os_accounts(node.root)
    assert "mtta" not in got.subuids and "mtta" not in got.subgids


def test_two_running_nodes_on_one_machine_give_their_first_tenants_disjoint_ranges(base):
    """The issue's case end to end: two nodes (two clusters, two TENANT_UID_RANGEs) whose
    agents write one account database at once, each with its first tenant."""
    machine = Node(base, "machine")
    nodes = [running_node([], name=f"subids-{i}", CLUSTER_ID=f"lab-subids-{i}", ACCOUNTS_ROOT=str(machine.root),
                          TENANT_UID_RANGE=list(half), SSH_LISTEN=f"127.0.0.1:{free_port()}")
             for i, half in enumerate((HALF_A, HALF_B))]
    names = [f"mtsa{os.getpid() % 10000}", f"mtsb{os.getpid() % 10000}"]
    with nodes[0] as n0, nodes[1] as n1:
        for node, name in ((n0, names[0]), (n1, names[1])):
            join(node, name, base / f"client-{name}")

        def both_have_subids():
            accounts = read_os_accounts(machine.root)
            return accounts if all(n in accounts.subuids and n in accounts.subgids for n in names) else None

        got = wait_for("both tenants' subordinate ids", both_have_subids, 60)
        logs = n0.server_log() + n1.server_log()
    for table in (got.subuids, got.subgids):
        ((a_first, a_count),), ((b_first, b_count),) = table[names[0]], table[names[1]]
        assert a_first + a_count <= b_first or b_first + b_count <= a_first
    assert "overlap" not in logs

"""Tenant accounts on two simulated nodes with separate account databases (`--prefix ROOT`).

Each node is a temporary ROOT holding copies of the machine's passwd, group, shadow,
gshadow, subuid, subgid and login.defs (TESTING.md, "Tenant processes"): the shadow tools
edit those and never the machine's own. Homes are real directories owned by the tenants'
uids, so file modes are what is tested. Every root and home is removed at teardown.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mtgpu.accounts.apply import apply_plan, read_os_accounts, remove_account, run_tool
from mtgpu.accounts.plan import SUBID_BASE, SUBID_COUNT, TenantSpec, allocate_ids, plan_accounts

if sys.platform != "linux" or os.geteuid() != 0:
    pytest.skip("creating accounts needs Linux and root", allow_module_level=True)
for _tool in ("useradd", "groupadd", "usermod", "userdel", "groupdel"):
    if shutil.which(_tool) is None:
        pytest.skip(f"{_tool} is not installed", allow_module_level=True)

RANGE = (270_000, 279_999)
ETC_FILES = ("passwd", "group", "shadow", "gshadow", "subuid", "subgid", "login.defs")
KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAlice alice@laptop"


class Node:
    """One simulated node: its own account database (ROOT/etc) and its own home root."""

    def __init__(self, base: Path, name: str, home_root: Path | None = None):
        self.root = base / name
        (self.root / "etc").mkdir(parents=True)
        for f in ETC_FILES:
            src = Path("/etc") / f
            if src.exists():
                shutil.copy2(src, self.root / "etc" / f)
            else:
                (self.root / "etc" / f).touch()
        self.home_root = home_root or base / f"{name}-homes"

    def plan(self, tenants, layout="per-node", owner=False):
        return plan_accounts(tenants, read_os_accounts(self.root), str(self.home_root), layout, owner,
                             uid_range=RANGE)

    def apply(self, tenants, layout="per-node", owner=False):
        return apply_plan(self.plan(tenants, layout, owner), prefix_root=self.root)

    def passwd_line(self, name: str) -> str | None:
        for line in (self.root / "etc" / "passwd").read_text().splitlines():
            if line.split(":", 1)[0] == name:
                return line
        return None


@pytest.fixture
def nodes(base):
    return Node(base, "node1"), Node(base, "node2")


def allocate(names: list[str]) -> list[TenantSpec]:
    """What the replicated state does: ids allocated one by one from the same state."""
    state: dict[str, tuple[int, int]] = {}
    specs = []
    for name in names:
        uid, gid = allocate_ids(state, RANGE, set())
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
    assert read1.subuids["mtta"] == read2.subuids["mtta"] == ((SUBID_BASE, SUBID_COUNT),)
    assert read1.subgids["mttb"] == ((SUBID_BASE + SUBID_COUNT, SUBID_COUNT),)
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

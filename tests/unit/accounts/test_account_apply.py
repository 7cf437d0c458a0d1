"""accounts.apply without touching the machine: failures are reported, never raised."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from mtgpu.accounts.apply import SubIdsRefused, add_subordinate_ids, apply_plan, read_os_accounts, run_tool
from mtgpu.accounts.plan import SUBID_BASE, SUBID_COUNT, OsAccounts, TenantSpec, plan_accounts


def fake_runner(fail_on: str | None = None, stderr: str = "groupadd: GID '200000' already exists"):
    calls: list[list[str]] = []

    def run(cmd, **kwargs):
        calls.append(list(cmd))
        if fail_on is not None and cmd[0] == fail_on:
            return subprocess.CompletedProcess(cmd, 4, "", stderr)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run, calls


def test_a_failing_tool_is_reported_with_its_command_and_stderr_and_the_user_is_skipped(tmp_path):
    plan = plan_accounts([TenantSpec("alice", 200_000, 200_000)], OsAccounts(), str(tmp_path), "per-node", False)
    run, calls = fake_runner("groupadd")
    report = apply_plan(plan, prefix_root="/nonexistent-root", run=run)
    assert not report.ok
    assert any("`groupadd -g 200000 --prefix /nonexistent-root alice` failed with status 4: "
               "groupadd: GID '200000' already exists" in p for p in report.problems)
    assert "user alice not created: its group could not be created" in report.problems
    assert [c[0] for c in calls] == ["groupadd"]  # no useradd, no usermod; no home made
    assert not (tmp_path / "alice").exists()


def test_commands_are_what_the_plan_says(tmp_path):
    (tmp_path / "etc").mkdir()
    plan = plan_accounts([TenantSpec("bob", 200_001, 200_001)], OsAccounts(), "/nonexistent-homes/x",
                         "shared", False)
    run, calls = fake_runner()
    report = apply_plan(plan, prefix_root=tmp_path, run=run)
    assert calls[0] == ["groupadd", "-g", "200001", "--prefix", str(tmp_path), "bob"]
    assert calls[1][:12] == ["useradd", "-u", "200001", "-g", "200001", "-M", "-d", "/nonexistent-homes/x/bob",
                             "-s", "/bin/bash", "-p", "*"]
    assert calls[1][-3:] == ["--prefix", str(tmp_path), "bob"]
    # subordinate ids are written by the node itself, under the files' shadow lock
    assert len(calls) == 2
    for name in ("subuid", "subgid"):
        assert (tmp_path / "etc" / name).read_text() == "bob:1000065536:65536\n"
        assert not (tmp_path / "etc" / f"{name}.lock").exists()
    assert "gave bob subordinate uids and gids 1000065536-1000131071" in report.done
    # shared layout, not the owner: the home is only checked, and its absence reported
    assert any("shared home /nonexistent-homes/x/bob is missing" in p for p in report.problems)


def _etc(tmp_path, subuid: str = "", subgid: str = ""):
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "subuid").write_text(subuid)
    (etc / "subgid").write_text(subgid)
    return etc


def test_subordinate_ids_are_appended_and_every_other_line_is_kept(tmp_path):
    etc = _etc(tmp_path, "admin:100000:65536\n# a comment\nlast-without-newline:200000:10", "admin:100000:65536\n")
    os.chmod(etc / "subuid", 0o640)
    assert add_subordinate_ids("bob", SUBID_BASE, SUBID_COUNT, prefix_root=tmp_path) == ["uids", "gids"]
    assert (etc / "subuid").read_text() == ("admin:100000:65536\n# a comment\nlast-without-newline:200000:10\n"
                                            f"bob:{SUBID_BASE}:{SUBID_COUNT}\n")
    assert (etc / "subgid").read_text() == f"admin:100000:65536\nbob:{SUBID_BASE}:{SUBID_COUNT}\n"
    assert stat.S_IMODE(os.stat(etc / "subuid").st_mode) == 0o640
    assert (etc / "subuid-").read_text().startswith("admin:100000:65536\n")  # the tools' backup
    # a file where the tenant has an entry already is left as it is
    (etc / "subgid").write_text("bob:5:5\n")
    assert add_subordinate_ids("bob", SUBID_BASE, SUBID_COUNT, prefix_root=tmp_path) == []
    assert (etc / "subgid").read_text() == "bob:5:5\n"


def test_a_range_overlapping_any_owners_entry_is_refused_and_nothing_is_written(tmp_path):
    etc = _etc(tmp_path, "", f"1234:{SUBID_BASE + SUBID_COUNT - 1}:1\n")
    with pytest.raises(SubIdsRefused) as refused:
        add_subordinate_ids("bob", SUBID_BASE, SUBID_COUNT, prefix_root=tmp_path)
    (problem,) = refused.value.problems
    assert problem.startswith(f"tenant 'bob': its subordinate gids {SUBID_BASE}-{SUBID_BASE + SUBID_COUNT - 1} "
                              f"overlap '1234''s {SUBID_BASE + SUBID_COUNT - 1}-{SUBID_BASE + SUBID_COUNT - 1} "
                              f"in {etc / 'subgid'}; none added")
    assert "usermod --del-subgids" in problem and "restart mtgpu-server" in problem
    assert (etc / "subuid").read_text() == ""  # the free file is not written either
    assert not (etc / "subuid.lock").exists() and not (etc / "subgid.lock").exists()
    plan = plan_accounts([TenantSpec("bob", 200_000, 200_000)], OsAccounts(), str(tmp_path), "per-node", False)
    report = apply_plan(plan, prefix_root=tmp_path, run=fake_runner()[0])
    assert report.problems == [problem]


def test_a_missing_tool_is_a_problem_not_a_crash():
    ok, text = run_tool(["mtgpu-no-such-tool-xyz", "--help"])
    assert not ok and "is not installed" in text


def test_conflicts_of_the_plan_are_carried_into_the_report():
    plan = plan_accounts([TenantSpec("bob", 200_001, 200_001)],
                         OsAccounts(users={"bob": (1001, 1001, "/home/bob")}, groups={"bob": 1001}),
                         "/home/mtgpu", "per-node", False)
    run, calls = fake_runner()
    report = apply_plan(plan, run=run)
    assert calls == []
    assert report.problems == list(plan.conflicts)


def test_read_os_accounts_parses_passwd_group_and_subids(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n+nis::::::\nbroken\nalice:x:200000:200000::/h/alice:/bin/bash\n")
    (etc / "group").write_text("root:x:0:\nalice:x:200000:\n")
    (etc / "subuid").write_text("alice:1000000000:65536\nalice:5:10\n")
    accounts = read_os_accounts(tmp_path)
    assert accounts.users == {"root": (0, 0, "/root"), "alice": (200_000, 200_000, "/h/alice")}
    assert accounts.groups == {"root": 0, "alice": 200_000}
    assert accounts.subuids == {"alice": ((1_000_000_000, 65_536), (5, 10))}
    assert accounts.subgids == {}

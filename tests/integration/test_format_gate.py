"""The state-format gate in a live cluster (issue 29 point 1): a member of the mtgpu from
before state formats (the tree of the commit before they came, run from its own folder)
and one of this mtgpu run one cluster together, as in a rolling upgrade; a change of state format 2 (a tenant's
clusters with their servers, what `mtgpu-admin tenant assign` writes for an admin of
several clusters) is refused while the old member is in, saying why, and the same change
goes through once that member runs this mtgpu: nothing is written that a member cannot
apply, and the old member kept applying what was written meanwhile."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from mtgpu.client.errors import ClientError
from mtgpu.state import commands as C
from tests.support.cluster import member_name, running_cluster
from tests.support.node import REPO_ROOT, wait_for


def tree_before_state_formats() -> tuple[str, Path]:
    """(the commit before state formats came, a folder holding its tree)."""
    git = ["git", "-C", REPO_ROOT]
    shallow = subprocess.run([*git, "rev-parse", "--is-shallow-repository"], capture_output=True, text=True)
    if shallow.stdout.strip() == "true":  # a clone of the last commit alone: no older mtgpu to run
        pytest.skip("this clone is shallow: the test runs the mtgpu of an older commit from git "
                    "(git fetch --unshallow, or a full clone)")
    r = subprocess.run([*git, "log", "--format=%H", "-S", "STATE_FORMAT = ", "--", "mtgpu/state/commands.py"],
                       capture_output=True, text=True)
    firsts = r.stdout.split()
    if r.returncode != 0 or not firsts:
        pytest.fail(f"this checkout has no history of mtgpu/state/commands.py ({r.stderr.strip()}): the test runs an "
                    "older mtgpu from it; use a full clone (git fetch --unshallow)")
    rev = subprocess.run([*git, "rev-parse", f"{firsts[-1]}~1"], capture_output=True, text=True, check=True).stdout.strip()
    folder = Path(tempfile.mkdtemp(prefix="mtgpu-old-tree-"))
    archive = subprocess.run([*git, "archive", rev, "mtgpu"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    folder.chmod(0o755)
    return rev, folder


def quiet_log(node) -> str:
    """The member's log without the HTTP requests' lines, the last 6,000 characters."""
    lines = []
    for p in node.log_files:
        if p.exists():
            lines += [ln for ln in p.read_text(errors="replace").splitlines() if "httpx: HTTP Request" not in ln]
    return "\n".join(lines)[-6000:]


def nodes_json(node) -> list[dict]:
    r = node.admin("nodes", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_change_of_a_newer_format_waits_for_the_last_member_of_an_older_mtgpu(alice):
    rev, old = tree_before_state_formats()
    try:
        # m1 runs the mtgpu from before state formats from its first start (its own tree: cwd and
        # PYTHONPATH), as a member not upgraded yet does; m0 runs this one
        with running_cluster(2, prefixes=[[], ["env", "-C", str(old), f"PYTHONPATH={old}"]]) as cl:
            m0, m1 = cl.members
            assert Path(f"/proc/{m1.proc.pid}/cwd").resolve() == old.resolve()
            wait_for("both members registered", lambda: len(nodes_json(m0)) == 2, timeout_s=60)
            assert m0.admin("tenant", "assign", alice.name, "--share", "2").returncode == 0  # alice: a tenant
            name1 = member_name(m1)

            def old_member_known() -> bool:
                """m0 proposes knowing the floor: it leads and heard m1's report (which names
                no format), or m1 leads (its answers tell no floor: m0 then writes format 1)."""
                if member_name(cl.scheduler()) == name1:
                    return True
                return any(n["name"] == name1 and n.get("state_format") == 1 for n in nodes_json(m0))
            wait_for("m0 to know m1's format", old_member_known, timeout_s=60, interval_s=0.5)
            servers = {"lab-far": "10.9.9.9:7070"}
            with pytest.raises(ClientError) as e:
                with m0.client() as c:
                    c.assign_tenant(alice.name, ["lab-far"], servers)
            why = str(e.value)
            assert "tenant.assign.v2 is of state format 2" in why and "applies state format 1 at most" in why, why
            # what format 1 writes goes on, and the old member applies it
            r = m0.admin("tenant", "assign", alice.name, "--share", "3")
            assert r.returncode == 0, f"{r.stderr}\nm0's log:\n{quiet_log(m0)}\nm1's log:\n{quiet_log(m1)}"
            wait_for("the old member to apply the share", lambda: {t["name"]: t["share"] for t in json.loads(
                m1.admin("tenant", "list", "--json").stdout)}.get(alice.name) == 3.0, timeout_s=30)
            # m1 is upgraded: the same change goes through, on both
            m1.terminate()
            m1.prefix = []
            m1.start(timeout_s=60)
            wait_for("m1's report of this mtgpu's format", lambda: all(
                n.get("state_format") == C.STATE_FORMAT for n in nodes_json(m0)), timeout_s=60)

            last: list[str] = []

            def assigned():
                try:
                    with m0.client() as c:
                        return c.assign_tenant(alice.name, ["lab-far"], servers)
                except ClientError as e:  # the scheduler has not heard m1's new report yet, or m1 is catching up
                    assert "state format" in str(e) or "in time" in str(e), str(e)
                    last[:] = [str(e)]
                    return None
            try:
                wait_for("the change of format 2 to be taken", assigned, timeout_s=60, interval_s=0.5)
            except AssertionError as e:
                with m0.client() as c:
                    raft = c.health().get("raft")
                share = m0.admin("tenant", "assign", alice.name, "--share", "4")
                raise AssertionError(f"{e}\nthe last answer: {last}\nm0's Raft: {raft}\na change of format 1 now: "
                                     f"{share.returncode} {share.stderr.strip()}\nm0's log:\n{quiet_log(m0)}\nm1's log:\n"
                                     f"{quiet_log(m1)}") from None
            for m in (m0, m1):
                t = {t["name"]: t for t in json.loads(m.admin("tenant", "list", "--json").stdout)}[alice.name]
                assert t["servers"] == servers, (member_name(m), t)
    finally:
        shutil.rmtree(old, ignore_errors=True)

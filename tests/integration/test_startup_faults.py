"""Start-up and storage faults (issue 12): a port the node must listen on is in use (the
start stops before the node announces itself or joins a Raft group, with one line that
names the port, the process that holds it and the rule); STATE_DIR's disk is full."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess

import pytest

from tests.support.cluster import member_name, running_cluster
from tests.support.node import free_port, running_node, wait_for


@pytest.fixture()
def squatter():
    """A listening socket of this test's process, on a free port."""
    port = free_port()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    try:
        yield port
    finally:
        s.close()


def fill_disk(path, block: int) -> None:
    """Write zeros to `path` in `block`-byte writes until its filesystem is full."""
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * block)
                f.flush()
        except OSError:
            pass


def refused_start(node) -> str:
    """Start the node, expect it to exit with status 2; the output of that start."""
    node.start(wait=False)
    assert node.proc.wait(timeout=60) == 2, node.server_log()
    return node.log_files[-1].read_text(errors="replace")


def run_the_named_fix(log: str) -> None:
    """Run the fix a refused start names ("(mkdir -p ...)"), as its reader would."""
    fix = log[log.index("(mkdir -p "):].split(")", 1)[0].removeprefix("(")
    subprocess.run(["bash", "-c", fix], check=True)


def back_with_the_clusters_state(member, jid: int) -> dict:
    """Start the fixed member; job jid, completed, once the member has it again."""
    member.start(timeout_s=60)
    return wait_for("the member to have the cluster's state again",
                    lambda: (j := member.job(jid))["state"] == "completed" and j, timeout_s=60)


def test_a_taken_listen_port_stops_the_start_naming_the_port_and_its_holder(squatter):
    with running_node([], start=False, LISTEN=f"127.0.0.1:{squatter}") as node:
        log = refused_start(node)
    line = f"LISTEN = '127.0.0.1:{squatter}': port {squatter} is in use by process {os.getpid()}"
    assert line in log and "stop that process or give this node another LISTEN" in log, log
    assert log.count(line) == 1, log  # said once (it was logged and printed, both on stderr)
    assert "serving on" not in log and "Traceback" not in log, log


def test_a_taken_ssh_port_stops_the_start(squatter):
    with running_node([], start=False, SSH_LISTEN=f"127.0.0.1:{squatter}") as node:
        log = refused_start(node)
    assert f"SSH_LISTEN = '127.0.0.1:{squatter}': port {squatter} is in use by process {os.getpid()}" in log, log
    assert "serving on" not in log and "Traceback" not in log, log


def test_a_taken_raft_port_stops_a_member_before_it_joins():
    with running_cluster(1) as cl:
        member = cl.members[0]
        member.terminate()
        raft_port = member.port + 1
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", raft_port))
            s.listen()
            log = refused_start(member)
    assert f"port {raft_port} is in use by process {os.getpid()}" in log, log
    assert "Raft listens on LISTEN's port + 1" in log and "serving on" not in log, log


def test_a_full_state_disk_refuses_a_submission_clearly_and_the_node_goes_on(alice):
    """STATE_DIR on a small tmpfs the test mounts: filled up, a submission is refused with
    the reason and the fix, nothing is half-written, and once space is freed it works."""
    with running_node([], start=False) as node:
        node.state_dir.mkdir(parents=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0755", "tmpfs", str(node.state_dir)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        try:
            node.start()
            first = node.submit_json(alice, "--wrap", "echo before")["job_id"]
            assert node.wait_state(first, {"completed", "failed"})["state"] == "completed"
            filler = node.state_dir / "filler"
            fill_disk(filler, 1 << 20)
            # The journal's last page may still hold a line or two: submit until one is refused.
            accepted = []
            for _ in range(100):
                r = node.mt_job(alice, "submit", "--json", "--wrap", "echo during")
                if r.returncode != 0:
                    break
                accepted.append(json.loads(r.stdout)["job_id"])
            assert r.returncode != 0 and "No space left on device" in r.stderr and "free space" in r.stderr, r.stderr
            with node.client() as c:
                assert c.health()["ok"]  # the node goes on
            filler.unlink()
            later = node.submit_json(alice, "--wrap", "echo after")["job_id"]
            assert node.wait_state(later, {"completed", "failed"})["state"] == "completed"
            assert later == (accepted[-1] if accepted else first) + 1  # the refused one was never recorded
            node.terminate()
            node.start()  # and the journal replays cleanly: nothing torn was left in it
            assert node.job(later)["state"] == "completed"
        finally:
            node.terminate()
            subprocess.run(["umount", "-l", str(node.state_dir)], capture_output=True)


def test_a_damaged_replica_stops_a_member_naming_the_file_and_the_fix_brings_it_back(alice):
    """A member whose own copy of the replicated state is damaged (its Raft journal cut
    short) refuses to start, naming the file and the fix, instead of crashing or running
    on an empty state; after the fix it starts and has the cluster's state again."""
    with running_cluster(3) as cl:
        sched = cl.scheduler()
        victim = next(m for m in cl.members if m is not sched)
        jid = sched.submit_json(alice, "--wrap", "true")["job_id"]
        assert sched.wait_state(jid, {"completed", "failed"}, timeout_s=60)["state"] == "completed"
        victim.terminate()
        journal = victim.state_dir / "cluster" / "raft.journal"
        journal.write_bytes(journal.read_bytes()[:300])
        log = refused_start(victim)
        assert f"{journal} says its records end at byte" in log and "move this replica's files aside" in log, log
        assert "Traceback" not in log, log
        run_the_named_fix(log)
        assert not journal.exists() and (journal.parent / "damaged" / "raft.journal").exists()
        job = back_with_the_clusters_state(victim, jid)
        assert job["id"] == jid
        again = victim.submit_json(alice, "--wrap", "true")["job_id"]
        assert sched.wait_state(again, {"completed", "failed"}, timeout_s=60)["state"] == "completed"


def test_a_member_whose_state_disk_fills_stops_with_a_message_and_comes_back_whole(alice):
    """pysyncobj maps its journal into memory: on a full disk a member died of SIGBUS
    without a word. It now stops (status 2) with one line naming the disk and the fix,
    before anything torn is written; the cluster goes on; with room again it starts and
    has every entry."""
    with running_cluster(3) as cl:
        sched = cl.scheduler()
        victim = next(m for m in cl.members if m is not sched)
        victim.terminate()
        saved = cl.base / "victim-state"
        shutil.copytree(victim.state_dir, saved, symlinks=True, ignore=shutil.ignore_patterns("*.sock"))
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0755", "tmpfs", str(victim.state_dir)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        try:
            shutil.copytree(saved, victim.state_dir, symlinks=True, dirs_exist_ok=True)
            victim.start(timeout_s=60)
            fill_disk(victim.state_dir / "filler", 1 << 16)
            here = member_name(sched)
            ids = []
            for _ in range(400):  # each one is an entry in every member's journal
                ids.append(sched.submit_json(alice, "--server", here, "--wrap", "true")["job_id"])
                if victim.proc.poll() is not None:
                    break
            assert victim.proc.wait(timeout=30) == 2, victim.server_log()
            log = victim.server_log()
            # the first write the disk refuses stops it: a journal entry, the term and vote, or the jobs' lease
            assert "stopped: writing " in log or "stopped: recording the term" in log, log
            assert "No space left on device" in log and "Free space on the disk of STATE_DIR" in log, log
            assert "Bus error" not in log and "Traceback" not in log, log
            for jid in ids[-3:]:  # the others go on
                assert sched.wait_state(jid, {"completed", "failed"}, timeout_s=60)["state"] == "completed"
            (victim.state_dir / "filler").unlink()
            victim.start(timeout_s=60)
            wait_for("the member to have every entry", lambda: victim.job(ids[-1])["state"] == "completed",
                     timeout_s=60)
        finally:
            victim.terminate()
            subprocess.run(["umount", "-l", str(victim.state_dir)], capture_output=True)


# ---------------------------------------------------------------- checksums (issue 23)
ISSUE_SED = "s/echo hi 2/echo hX 2/"


def sed_i(path) -> None:
    """The issue's damage, done by sed itself; the file must hold the script once and change."""
    before = path.read_bytes()
    assert before.count(b"echo hi 2") == 1, f"{path} should hold the job's script once"
    subprocess.run(["sed", "-i", ISSUE_SED, str(path)], check=True)
    assert path.read_bytes() == before.replace(b"echo hi 2", b"echo hX 2")


def test_a_changed_journal_entry_stops_a_standalone_node_naming_it_and_is_never_replayed(alice):
    with running_node([]) as node:
        first = node.submit_json(alice, "--wrap", "echo hi 1")["job_id"]
        assert node.wait_state(first, {"completed", "failed"})["state"] == "completed"
        jid = node.submit_json(alice, "--wrap", "echo hi 2")["job_id"]
        assert node.wait_state(jid, {"completed", "failed"})["state"] == "completed"
        node.terminate()
        node.start()  # a journal without damage starts
        assert node.job(jid)["spec"]["script"].count("echo hi 2") == 1
        node.terminate()
        journal = node.state_dir / "state" / "journal.jsonl"
        sed_i(journal)
        log = refused_start(node)
        assert f"the journal {journal} has entry " in log and "(job.submit.v1) that was changed on disk" in log, log
        assert "truncate -s " in log and "restore" in log and "Traceback" not in log, log
        fix = log[log.index("truncate -s "):].split(";", 1)[0]
        subprocess.run(["bash", "-c", fix], check=True)
        node.start()  # what was before the damaged entry: the changed script never runs
        assert node.job(first)["state"] == "completed"
        with node.client() as c:
            scripts = [j["spec"]["script"] for j in c.jobs(all_tenants=True)]
        assert not any("echo hX 2" in s for s in scripts), scripts


def test_a_journal_of_the_version_before_checksums_starts_and_a_changed_snapshot_is_refused(alice):
    """A node upgraded from the version before checksums starts on its journal (no entry
    checksummed) and rewrites it as a checksummed snapshot; a change of that snapshot then
    stops the start naming it."""
    with running_node([]) as node:
        jid = node.submit_json(alice, "--wrap", "echo hi 2")["job_id"]
        assert node.wait_state(jid, {"completed", "failed"})["state"] == "completed"
        node.terminate()
        state = node.state_dir / "state"
        journal = state / "journal.jsonl"
        head = len(b'{"crc":"12345678",')  # the line the version before wrote is the rest, byte for byte
        lines = journal.read_bytes().splitlines()
        assert lines and all(x.startswith(b'{"crc":"') for x in lines)
        journal.write_bytes(b"".join(b"{" + x[head:] + b"\n" for x in lines))
        assert not (state / "snapshot.json").exists()
        node.start()
        assert node.job(jid)["state"] == "completed"
        node.terminate()
        snapshot = state / "snapshot.json"
        assert snapshot.read_bytes().startswith(b'{"crc":"'), "the old entries were rewritten with checksums"
        sed_i(snapshot)
        log = refused_start(node)
        assert f"the snapshot {snapshot} is damaged: its checksum" in log and "backup" in log, log
        assert "Traceback" not in log, log


def test_a_changed_raft_journal_entry_stops_a_member_naming_it_and_the_fix_fetches_it_whole(alice):
    with running_cluster(3) as cl:
        sched = cl.scheduler()
        victim = next(m for m in cl.members if m is not sched)
        jid = sched.submit_json(alice, "--wrap", "echo hi 2")["job_id"]
        assert sched.wait_state(jid, {"completed", "failed"}, timeout_s=60)["state"] == "completed"
        wait_for("the member to have the job's end", lambda: victim.job(jid)["state"] == "completed", timeout_s=60)
        victim.terminate()
        victim.start(timeout_s=60)  # a replica without damage starts
        victim.terminate()
        journals = sorted((victim.state_dir / "cluster").glob("raft*.journal"))
        assert len(journals) == 1, journals
        journal = journals[0]
        sed_i(journal)
        log = refused_start(victim)
        assert f"{journal} has entry " in log and "(job.submit.v1) at byte" in log and "changed on disk" in log, log
        assert "move this replica's files aside" in log and "Traceback" not in log, log
        run_the_named_fix(log)
        job = back_with_the_clusters_state(victim, jid)
        assert "echo hi 2" in job["spec"]["script"] and "echo hX 2" not in job["spec"]["script"], job


def test_a_journal_entry_of_a_newer_state_format_stops_a_standalone_node_naming_both_formats(alice, monkeypatch):
    """What a newer mtgpu wrote (issue 29 point 1) is not taken for damage, nor skipped: the
    start stops, naming the entry and both state formats, and nothing of it is applied."""
    from mtgpu.state import commands as C
    from mtgpu.state.journal import JournaledState
    with running_node([]) as node:
        jid = node.submit_json(alice, "--wrap", "echo hi")["job_id"]
        assert node.wait_state(jid, {"completed", "failed"})["state"] == "completed"
        node.terminate()
        state = node.state_dir / "state"
        this, following = C.STATE_FORMAT, C.STATE_FORMAT + 1
        monkeypatch.setattr(C, "STATE_FORMAT", following)  # this test's process as the next mtgpu, writing one
        monkeypatch.setitem(C.FORMAT_OF, C.TENANT_SEEN, following)
        js = JournaledState(state)
        tenant = next(iter(js.machine.tenants))
        assert js.apply(C.command(C.TENANT_SEEN, name=tenant, at=1.0))["ok"]
        seq = js.machine.applied
        js.close()
        log = refused_start(node)  # the node's own mtgpu: format 1
        assert f"the journal {state / 'journal.jsonl'}, entry {seq} (tenant.seen.v1)" in log, log
        assert f"is of state format {following}, and this mtgpu applies state format {this} at most" in log, log
        assert "mtgpu-setup upgrade" in log and "Traceback" not in log, log

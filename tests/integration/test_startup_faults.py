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


def test_a_taken_listen_port_stops_the_start_naming_the_port_and_its_holder(squatter):
    with running_node([], start=False, LISTEN=f"127.0.0.1:{squatter}") as node:
        log = refused_start(node)
    line = f"LISTEN = '127.0.0.1:{squatter}': port {squatter} is in use by process {os.getpid()}"
    assert line in log and "stop that process or give this node another LISTEN" in log, log
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
        fix = log[log.index("(mkdir -p "):].split(")", 1)[0].removeprefix("(")
        subprocess.run(["bash", "-c", fix], check=True)
        assert not journal.exists() and (journal.parent / "damaged" / "raft.journal").exists()
        victim.start(timeout_s=60)
        job = wait_for("the member to have the cluster's state again",
                       lambda: (j := victim.job(jid))["state"] == "completed" and j, timeout_s=60)
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

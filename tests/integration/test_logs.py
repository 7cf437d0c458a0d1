"""`mt-job logs` end to end (issue 9): the whole log byte for byte however large, its
first and last lines, from the member that ran the job or relayed from another one,
and never a cut log passed off as the whole one."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.cluster import member_name, running_cluster
from tests.support.node import PYTHON, running_node, wait_for
from tests.support.users import can_create_users

if can_create_users():
    pytest.skip(can_create_users(), allow_module_level=True)

CHUNK = 256 * 1024  # the node's and the client's chunk size (server/api/logs.py, client/logs.py)


def mt_job_bytes(node, user, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """mt-job as `user`, its stdout as bytes (the log is bytes, not text)."""
    return subprocess.run([PYTHON, "-m", "mtgpu.cli.job", *args], env=node.env_for(user.home), capture_output=True,
                          timeout=timeout_s, user=user.uid, group=user.gid, extra_groups=[], cwd=user.home)


def utf8_log(user, size_bytes: int) -> Path:
    """A file in the user's home of about `size_bytes`, lines of two-byte characters, laid
    out so that one of them straddles a chunk boundary."""
    line = ("é" * 99 + "\n").encode()  # 199 bytes
    data = line * (size_bytes // len(line))
    if data[CHUNK - 1:CHUNK + 1] != "é".encode():
        data = b"x" + data
    assert data[CHUNK - 1:CHUNK + 1] == "é".encode() and len(data) > 8 * CHUNK
    path = Path(user.home) / f"big-{size_bytes}.txt"
    path.write_bytes(data)
    os.chown(path, user.uid, user.gid)
    return path


def test_logs_prints_a_5mb_log_byte_for_byte_and_head_tail_cut_lines(alice, bob):
    with running_node([]) as node:
        big = utf8_log(alice, 5_000_000)
        jid = node.submit_json(alice, "--wrap", f"cat {big}")["job_id"]
        job = node.wait_state(jid, {"completed", "failed"})
        assert job["state"] == "completed", job
        r = mt_job_bytes(node, alice, "logs", str(jid))
        assert r.returncode == 0, r.stderr
        assert r.stdout == big.read_bytes() == Path(job["log_path"]).read_bytes()

        jid = node.submit_json(alice, "--wrap", "seq 1 10")["job_id"]
        node.wait_state(jid, "completed")
        assert mt_job_bytes(node, alice, "logs", "--tail", "3", str(jid)).stdout == b"8\n9\n10\n"
        assert mt_job_bytes(node, alice, "logs", "--head", "2", str(jid)).stdout == b"1\n2\n"
        assert mt_job_bytes(node, alice, "logs", "--tail", "0", str(jid)).stdout == b""
        assert mt_job_bytes(node, alice, "logs", "--head", "99", str(jid)).stdout == b"".join(
            b"%d\n" % i for i in range(1, 11))
        r = mt_job_bytes(node, alice, "logs", "--head", "2", "-f", str(jid))
        assert r.returncode == 2 and b"--head cannot follow" in r.stderr and r.stdout == b""
        # Another tenant's job stays no job at all.
        r = mt_job_bytes(node, bob, "logs", str(jid))
        assert r.returncode != 0 and f"no job {jid} of yours".encode() in r.stderr and r.stdout == b""


def test_tail_follow_prints_the_last_lines_then_what_the_job_writes(alice):
    with running_node([]) as node:
        go = Path(alice.home) / "go-on"
        script = f"#!/bin/bash\nseq 1 5\nwhile [ ! -e {go} ]; do sleep 0.05; done\necho after\n"
        jid = node.submit_json(alice, script=script)["job_id"]
        log = Path(node.job(jid)["log_path"])
        wait_for("the job's first lines", lambda: log.exists() and log.read_bytes() == b"1\n2\n3\n4\n5\n")
        proc = subprocess.Popen([PYTHON, "-m", "mtgpu.cli.job", "logs", "--tail", "2", "-f", str(jid)],
                                env=node.env_for(alice.home), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                user=alice.uid, group=alice.gid, extra_groups=[], cwd=alice.home)
        try:
            first = proc.stdout.read(4)  # the last two lines, printed while the job still runs
            go.touch()
            rest, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, err
        assert first + rest == b"4\n5\nafter\n"


def test_a_log_on_another_member_is_relayed_whole_and_a_down_member_is_said(alice):
    with running_cluster(3) as cl:
        reader, holder = cl.members[0], cl.members[2]
        big = utf8_log(alice, 5_000_000)
        jid = reader.submit_json(alice, script=f"#!/bin/bash\n#MTGPU server={member_name(holder)}\ncat {big}\n")["job_id"]
        job = reader.wait_state(jid, {"completed", "failed"}, timeout_s=60)
        assert job["state"] == "completed" and job["nodes"] == [member_name(holder)], job
        assert not (reader.state_dir / "logs" / str(alice.uid) / f"{jid}.log").exists()
        r = mt_job_bytes(reader, alice, "logs", str(jid))
        assert r.returncode == 0, r.stderr + reader.server_log().encode()
        assert r.stdout == big.read_bytes()
        assert mt_job_bytes(reader, alice, "logs", "--tail", "1", str(jid)).stdout == ("é" * 99 + "\n").encode()
        assert mt_job_bytes(reader, alice, "logs", "--head", "1", str(jid)).stdout == \
            big.read_bytes().split(b"\n", 1)[0] + b"\n"
        # The member holding the log is gone: say so, print nothing, exit non-zero.
        holder.kill9()
        r = mt_job_bytes(reader, alice, "logs", str(jid))
        assert r.returncode == 1 and r.stdout == b"", r
        assert f"is on member {member_name(holder)}, which could not be read".encode() in r.stderr


def test_a_relayed_log_that_breaks_off_midway_is_an_error_not_a_short_log(alice):
    """The holder dies while the log streams through another member: the reader exits 1."""
    with running_cluster(3) as cl:
        reader, holder = cl.members[0], cl.members[1]
        jid = reader.submit_json(alice, script=f"#!/bin/bash\n#MTGPU server={member_name(holder)}\n"
                                                "head -c 60000000 /dev/zero | tr '\\0' 'x'\n")["job_id"]
        assert reader.wait_state(jid, {"completed", "failed"}, timeout_s=60)["state"] == "completed"
        proc = subprocess.Popen([PYTHON, "-m", "mtgpu.cli.job", "logs", str(jid)], env=reader.env_for(alice.home),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, user=alice.uid, group=alice.gid,
                                extra_groups=[], cwd=alice.home)
        try:
            first = proc.stdout.read(CHUNK)  # the stream has begun; the rest waits on this reader
            holder.kill9()
            rest = proc.stdout.read()
            err = proc.stderr.read()
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert len(first) == CHUNK and len(first) + len(rest) < 60_000_000
        assert proc.returncode == 1 and b"broke off" in err, err

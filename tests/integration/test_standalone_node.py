"""A standalone node end to end: the real server, the real mt-job CLI run as real
users, real job processes (issue 2's "done when" list)."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from tests.support.node import running_node, wait_for
from tests.support.users import can_create_users

if can_create_users():
    pytest.skip(can_create_users(), allow_module_level=True)

RTX2 = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 2}]
RTX1 = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 1}]


@pytest.fixture(scope="module")
def node2():
    with running_node(RTX2) as node:
        yield node


def read_log(node, user, job_id) -> str:
    r = node.mt_job(user, "logs", str(job_id))
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_job_runs_as_the_submitting_user_and_sees_only_its_gpu(node2, alice):
    script = "#!/bin/bash\n#MTGPU gpus=1 name=whoami\necho uid=$(id -u) gid=$(id -g)\necho cuda=$CUDA_VISIBLE_DEVICES\necho job=$MTGPU_JOB_ID node=$MTGPU_NODE\n"
    jid = node2.submit_json(alice, script=script)["job_id"]
    job = node2.wait_state(jid, "completed")
    assert job["tenant"] == alice.name and job["exit_code"] == 0
    out = read_log(node2, alice, jid)
    assert f"uid={alice.uid} gid={alice.gid}" in out
    assert job["gpus"] and len(job["gpus"]) == 1
    assert f"cuda={job['gpus'][0]['index']}\n" in out
    assert f"job={jid} node=node-a" in out
    st = os.stat(job["log_path"])
    assert (st.st_uid, st.st_gid) == (alice.uid, alice.gid)
    assert stat.S_IMODE(st.st_mode) & 0o077 == 0


def test_cpu_only_job_sees_no_gpu(node2, alice):
    jid = node2.submit_json(alice, "--wrap", 'echo "cuda=[$CUDA_VISIBLE_DEVICES]"')["job_id"]
    node2.wait_state(jid, "completed")
    assert "cuda=[]" in read_log(node2, alice, jid)


def test_three_exclusive_jobs_on_two_gpus_two_run_one_waits_all_finish(node2, alice, tmp_path):
    flag = Path(alice.home) / "go"
    script = f"#!/bin/bash\n#MTGPU gpus=1\nwhile [ ! -e {flag} ]; do sleep 0.05; done\necho done\n"
    ids = [node2.submit_json(alice, script=script)["job_id"] for _ in range(3)]
    wait_for("two jobs running", lambda: sum(node2.job(i)["state"] == "running" for i in ids) == 2)
    time.sleep(0.5)  # give a wrong scheduler the chance to start the third
    states = [node2.job(i) for i in ids]
    assert sorted(j["state"] for j in states) == ["queued", "running", "running"]
    waiting = next(j for j in states if j["state"] == "queued")
    assert "GPU" in waiting["reason"] or "gpu" in waiting["reason"]
    used = {g["index"] for j in states if j["state"] == "running" for g in j["gpus"]}
    assert used == {0, 1}
    flag.touch()
    for i in ids:
        assert node2.wait_state(i, {"completed", "failed"})["state"] == "completed"
    flag.unlink()


def test_shared_jobs_share_a_gpu_only_where_vram_fits(alice):
    with running_node(RTX1) as node:
        flag = Path(alice.home) / "go-shared"
        script = f"#!/bin/bash\n#MTGPU gpus=1 gpu-mode=shared vram=10G\nwhile [ ! -e {flag} ]; do sleep 0.05; done\n"
        ids = [node.submit_json(alice, script=script)["job_id"] for _ in range(3)]
        wait_for("two shared jobs running", lambda: sum(node.job(i)["state"] == "running" for i in ids) == 2)
        time.sleep(0.5)
        jobs = [node.job(i) for i in ids]
        assert sorted(j["state"] for j in jobs) == ["queued", "running", "running"]
        running = [j for j in jobs if j["state"] == "running"]
        assert {g["index"] for j in running for g in j["gpus"]} == {0}
        assert all(g["mode"] == "shared" and g["vram_bytes"] == 10 * 1024**3 for j in running for g in j["gpus"])
        flag.touch()
        for i in ids:
            assert node.wait_state(i, {"completed", "failed"})["state"] == "completed"
        flag.unlink()


def test_impossible_request_exits_2_with_the_reason(node2, alice):
    r = node2.mt_job(alice, "submit", "--gpus", "h200:1", "--wrap", "true")
    assert r.returncode == 2
    assert "h200" in r.stderr and "refused" in r.stderr
    r = node2.mt_job(alice, "submit", "--gpus", "3", "--wrap", "true")
    assert r.returncode == 2 and "refused" in r.stderr


def test_a_container_job_is_refused_at_submit_never_run_natively(node2, alice, tmp_path):
    before = {j["id"] for j in json.loads(node2.mt_job(alice, "list", "--json").stdout)}
    script = "#!/bin/bash\n#MTGPU container=localhost/pytorch:2.6\necho ran natively\n"
    r = node2.mt_job(alice, "submit", "-", input=script)
    assert r.returncode == 2, r
    assert "container=localhost/pytorch:2.6" in r.stderr and "[CONTAINERS] enabled" in r.stderr
    assert "no node of this cluster runs containers" in r.stderr
    r = node2.mt_job(alice, "submit", "--container", "localhost/base", "--wrap", "true")
    assert r.returncode == 2 and "container=localhost/base" in r.stderr
    after = {j["id"] for j in json.loads(node2.mt_job(alice, "list", "--json").stdout)}
    assert after == before  # nothing was queued


def test_malformed_job_file_names_the_line_and_directive(node2, alice):
    script = "#!/bin/bash\n#MTGPU name=bad\n#MTGPU gpus=rtx4090:x\necho hi\n"
    r = node2.mt_job(alice, "submit", "-", input=script)
    assert r.returncode == 2
    assert "line 3" in r.stderr and "gpus" in r.stderr


def test_tenants_cannot_see_cancel_or_read_each_others_jobs(node2, alice, bob):
    flag = Path(alice.home) / "go-private"
    jid = node2.submit_json(alice, script=f"#!/bin/bash\necho secret-of-alice\nwhile [ ! -e {flag} ]; do sleep 0.05; done\n")["job_id"]
    job = node2.wait_state(jid, "running")
    listed = json.loads(node2.mt_job(bob, "list", "--json").stdout)
    assert jid not in [j["id"] for j in listed]
    for args in (("show", str(jid)), ("cancel", str(jid)), ("logs", str(jid))):
        r = node2.mt_job(bob, *args)
        assert r.returncode != 0 and "secret-of-alice" not in r.stdout, args
    # Nor by reading the file directly.
    wait_for("alice's log to have output", lambda: "secret" in Path(job["log_path"]).read_text())
    r = node2.run_cli("mtgpu.cli.job", bob, "--help")  # sanity: bob can run the CLI
    assert r.returncode == 0
    import subprocess

    cat = subprocess.run(["cat", job["log_path"]], user=bob.uid, group=bob.gid, extra_groups=[],
                         capture_output=True, text=True)
    assert cat.returncode != 0 and "secret" not in cat.stdout
    assert node2.job(jid)["state"] == "running"
    # The owner can cancel it; root sees everything.
    all_jobs = json.loads(node2.admin("jobs", "--json").stdout)
    assert jid in [j["id"] for j in all_jobs]
    assert node2.mt_job(alice, "cancel", str(jid)).returncode == 0
    assert node2.wait_state(jid, "cancelled")


def _processes_with_env(marker: str) -> list[int]:
    pids = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                    pids.append(int(pid))
            except OSError:
                pass
    return pids


def test_cancel_leaves_no_process_of_a_forking_job_behind(node2, alice):
    marker = f"MTGPU_TEST_MARK=fork{os.getpid()}"
    script = (
        "#!/bin/bash\n"
        f"export {marker}\n"
        "sleep 300 &\n"
        "( sleep 300 & sleep 300 ) &\n"
        "setsid bash -c 'sleep 300' &\n"
        "echo forked\n"
        "wait\n"
    )
    jid = node2.submit_json(alice, script=script)["job_id"]
    node2.wait_state(jid, "running")
    wait_for("the job's children to exist", lambda: len(_processes_with_env(marker)) >= 4)
    r = node2.mt_job(alice, "cancel", str(jid))
    assert r.returncode == 0, r.stderr
    assert node2.wait_state(jid, "cancelled")
    wait_for("every process of the cancelled job to be gone", lambda: not _processes_with_env(marker), timeout_s=15)


def test_time_limit_stops_the_job(node2, alice):
    jid = node2.submit_json(alice, "--time", "2s", "--wrap", "sleep 120")["job_id"]
    job = node2.wait_state(jid, {"failed", "completed"}, timeout_s=30)
    assert job["state"] == "failed" and "time limit" in job["reason"]


def test_exit_status_is_recorded(node2, alice):
    jid = node2.submit_json(alice, "--wrap", "exit 7")["job_id"]
    job = node2.wait_state(jid, {"failed", "completed"})
    assert job["state"] == "failed" and job["exit_code"] == 7


def test_kill_9_with_jobs_queued_loses_nothing_and_runs_nothing_twice(alice):
    with running_node(RTX1) as node:
        marks = Path(alice.home) / "marks"
        marks.mkdir()
        os.chown(marks, alice.uid, alice.gid)
        script = f"#!/bin/bash\n#MTGPU gpus=1\necho $MTGPU_JOB_ID >> {marks}/$MTGPU_JOB_ID\nsleep 0.3\n"
        ids = [node.submit_json(alice, script=script)["job_id"] for _ in range(8)]
        node.wait_state(ids[0], {"running", "completed"})
        node.kill9()
        node.start()
        for i in ids:
            assert node.wait_state(i, {"completed", "failed", "lost", "cancelled"}, timeout_s=60)["state"] == "completed"
        for i in ids:
            assert (marks / str(i)).read_text().splitlines() == [str(i)], f"job {i} ran more than once"


def test_a_running_job_is_reattached_after_kill_9(alice):
    with running_node(RTX1) as node:
        flag = Path(alice.home) / "go-reattach"
        jid = node.submit_json(alice, script=f"#!/bin/bash\nwhile [ ! -e {flag} ]; do sleep 0.05; done\nexit 3\n")["job_id"]
        node.wait_state(jid, "running")
        node.kill9()
        node.start()
        assert node.job(jid)["state"] == "running"
        flag.touch()
        job = node.wait_state(jid, {"failed", "completed", "lost"})
        assert job["state"] == "failed" and job["exit_code"] == 3
        flag.unlink()


def test_the_network_api_answers_metadata_but_never_accepts_a_job(node2):
    import httpx

    base = f"http://127.0.0.1:{node2.port}"
    assert httpx.get(f"{base}/v1/health").json()["ok"] is True
    r = httpx.post(f"{base}/v1/jobs", json={"script": "#!/bin/bash\ntouch /tmp/pwned\n"})
    assert r.status_code == 401 and r.json()["error"].startswith("refused")
    assert httpx.get(f"{base}/v1/jobs").status_code == 401


def test_limits_become_cgroup_limits_and_the_record_says_what_was_enforced(node2, alice):
    jid = node2.submit_json(alice, "--cpus", "1", "--mem", "256M", "--wrap", "true")["job_id"]
    job = node2.wait_state(jid, "completed")
    enforced = job["enforced"]
    assert "memory" in enforced and "cpu" in enforced, enforced
    assert all(isinstance(v, str) and v for v in enforced.values())


def test_measured_load_from_outside_the_scheduler_counts_for_shared_jobs(alice):
    with running_node(RTX2) as node:
        r = node.admin("simulate-load", "0", "--used", "20G", "--util", "90", "--state-dir", str(node.state_dir))
        assert r.returncode == 0, r.stderr
        wait_for("the node to measure GPU 0's load", lambda: json.loads(node.admin("nodes", "--json").stdout)[0]["gpus"][0]["vram_used_bytes"] >= 20 * 1024**3)
        jid = node.submit_json(alice, "--gpus", "1", "--gpu-mode", "shared", "--vram", "10G", "--wrap", "true")["job_id"]
        job = node.wait_state(jid, "completed")
        assert [g["index"] for g in job["gpus"]] == [1]


def test_logs_follow_streams_until_the_job_ends(node2, alice):
    jid = node2.submit_json(alice, "--wrap", "for i in 1 2 3; do echo line$i; sleep 0.2; done")["job_id"]
    r = node2.mt_job(alice, "logs", "-f", str(jid), timeout_s=30)
    assert r.returncode == 0 and r.stdout.split() == ["line1", "line2", "line3"]


def test_admin_nodes_json_shows_gpus_and_commitments(node2):
    nodes = json.loads(node2.admin("nodes", "--json").stdout)
    assert [n["name"] for n in nodes] == ["node-a"]
    assert len(nodes[0]["gpus"]) == 2 and nodes[0]["gpus"][0]["vram_total_bytes"] == 24 * 1024**3


def test_a_bad_config_stops_the_start_naming_key_value_and_allowed(tmp_path):
    import subprocess
    import sys

    cfg = tmp_path / "bad.toml"
    cfg.write_text('GPU_BACKEND = "quantum"\nLISTEN = "nowhere"\nFOO = 1\n')
    r = subprocess.run([sys.executable, "-m", "mtgpu.cli.server", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    for needle in ("GPU_BACKEND", "quantum", "LISTEN", "nowhere", "FOO"):
        assert needle in r.stderr, needle


def test_array_job_runs_every_index_and_cancel_by_array_id(node2, alice):
    res = node2.submit_json(alice, "--array", "0-3%2", "--wrap", "echo idx=$MTGPU_ARRAY_INDEX")
    ids = res["job_ids"]
    assert len(ids) == 4
    outs = set()
    for i in ids:
        node2.wait_state(i, "completed")
        outs.add(read_log(node2, alice, i).strip())
    assert outs == {"idx=0", "idx=1", "idx=2", "idx=3"}


def test_datasets_are_published_read_only_and_jobs_read_them(alice, tmp_path):
    import tempfile

    data = Path(tempfile.mkdtemp(prefix="mtgpu-data-", dir="/var/tmp"))
    try:
        (data / "train.csv").write_text("a,b\n1,2\n")
        os.chmod(data / "train.csv", 0o666)  # world-writable before the node publishes it
        os.chmod(data, 0o777)
        with running_node(RTX1, start=False, DATASETS_DIRECTORIES=[str(data)]) as node:
            node.start()
            assert stat.S_IMODE(os.stat(data / "train.csv").st_mode) & 0o022 == 0
            assert stat.S_IMODE(os.stat(data).st_mode) & 0o022 == 0
            script = (f"#!/bin/bash\ncat {data}/train.csv\n"
                      f"echo x >> {data}/train.csv && echo WROTE || echo write-refused\n"
                      f"touch {data}/new && echo CREATED || echo create-refused\n")
            jid = node.submit_json(alice, script=script)["job_id"]
            node.wait_state(jid, {"completed", "failed"})
            out = read_log(node, alice, jid)
            assert "1,2" in out and "write-refused" in out and "create-refused" in out, out
    finally:
        import shutil

        shutil.rmtree(data, ignore_errors=True)


def test_bad_requests_get_clear_errors_and_the_node_keeps_serving(node2):
    from mtgpu.client.local import ClientError

    with node2.client() as c:
        for kwargs, needle in (({"script": "#!/bin/bash\n" + "x" * (1 << 20)}, "characters"),
                               ({"script": "#!/bin/bash\ntrue\n", "workdir": "relative/dir"}, "absolute path"),
                               ({"script": "#!/bin/bash\ntrue\n", "overrides": {"array": "0-99999999"}}, "array")):
            with pytest.raises(ClientError) as e:
                c.submit(**kwargs)
            assert e.value.status == 422 and needle in str(e.value)
        with pytest.raises(ClientError) as e:
            c.retention(dry_run=True, as_of=1e30)
        assert e.value.status == 422
        assert c.health()["ok"]


def test_a_relative_workdir_is_below_where_the_job_was_submitted(node2, alice):
    sub = Path(alice.home) / "proj"
    sub.mkdir(exist_ok=True)
    os.chown(sub, alice.uid, alice.gid)
    jid = node2.submit_json(alice, "--workdir", "proj", "--wrap", "pwd")["job_id"]
    node2.wait_state(jid, "completed")
    assert read_log(node2, alice, jid).strip() == str(sub)


def test_jobs_needing_nothing_a_waiting_gpu_job_waits_for_start_past_it(alice):
    """Issue 9: a queued GPU job holds the GPU it waits for, not the whole node."""
    with running_node(RTX1) as node:
        flag = Path(alice.home) / "go-holds"
        first = node.submit_json(alice, script=f"#!/bin/bash\n#MTGPU gpus=1\nwhile [ ! -e {flag} ]; do sleep 0.05; done\n")["job_id"]
        node.wait_state(first, "running")
        second = node.submit_json(alice, "--gpus", "1", "--wrap", "true")["job_id"]
        cpu = node.submit_json(alice, "--cpus", "1", "--wrap", "echo cpu")["job_id"]
        bare = node.submit_json(alice, script="#!/bin/bash\necho bare\n")["job_id"]
        for jid in (cpu, bare):
            assert node.wait_state(jid, {"running", "completed", "failed"})["state"] != "failed"
        r = node.mt_job(alice, "show", str(second), "--json")
        assert r.returncode == 0, r.stderr
        waiting = json.loads(r.stdout)
        assert waiting["state"] == "queued", waiting
        assert "no idle GPU" in waiting["reason"] and "held" not in waiting["reason"], waiting["reason"]
        for jid in (cpu, bare):
            assert node.wait_state(jid, {"completed", "failed"})["state"] == "completed"
        flag.touch()
        for jid in (first, second):
            assert node.wait_state(jid, {"completed", "failed"})["state"] == "completed"
        flag.unlink()

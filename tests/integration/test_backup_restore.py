"""Backup and restore (issue 29 point 2, docs/INSTALL.md "Backup and restore"), with a real
node: `mtgpu-admin backup` under a stream of submissions, STATE_DIR destroyed, `mtgpu-setup
restore`, and the node started again has every job the backup held once (every one accepted
before the backup began among them), every tenant with its uid/gid, the job that ran then
requeued; a damaged file, one from a newer mtgpu and a running node are refused; a backup
restored on the founding member of a new cluster before its first start seeds that cluster."""

from __future__ import annotations

import json
import errno
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from mtgpu.state.backup import decode, encode
from tests.support.node import PYTHON, REPO_ROOT, free_port, kill_leftover_runs, running_node, wait_for
from tests.support.users import can_create_users

if can_create_users():
    pytest.skip(can_create_users(), allow_module_level=True)

RTX1 = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 1}]


def restore(backup: Path, config: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "mtgpu.cli.setup", "restore", str(backup), "--config", str(config), *extra],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)


def remove_tree(path) -> None:
    """rmtree, again while a dying run's last write (its shim's exit.json.tmp) races it."""
    deadline = time.monotonic() + 30
    while True:
        try:
            shutil.rmtree(path)
            return
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno != errno.ENOTEMPTY:
                raise
        assert time.monotonic() < deadline, f"{path} could not be removed"
        time.sleep(0.1)


def test_a_backup_taken_under_submissions_restores_every_job_once_and_every_tenant(alice, bob, tmp_path):
    backup = tmp_path / "node.backup"
    with running_node(RTX1) as node:
        ran = node.submit_json(alice, script="#!/bin/bash\n#MTGPU gpus=1\nsleep 300\n")["job_id"]
        node.wait_state(ran, "running", timeout_s=60)
        accepted: list[tuple[float, int]] = []
        stop = threading.Event()

        def stream() -> None:
            for i in range(400):
                if stop.is_set():
                    return
                who = alice if i % 2 else bob
                jid = node.submit_json(who, script=f"#!/bin/bash\n#MTGPU gpus=1\necho {i}\n")["job_id"]
                accepted.append((time.monotonic(), jid))
        t = threading.Thread(target=stream)
        t.start()
        try:
            wait_for("a few submissions accepted", lambda: len(accepted) >= 3, timeout_s=120, interval_s=0.1)
            began = time.monotonic()
            r = node.admin("backup", str(backup))
            time.sleep(0.5)
        finally:
            stop.set()
            t.join(timeout=60)
        assert r.returncode == 0, r.stderr
        assert f"written to {backup}" in r.stdout
        assert backup.stat().st_mode & 0o777 == 0o600
        doc = decode(backup.read_bytes(), str(backup))
        held = [j["id"] for j in doc["state"]["jobs"]]
        before = {jid for at, jid in accepted if at < began}
        assert before and before <= set(held), sorted(before - set(held))
        with node.client() as c:
            ids_of = {t["name"]: (t["uid"], t["gid"]) for t in c.tenants()}
        assert {alice.name, bob.name} <= set(ids_of)

        # the machine is lost: the server, the jobs' processes, all of STATE_DIR
        node.terminate()
        kill_leftover_runs(node.state_dir)
        remove_tree(node.state_dir)
        r = restore(backup, node.config_path)
        assert r.returncode == 0, r.stderr
        assert f"job {ran}: requeued" in r.stdout, r.stdout
        node.start()
        with node.client() as c:
            jobs = c.jobs(all_tenants=True)
            tenants = {t["name"]: (t["uid"], t["gid"]) for t in c.tenants()}
        ids = [j["id"] for j in jobs]
        assert len(ids) == len(set(ids)) and set(ids) == set(held)  # every job of the backup, once
        assert tenants[alice.name] == ids_of[alice.name] and tenants[bob.name] == ids_of[bob.name]
        again = node.job(ran)
        assert again["attempt"] == 1 and "restored from a backup" in again["history"][0]["outcome"], again
        new = node.submit_json(alice, script="#!/bin/bash\ntrue\n")["job_id"]
        assert new > max(held)  # ids go on from where the backup was, never reused
        node.wait_state(new, "completed", timeout_s=60)


def test_a_damaged_file_a_newer_one_and_a_running_node_are_refused(alice, tmp_path):
    backup = tmp_path / "node.backup"
    with running_node(RTX1) as node:
        node.submit_json(alice, script="#!/bin/bash\ntrue\n")
        r = node.admin("backup", str(backup))
        assert r.returncode == 0, r.stderr
        r = restore(backup, node.config_path)
        assert r.returncode == 2 and "a node runs on" in r.stderr, r.stderr
        node.terminate()
        data = backup.read_bytes()
        damaged = tmp_path / "damaged.backup"
        damaged.write_bytes(data.replace(b'"tenant":"', b'"tenanT":"', 1))
        r = restore(damaged, node.config_path, "--force")
        assert r.returncode == 2 and "damaged" in r.stderr and str(damaged) in r.stderr, r.stderr
        doc = decode(data, "x")
        newer = tmp_path / "newer.backup"
        newer.write_bytes(encode({**doc, "format_version": 99, "mtgpu_version": "9.0"}))
        r = restore(newer, node.config_path, "--force")
        assert r.returncode == 2 and "newer mtgpu (9.0" in r.stderr, r.stderr
        r = restore(backup, node.config_path)  # the node's own state is still there
        assert r.returncode == 2 and "--force" in r.stderr, r.stderr
        r = restore(backup, node.config_path, "--force")
        assert r.returncode == 0, r.stderr
        assert any(p.name.startswith("state.before-restore-") for p in node.state_dir.iterdir())
        cfg = tmp_path / "cluster.toml"
        cfg.write_text('CLUSTER_MODE = "cluster"\nCLUSTER_ID = "x"\nPEERS = ["127.0.0.1:9"]\n' + node.config_path.read_text())
        r = restore(backup, cfg, "--force")
        assert r.returncode == 2 and "a joining member takes its state from its cluster" in r.stderr, r.stderr
        assert json.loads(json.dumps(doc["summary"]))["tenants"] >= 1


def test_a_backup_seeds_a_new_cluster_with_every_job_once_and_every_tenant(alice, tmp_path):
    backup = tmp_path / "node.backup"
    script = "#!/bin/bash\n#MTGPU gpus=1\nsleep 300\n"
    with running_node(RTX1, name="old") as node:
        ran = node.submit_json(alice, script=script)["job_id"]
        node.wait_state(ran, "running", timeout_s=60)
        queued = [node.submit_json(alice, script=script)["job_id"] for _ in range(3)]
        with node.client() as c:
            uid_gid = next((t["uid"], t["gid"]) for t in c.tenants() if t["name"] == alice.name)
        r = node.admin("backup", str(backup))
        assert r.returncode == 0, r.stderr
        node.cancel_everything()
    held = {ran, *queued}
    with running_node(RTX1, name="m0", start=False, LISTEN=f"127.0.0.1:{free_port(2)}", CLUSTER_MODE="cluster",
                      CLUSTER_ID="restored-lab") as member:
        r = restore(backup, member.config_path)
        assert r.returncode == 0, r.stderr
        assert "as the seed of a new cluster" in r.stdout and f"job {ran}: requeued" in r.stdout, r.stdout
        seed = member.state_dir / "cluster-seed.json"
        assert seed.stat().st_mode & 0o777 == 0o600
        member.start()
        wait_for("the seed taken", lambda: (member.state_dir / "cluster-seed.applied.json").exists(), timeout_s=30)
        assert not seed.exists()
        assert member.server_log().count("took the seed") == 1, member.server_log()
        with member.client() as c:
            jobs = c.jobs(all_tenants=True)
            tenants = {t["name"]: (t["uid"], t["gid"]) for t in c.tenants()}
            nodes = {n["name"]: n for n in c.nodes()}
        ids = [j["id"] for j in jobs]
        assert len(ids) == len(set(ids)) and set(ids) == held  # every job of the backup, once
        assert tenants[alice.name] == uid_gid
        assert nodes["old"]["state"] == "down" and nodes["m0"]["state"] == "up", nodes
        new = member.submit_json(alice, script="#!/bin/bash\ntrue\n")["job_id"]
        assert new > max(held)
        # a second restore over the cluster's replicated state is refused, naming --force
        member.terminate()
        r = restore(backup, member.config_path)
        assert r.returncode == 2 and "replicated state already" in r.stderr and "--force" in r.stderr, r.stderr

"""Tenants end to end (issue 5): invite, join with a key, an account on first access,
SSH into a persistent tmux terminal, signed API requests, clusters, quotas."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mtgpu.client.local import ClientError
from mtgpu.client.remote import RemoteClient
from mtgpu.client.signing import generate_key_pair
from tests.support.laptop import sshd_up
from tests.support.node import free_port, running_node, wait_for
from tests.support.users import can_create_users, remove_tenant_accounts

if can_create_users():
    pytest.skip(can_create_users(), allow_module_level=True)

asyncssh = pytest.importorskip("asyncssh")
UID_RANGE = (310000, 319999)  # apart from other tests' users, so a leftover can never clash
HAVE_SSHD = shutil.which("sshd") or os.path.exists("/usr/sbin/sshd")


def remotegpu(home: Path, *args: str, binary: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtgpu.cli.remotegpu", *args], capture_output=True, text=not binary,
                          env={**os.environ, "REMOTEGPU_HOME": str(home)}, timeout=60)


def invite(node, name: str, *extra: str) -> str:
    r = node.admin("tenant", "invite", name, "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["code"]


@pytest.fixture()
def node():
    ssh_port = free_port()
    names = [f"t{os.getpid() % 10000}{k}{time.monotonic_ns() % 1000}" for k in "abcd"]
    with running_node([], parent_dir="/var/lib", CLUSTER_ID="lab-x", SSH_LISTEN=f"127.0.0.1:{ssh_port}",
                      USER_DISK_LIMIT="1M", TENANT_UID_RANGE=list(UID_RANGE)) as n:
        n.ssh_port = ssh_port
        n.names = names
        n.TENANT_HOME_ROOT = n.base / "homes"
        try:
            yield n
        finally:
            n.terminate()
            problems = remove_tenant_accounts(names, UID_RANGE)
            assert not problems, problems


def join(node, name: str, tmp_path: Path, *extra: str) -> tuple[dict, Path]:
    code = invite(node, name, *extra)
    home = tmp_path / f"client-{name}"
    r = remotegpu(home, "join", code, "--server", f"127.0.0.1:{node.port}", "--json")
    assert r.returncode == 0, r.stderr + node.server_log()
    return json.loads(r.stdout), home


def test_invite_join_gives_an_account_and_keys_work_for_the_api(node, tmp_path):
    a, b = node.names[:2]
    info_a, home_a = join(node, a, tmp_path)
    info_b, _ = join(node, b, tmp_path)
    assert info_a["uid"] != info_b["uid"] and info_a["gid"] != info_b["gid"]
    pw = wait_for(f"the account {a} and its home", lambda: os.path.isdir(pwd.getpwnam(a).pw_dir) and pwd.getpwnam(a))
    assert (pw.pw_uid, pw.pw_gid) == (info_a["uid"], info_a["gid"])
    st = os.stat(pw.pw_dir)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == pw.pw_uid
    # The second tenant can read neither the first one's home nor its jobs.
    pw_b = wait_for(f"the account {b} and its home", lambda: os.path.isdir(pwd.getpwnam(b).pw_dir) and pwd.getpwnam(b))
    secret = Path(pw.pw_dir) / "notes.txt"
    secret.write_text("private")
    os.chown(secret, pw.pw_uid, pw.pw_gid)
    peek = subprocess.run(["cat", str(secret)], user=pw_b.pw_uid, group=pw_b.pw_gid, extra_groups=[],
                          capture_output=True, text=True)
    assert peek.returncode != 0 and "private" not in peek.stdout
    r = remotegpu(home_a, "whoami", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["name"] == a, r.stderr
    # A job submitted over the signed API runs as the tenant's own account.
    job_file = tmp_path / "job.sh"
    job_file.write_text("#!/bin/bash\nid -un\n")
    r = remotegpu(home_a, "submit", str(job_file), "--json")
    assert r.returncode == 0, r.stderr
    jid = json.loads(r.stdout)["job_id"]
    assert node.wait_state(jid, {"completed", "failed"})["state"] == "completed"
    assert remotegpu(home_a, "logs", str(jid)).stdout.strip() == a
    # A log of many chunks arrives whole over the signed API, byte for byte; --head/--tail cut lines.
    job_file.write_text("#!/bin/bash\nyes \"$(printf 'é%.0s' {1..99})\" | head -n 15000\n")
    big = json.loads(remotegpu(home_a, "submit", str(job_file), "--json").stdout)["job_id"]
    log = Path(node.wait_state(big, {"completed", "failed"})["log_path"])
    line = ("é" * 99 + "\n").encode()
    assert log.read_bytes() == line * 15000
    r = remotegpu(home_a, "logs", str(big), binary=True)
    assert r.returncode == 0 and r.stdout == line * 15000, r.stderr
    assert remotegpu(home_a, "logs", "--tail", "2", str(big), binary=True).stdout == line * 2
    assert remotegpu(home_a, "logs", "--head", "1", str(big), binary=True).stdout == line
    home_b = tmp_path / f"client-{b}"
    assert jid not in [j["id"] for j in json.loads(remotegpu(home_b, "jobs", "--json").stdout)]
    assert remotegpu(home_b, "logs", str(jid)).returncode != 0
    assert remotegpu(home_b, "cancel", str(jid)).returncode != 0


def test_reused_or_guessed_codes_and_unsigned_or_wrongly_signed_requests_are_refused(node, tmp_path):
    name = node.names[2]
    code = invite(node, name)
    first = remotegpu(tmp_path / "one", "join", code, "--server", f"127.0.0.1:{node.port}")
    assert first.returncode == 0, first.stderr
    # The ssh line names the node's real sshd (what the node said at join), never placeholders.
    key = tmp_path / "one" / "id_ed25519"
    assert f"ssh with: ssh -i {key} {name}@127.0.0.1 -p {node.ssh_port}" in first.stdout, first.stdout
    again = remotegpu(tmp_path / "two", "join", code, "--server", f"127.0.0.1:{node.port}")
    assert again.returncode != 0 and "used already" in again.stderr
    guess = remotegpu(tmp_path / "three", "join", "x" * 24, "--server", f"127.0.0.1:{node.port}")
    assert guess.returncode != 0 and "unknown invite code" in guess.stderr
    import httpx

    base = f"http://127.0.0.1:{node.port}"
    assert httpx.get(f"{base}/v1/jobs", headers={"x-mtgpu-tenant": name}).status_code == 401
    assert httpx.post(f"{base}/v1/jobs", json={"script": "#!/bin/bash\ntrue\n"}).status_code == 401
    generate_key_pair(tmp_path / "other_key")
    with RemoteClient(f"127.0.0.1:{node.port}", name, tmp_path / "other_key") as wrong:
        with pytest.raises(ClientError) as e:
            wrong.jobs()
        assert e.value.status == 401 and "wrong signature" in str(e.value)


def test_a_tenant_authorized_only_for_another_cluster_cannot_see_or_submit_here(node, tmp_path):
    name = node.names[3]
    _, home = join(node, name, tmp_path, "--cluster", "lab-y")
    r = remotegpu(home, "jobs")
    assert r.returncode != 0 and "not authorized for cluster 'lab-x'" in r.stderr
    job = tmp_path / "j.sh"
    job.write_text("#!/bin/bash\ntrue\n")
    assert remotegpu(home, "submit", str(job)).returncode != 0
    # The admin assigns it to this cluster: now it may.
    assert node.admin("tenant", "assign", name, "--cluster", "lab-x").returncode == 0
    assert remotegpu(home, "jobs").returncode == 0


def test_over_the_disk_limit_a_submission_is_refused_with_the_figures(node, tmp_path):
    name = node.names[0]
    info, home = join(node, name, tmp_path)
    pw = wait_for("the account and its home", lambda: os.path.isdir(pwd.getpwnam(name).pw_dir) and pwd.getpwnam(name))
    big = Path(pw.pw_dir) / "big.bin"
    big.write_bytes(os.urandom(2 * 1024 * 1024))
    os.chown(big, pw.pw_uid, pw.pw_gid)
    job = tmp_path / "j.sh"
    job.write_text("#!/bin/bash\ntrue\n")
    r = remotegpu(home, "submit", str(job))
    assert r.returncode == 2 and "quota" in r.stderr and "USER_DISK_LIMIT" in r.stderr, r.stderr
    big.unlink()


@pytest.mark.skipif(not HAVE_SSHD, reason="openssh-server is not installed")
def test_ssh_lands_in_tmux_and_a_reconnect_shows_what_was_printed_meanwhile(node, tmp_path):
    import asyncio

    name = node.names[1]
    _, home = join(node, name, tmp_path)
    key = str(home / "id_ed25519")
    wait_for("the account", lambda: pwd.getpwnam(name))
    sshd_up(node, name)

    async def session():
        conn = await asyncssh.connect("127.0.0.1", node.ssh_port, username=name, client_keys=[key], known_hosts=None)
        proc = await conn.create_process(term_type="xterm", term_size=(120, 40))
        proc.stdin.write("echo in-tmux=$TMUX; for i in 1 2 3 4 5; do echo tick-$i; sleep 0.4; done\n")
        await asyncio.wait_for(proc.stdout.readuntil("in-tmux=/"), 15)
        conn.abort()  # the connection drops mid-output
        await asyncio.sleep(3)
        conn = await asyncssh.connect("127.0.0.1", node.ssh_port, username=name, client_keys=[key], known_hosts=None)
        proc = await conn.create_process(term_type="xterm", term_size=(120, 40))
        seen = await asyncio.wait_for(proc.stdout.readuntil("tick-5"), 15)
        # A plain command runs directly, not in tmux, and mt-job knows who we are.
        r = await conn.run("echo tmux=[$TMUX]; mt-job list --json", check=False)
        conn.close()
        return seen, r

    seen, r = asyncio.run(asyncio.wait_for(session(), 60))
    assert "tick-5" in seen
    assert "tmux=[]" in r.stdout
    if shutil.which("mt-job", path="/usr/local/bin:/usr/bin:/bin"):
        assert r.exit_status == 0 and isinstance(json.loads(r.stdout.split("\n", 1)[1]), list), r.stderr


@pytest.mark.skipif(not HAVE_SSHD, reason="openssh-server is not installed")
def test_password_and_root_logins_are_refused(node, tmp_path):
    import asyncio

    name = node.names[2]
    _, home = join(node, name, tmp_path)
    wait_for("the account", lambda: pwd.getpwnam(name))
    sshd_up(node, name)

    async def attempts():
        results = []
        for kw in ({"username": name, "password": "anything"},
                   {"username": "root", "client_keys": [str(home / "id_ed25519")]}):
            try:
                c = await asyncssh.connect("127.0.0.1", node.ssh_port, known_hosts=None, **kw)
                c.close()
                results.append("accepted")
            except (asyncssh.PermissionDenied, asyncssh.DisconnectError):
                results.append("refused")
        return results

    assert asyncio.run(attempts()) == ["refused", "refused"]


def test_retention_removes_old_jobs_and_idle_tenants_and_only_those(node, tmp_path):
    idle, busy = node.names[0], node.names[1]
    join(node, idle, tmp_path)
    _, home_busy = join(node, busy, tmp_path)
    wait_for("both accounts", lambda: pwd.getpwnam(idle) and pwd.getpwnam(busy))
    job = tmp_path / "j.sh"
    job.write_text("#!/bin/bash\necho old\n")
    old = json.loads(remotegpu(home_busy, "submit", str(job), "--json").stdout)["job_id"]
    old_job = node.wait_state(old, "completed")
    time.sleep(1.1)
    new = json.loads(remotegpu(home_busy, "submit", str(job), "--json").stdout)["job_id"]
    node.wait_state(new, "completed")
    assert Path(old_job["log_path"]).exists()
    days = 86400.0
    # At the moment the old job is exactly 30 days old: it goes, the newer one stays.
    as_of = str(old_job["ended_at"] + 30 * days)
    r = node.admin("retention", "--dry-run", "--as-of", as_of, "--json")
    assert r.returncode == 0, r.stderr
    dry = json.loads(r.stdout)
    assert [int(j["job_id"]) for j in dry["jobs"]] == [old] and dry["tenants"] == []
    assert node.job(old)["state"] == "completed"  # a dry run changes nothing
    r = node.admin("retention", "--as-of", as_of, "--json")
    assert r.returncode == 0 and not json.loads(r.stdout)["problems"], r.stdout
    with pytest.raises(ClientError):
        node.job(old)
    assert node.job(new)["state"] == "completed"
    wait_for("the old job's log to be deleted", lambda: not Path(old_job["log_path"]).exists())
    # 180 days after the idle tenant's last sign of life it goes; the busy one, whose job is newer, stays.
    tenants = {t["name"]: t for t in json.loads(node.admin("tenant", "list", "--json").stdout)}
    as_of = str(tenants[idle]["last_seen_at"] + 180 * days)
    dry = json.loads(node.admin("retention", "--dry-run", "--as-of", as_of, "--json").stdout)
    assert [t["name"] for t in dry["tenants"]] == [idle], dry
    node.admin("retention", "--as-of", as_of)
    wait_for(f"{idle}'s account to be removed", lambda: idle not in {p.pw_name for p in pwd.getpwall()})
    assert pwd.getpwnam(busy)
    names = {t["name"] for t in json.loads(node.admin("tenant", "list", "--json").stdout)}
    assert idle not in names and busy in names

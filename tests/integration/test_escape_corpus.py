"""The escape corpus (issue 24, point 3): what a tenant could try through every door the
node opens, each driven for real against one node (a real server, two tenants as real Linux
users, real rootless podman), and each refused with a clear reason or shown harmless: what
could have gone wrong is checked not to have happened (the other tenant's file unchanged and
unread, the root-owned file unchanged, no port on 0.0.0.0, no process of root's loading the
tenant's library). docs/ISOLATION.md ("Doors") maps every door to its cases here and to the
tests of the other walls (mounts, device fences, debugger capabilities, the API rules).

One node and two tenants (alice the attacker, bob the victim) serve the whole module; bob
holds a running native job, a workspace with a secret in its /tmp, and a secret file in his
home; root holds a file beside the homes. The container attempts share two containers.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from mtgpu.agent.podman.cdi import sim_device_path, spec_name
from mtgpu.agent.podman.tenant import PodmanHost
from mtgpu.client.signing import HEADER_TENANT, generate_key_pair, load_private_key, sign_headers
from tests.integration.test_workspaces import mtc, mtc_json, running
from tests.support.images import busybox_image, podman_missing
from tests.support.node import running_node, wait_for
from tests.support.tenant_api import TenantCallError, TenantSession
from tests.support.users import can_create_users, stop_node_and_remove_tenants

if can_create_users() or podman_missing():
    pytest.skip(can_create_users() or podman_missing(), allow_module_level=True)

GPUS1 = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 1}]
UID_RANGE = (370000, 379999)  # the accounts the node makes for the network tenants
SECRET = f"bob-secret-{secrets.token_hex(6)}"
ROOT_TEXT = "root's own file\n"

PRELOAD_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    char line[600], exe[256] = "", cmd[256] = "";
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k > 0) exe[k] = 0;
    int c = open("/proc/self/cmdline", O_RDONLY);
    if (c >= 0) {
        ssize_t m = read(c, cmd, sizeof cmd - 1);
        close(c);
        for (ssize_t i = 0; i < m; i++) if (!cmd[i]) cmd[i] = ' ';
    }
    char map[64] = "0 0 4294967295";   /* the uid as the host sees it: uid_map's first line */
    int u = open("/proc/self/uid_map", O_RDONLY);
    if (u >= 0) { ssize_t m = read(u, map, sizeof map - 1); close(u); if (m > 0) map[m] = 0; }
    unsigned in0 = 0, out0 = 0, count = 0;
    sscanf(map, "%u %u %u", &in0, &out0, &count);
    unsigned host = (unsigned)geteuid() - in0 + out0;
    int n = snprintf(line, sizeof line, "%u %d %s %s\n", host, (int)geteuid(), exe, cmd);
    int fd = open("MARKS", O_WRONLY | O_APPEND);   /* no O_CREAT: root's write into the file is not refused */
    if (fd >= 0) { write(fd, line, n); close(fd); }
}
"""
# tools something root runs might look up in PATH; each fake records who ran it, then runs the real one
FAKED = ("podman", "tmux", "bash", "sh", "python3", "env", "runc", "conmon", "nvidia-smi", "setsid", "kill")


def _chown_tree(user, path: Path) -> None:
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(path)], check=True)


@pytest.fixture(scope="module")
def lab(alice, bob):
    base = Path(tempfile.mkdtemp(prefix="mtgpu-escape-"))
    os.chmod(base, 0o755)
    with busybox_image() as image, running_node(GPUS1, CLUSTER_ID="lab-escape", TENANT_UID_RANGE=list(UID_RANGE),
                                                CONTAINERS={"enabled": True, "images": [image],
                                                            "templates": {"plain": image}}) as node:
        net_tenants = [f"tx{k}{os.getpid() % 1000}" for k in "ab"]
        try:
            yield _prepare(node, image, base, alice, bob, net_tenants)
        finally:
            stop_node_and_remove_tenants(node, net_tenants, UID_RANGE)
            shutil.rmtree(base, ignore_errors=True)


def _prepare(node, image, base, alice, bob, net_tenants) -> SimpleNamespace:
    wait_for("the image to be staged", lambda: image in (node.client().nodes()[0].get("containers") or {})
             .get("staged", {}), timeout_s=120)
    root_file = base / "rootfile"
    root_file.write_text(ROOT_TEXT)
    os.chmod(root_file, 0o644)
    bob_secret = Path(bob.home) / "secret.txt"
    bob_secret.write_text(SECRET + "\n")
    os.chmod(bob_secret, 0o600)
    os.chown(bob_secret, bob.uid, bob.gid)
    # what root would leave behind if it loaded alice's library or ran alice's tools
    marks = base / "marks"
    marks.mkdir(mode=0o755)
    for f in ("preload", "path"):
        (marks / f).touch()
        os.chmod(marks / f, 0o666)
    evil = Path(alice.home) / "evil"
    (evil / "bin").mkdir(parents=True)
    src = evil / "preload.c"
    src.write_text(PRELOAD_C.replace("MARKS", str(marks / "preload")))
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(evil / "preload.so"), str(src)], check=True, timeout=120)
    std_path = "/usr/sbin:/usr/bin:/sbin:/bin"
    for tool in FAKED:
        real = shutil.which(tool, path=std_path)
        if real:
            fake = evil / "bin" / tool
            record = f"$(/usr/bin/id -u) $(head -n1 /proc/self/uid_map) {tool}"
            fake.write_text(f"#!/bin/sh\necho \"{record}\" >> {marks / 'path'}\n"
                            f"exec {real} \"$@\"\n")
            fake.chmod(0o755)
    _chown_tree(alice, evil)
    # bob's running things
    bob_job = node.submit_json(bob, script=f"#!/bin/bash\n#MTGPU name=bobs\necho {SECRET}\nsleep 900\n")["job_id"]
    mtc_json(node, bob, "create", "--template", "plain", "--name", "bobws")
    bws = running(node, bob, "bobws")
    r = mtc(node, bob, "exec", "bobws", "--", "sh", "-c", f"echo {SECRET} > /tmp/bob-secret")
    assert r.returncode == 0, r.stderr
    r = node.run_cli("mtgpu.cli.podman", bob, "inspect", "--format", "{{.State.Pid}}", bws["workspace"]["container"])
    bob_pid = int(r.stdout.strip())
    assert Path(f"/proc/{bob_pid}/root/tmp/bob-secret").read_text().strip() == SECRET  # root reads it: the path is right
    gpu_dir = os.path.dirname(sim_device_path(spec_name("node-a", PodmanHost(node.state_dir).key), 0))
    return SimpleNamespace(node=node, image=image, base=base, alice=alice, bob=bob, root_file=root_file,
                           bob_secret=bob_secret, marks=marks, evil=evil, bob_job=bob_job, bob_ws=bws,
                           bob_pid=bob_pid, gpu_dir=gpu_dir, net_tenants=net_tenants, server_pid=node.proc.pid)


def _unharmed(lab) -> None:
    """What every attempt must leave as it was."""
    assert lab.bob_secret.read_text() == SECRET + "\n" and lab.bob_secret.stat().st_uid == lab.bob.uid
    assert lab.root_file.read_text() == ROOT_TEXT and lab.root_file.stat().st_nlink == 1
    assert lab.node.proc.poll() is None, "the node's server ended"
    assert lab.node.job(lab.bob_job)["state"] == "running"


def _finished(lab, script: str, *args: str) -> tuple[dict, str]:
    jid = lab.node.submit_json(lab.alice, *args, script=script)["job_id"]
    job = lab.node.wait_state(jid, {"completed", "failed", "cancelled"}, timeout_s=90)
    r = lab.node.mt_job(lab.alice, "logs", str(jid))
    return job, r.stdout


# ------------------------------------------------------------------ job files, #SBATCH output patterns
def _rel_to_bob(lab, name: str) -> str:
    return os.path.relpath(os.path.join(lab.bob.home, name), lab.alice.home)


def job_output_dotdot_into_another_home(lab):
    target = _rel_to_bob(lab, "stolen.out")
    assert target.startswith("../")
    job, _ = _finished(lab, f"#!/bin/bash\n#SBATCH -o {target}\necho pwned\n")
    assert job["state"] == "failed" and "stolen.out" in job["reason"] and "Permission denied" in job["reason"], job
    assert not (Path(lab.bob.home) / "stolen.out").exists()


def job_error_file_onto_the_nodes_config(lab):
    before = lab.node.config_path.read_bytes()
    job, _ = _finished(lab, f"#!/bin/bash\n#SBATCH -e {lab.node.config_path}\necho pwned >&2\n")
    assert job["state"] == "failed" and str(lab.node.config_path) in job["reason"], job
    assert lab.node.config_path.read_bytes() == before


def job_output_through_a_symlink_to_roots_file(lab):
    link = Path(lab.alice.home) / "root.out"
    link.symlink_to(lab.root_file)
    os.lchown(link, lab.alice.uid, lab.alice.gid)
    job, _ = _finished(lab, f"#!/bin/bash\n#SBATCH -o {link}\necho pwned\n")
    assert job["state"] == "failed" and "Permission denied" in job["reason"], job  # opened as alice: not truncated


def job_output_through_a_symlink_to_another_tenants_file(lab):
    link = Path(lab.alice.home) / "bob.out"
    link.symlink_to(lab.bob_secret)
    os.lchown(link, lab.alice.uid, lab.alice.gid)
    job, _ = _finished(lab, f"#!/bin/bash\n#SBATCH -o {link}\necho pwned\n")
    assert job["state"] == "failed" and "Permission denied" in job["reason"], job


def job_hardlink_to_roots_file_then_output_into_it(lab):
    link = Path(lab.alice.home) / "hard.out"
    job, out = _finished(lab, f"#!/bin/bash\nln {lab.root_file} {link} && echo LINKED || echo NOT-LINKED\n")
    assert "NOT-LINKED" in out and not link.exists(), out  # fs.protected_hardlinks: not alice's file
    job, _ = _finished(lab, f"#!/bin/bash\n#SBATCH -o {link}\necho pwned\n")
    assert job["state"] == "completed" and link.stat().st_uid == lab.alice.uid  # a new file of hers, nothing else


def job_name_with_dotdot_expanded_into_the_output_path(lab):
    name = f"../../../../../../../../etc/mtgpu-escape-{secrets.token_hex(3)}"
    job, _ = _finished(lab, f"#!/bin/bash\n#SBATCH -J {name}\n#SBATCH -o %x.out\necho pwned\n")
    assert job["state"] == "failed" and "Permission denied" in job["reason"], job
    assert not Path(f"/etc/{name.rsplit('/', 1)[1]}.out").exists()


def job_workdir_in_another_home(lab):
    job, out = _finished(lab, f"#!/bin/bash\n#MTGPU workdir={lab.bob.home}\ncat secret.txt\n")
    assert job["state"] == "failed" or SECRET not in out, (job, out)
    assert SECRET not in out and SECRET not in job["reason"], (job, out)


def job_reads_another_tenants_container_through_proc_pid_root(lab):
    job, out = _finished(lab, f"#!/bin/bash\ncat /proc/{lab.bob_pid}/root/tmp/bob-secret; "
                              f"cat /proc/{lab.bob_pid}/environ; ls /proc/{lab.bob_pid}/cwd/\n")
    assert SECRET not in out and out.count("Permission denied") == 3, out


def job_signals_roots_processes(lab):
    # the keeper of bob's job (root) and the server: a tenant's job may not signal either
    keeper = json.loads((lab.node.state_dir / "runs" / str(lab.bob_job) / "started.json").read_text())["pid"]
    job, out = _finished(lab, f"#!/bin/bash\nkill -STOP {lab.server_pid} {keeper}; echo rc=$?\n")
    assert "rc=1" in out and out.count("Operation not permitted") == 2, out
    assert Path(f"/proc/{lab.server_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T"


def job_export_of_ld_preload_refused(lab):
    script = f"#!/bin/bash\n#SBATCH --export=LD_PRELOAD={lab.evil}/preload.so\ntrue\n"
    r = lab.node.mt_job(lab.alice, "submit", "-", input=script)
    assert r.returncode == 2 and "--export=ALL or NONE" in r.stderr, (r.returncode, r.stderr)


JOB_ATTEMPTS = {f.__name__: f for f in (
    job_output_dotdot_into_another_home, job_error_file_onto_the_nodes_config, job_output_through_a_symlink_to_roots_file,
    job_output_through_a_symlink_to_another_tenants_file, job_hardlink_to_roots_file_then_output_into_it,
    job_name_with_dotdot_expanded_into_the_output_path, job_workdir_in_another_home,
    job_reads_another_tenants_container_through_proc_pid_root, job_signals_roots_processes,
    job_export_of_ld_preload_refused)}


@pytest.mark.parametrize("attempt", sorted(JOB_ATTEMPTS))
def test_job_file_attempt(lab, attempt):
    JOB_ATTEMPTS[attempt](lab)
    _unharmed(lab)


# ------------------------------------------------------------------ devcontainer.json and runArgs
# each is sent to the node as mt-container create --devcontainer would send it (the client
# refuses the same, tested in test_workspace_mounts and tests/unit/workspaces); the node must refuse
RUN_ARGS = {
    "privileged": (["--privileged"], "--privileged is refused"),
    "device_gpu_folder": (["--device", "GPUDIR/gpu0:/dev/g"], "--device is refused"),
    "device_cgroup_rule": (["--device-cgroup-rule", "c *:* rwm"], "--device-cgroup-rule is refused"),
    "cap_add_sys_admin": (["--cap-add", "SYS_ADMIN"], "capability SYS_ADMIN is refused"),
    "cap_add_net_admin": (["--cap-add=NET_ADMIN"], "capability NET_ADMIN is refused"),
    "cap_add_all": (["--cap-add", "ALL"], "capability ALL is refused"),
    "cap_add_admin_behind_ptrace": (["--cap-add", "SYS_PTRACE,CAP_SYS_ADMIN"], "capability CAP_SYS_ADMIN is refused"),
    "pid_host": (["--pid=host"], "--pid is refused"),
    "ipc_host": (["--ipc", "host"], "--ipc=host is refused"),
    "network_host": (["--network=host"], "--network=host is refused"),
    "net_alias_host": (["--net", "host"], "--network=host is refused"),
    "network_of_another_container": (["--network", "container:BOBCTR"], "--network=container:BOBCTR is refused"),
    "userns_host": (["--userns=host"], "--userns is refused"),
    "uts_host": (["--uts=host"], "--uts is refused"),
    "publish_on_0000": (["-p", "0.0.0.0:18080:8080"], "--publish is refused"),
    "security_opt_systempaths": (["--security-opt", "systempaths=unconfined"], "systempaths=unconfined is refused"),
    "security_opt_apparmor": (["--security-opt=apparmor=unconfined"], "apparmor=unconfined is refused"),
    "volume_etc_equals_form": (["--volume=/etc:/e"], "-v source /etc is outside your home"),
    "mount_src_alias_etc": (["--mount", "type=bind,src=/etc,dst=/e"], "bind source /etc is outside your home"),
    "mount_glob_of_gpu_nodes": (["--mount", "type=glob,src=GPUDIR/*,dst=/g"], "mount type 'glob' is not supported"),
    "env_file_shadow": (["--env-file", "/etc/shadow"], "--env-file /etc/shadow must be an absolute path in your home"),
    "env_file_symlink_to_bobs_file": (["--env-file", "HOME/bobenv"], "HOME/bobenv -> BOBSECRET"),
    "label_of_the_node": (["--label", "mtgpu.job=1"], "the mtgpu.* labels are the node's"),
    "cgroup_parent": (["--cgroup-parent=/"], "--cgroup-parent is refused"),
    "user_root": (["--user", "0"], "--user is refused"),
}


def _fill(lab, text: str) -> str:
    return (text.replace("GPUDIR", lab.gpu_dir).replace("HOME", lab.alice.home)
            .replace("BOBCTR", lab.bob_ws["workspace"]["container"]).replace("BOBSECRET", str(lab.bob_secret)))


def _devcontainer(lab, **parts) -> dict:
    return {"devcontainer": {"path": f"{lab.alice.home}/esc/.devcontainer/devcontainer.json", "image": lab.image, **parts}}


@pytest.mark.parametrize("attempt", sorted(RUN_ARGS))
def test_run_args_attempt_is_refused_naming_it(lab, attempt):
    args, why = RUN_ARGS[attempt]
    link = Path(lab.alice.home) / "bobenv"
    if not link.is_symlink():
        link.symlink_to(lab.bob_secret)
        os.lchown(link, lab.alice.uid, lab.alice.gid)
    args = [_fill(lab, a) for a in args]
    with TenantSession(lab.node.socket_path, lab.alice) as s:
        with pytest.raises(TenantCallError) as e:
            s.call("create_workspace", _devcontainer(lab, run_args=args))
        assert e.value.refused and e.value.status == 422 and _fill(lab, why) in str(e.value), str(e.value)
        assert not s.call("workspaces"), "a refused workspace was made"
    _unharmed(lab)


def test_devcontainer_json_keys_privileged_cap_add_and_security_opt_are_refused_by_the_client(lab):
    project = Path(lab.alice.home) / "keys"
    (project / ".devcontainer").mkdir(parents=True)
    (project / ".devcontainer" / "devcontainer.json").write_text(json.dumps({
        "image": lab.image, "privileged": True, "capAdd": ["NET_ADMIN"], "securityOpt": ["label=disable"]}))
    _chown_tree(lab.alice, project)
    r = mtc(lab.node, lab.alice, "create", "--devcontainer", str(project))
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    for said in ("privileged", "capability NET_ADMIN is refused", "label=disable is refused"):
        assert said in r.stderr, r.stderr
    assert not mtc_json(lab.node, lab.alice, "list")


# ------------------------------------------------------------------ names and variables
NAMES = {
    "workspace_name_oversized": ({"template": "plain", "name": "w" * 5000}, "at most 40 characters"),
    "workspace_name_with_nul": ({"template": "plain", "name": "a\0b"}, "name holds a NUL character"),
    "workspace_name_dotdot": ({"template": "plain", "name": "../../etc"}, "--name '../../etc'"),
    "workspace_name_like_a_flag": ({"template": "plain", "name": "--privileged"}, "--name '--privileged'"),
    "env_name_with_equals": (None, "the variable 'LD_PRELOAD=/x A'"),
    "env_value_with_nul": (None, "devcontainer.env.A holds a NUL character"),
    "run_arg_with_nul": (None, "devcontainer.run_args[1] holds a NUL character"),
    "mount_source_with_nul": (None, "devcontainer.mounts[0][0] holds a NUL character"),
    "env_value_oversized": (None, "devcontainer.env.BIG holds 200,000 characters"),
}


def _names_body(lab, attempt: str) -> dict:
    body, _ = NAMES[attempt]
    if body is not None:
        return body
    if attempt == "env_name_with_equals":
        return _devcontainer(lab, env={"LD_PRELOAD=/x A": "1"})
    if attempt == "env_value_with_nul":
        return _devcontainer(lab, env={"A": "x\0LD_PRELOAD=/tmp/x.so"})
    if attempt == "env_value_oversized":
        return _devcontainer(lab, env={"BIG": "v" * 200_000})
    if attempt == "mount_source_with_nul":
        return _devcontainer(lab, mounts=[[f"{lab.alice.home}/x\0/../../etc", "/e", False]])
    return _devcontainer(lab, run_args=["--hostname", "a\0--privileged"])


@pytest.mark.parametrize("attempt", sorted(NAMES))
def test_an_oversized_or_nul_laden_name_is_refused_and_the_node_carries_on(lab, attempt):
    with TenantSession(lab.node.socket_path, lab.alice) as s:
        with pytest.raises(TenantCallError) as e:
            s.call("create_workspace", _names_body(lab, attempt))
        assert e.value.status == 422 and NAMES[attempt][1] in str(e.value), str(e.value)
        assert not s.call("workspaces")
    _unharmed(lab)


@pytest.mark.parametrize("where", ["name_directive", "output_pattern", "cli_name_oversized"])
def test_a_job_name_or_output_path_with_nul_or_oversized_is_refused(lab, where):
    if where == "cli_name_oversized":
        r = lab.node.mt_job(lab.alice, "submit", "--name", "n" * 100_000, "--wrap", "true")
        assert r.returncode == 2 and "a label of 1 to 200 printable characters" in r.stderr, r.stderr
    else:
        line = "#MTGPU name=a\0b" if where == "name_directive" else "#SBATCH -o out\0/../../etc/x"
        with TenantSession(lab.node.socket_path, lab.alice) as s:
            with pytest.raises(TenantCallError) as e:
                s.call("submit", f"#!/bin/bash\n{line}\ntrue\n", {}, workdir=lab.alice.home)
            assert e.value.refused and "printable" in str(e.value), str(e.value)
    _unharmed(lab)


# ------------------------------------------------------------------ the API: another tenant's job and workspace
def test_cancelling_another_tenants_job_answers_as_for_nothing_and_it_runs_on(lab):
    with TenantSession(lab.node.socket_path, lab.alice) as s:
        with pytest.raises(TenantCallError) as e:
            s.call("cancel", lab.bob_job)
        assert e.value.status == 404, str(e.value)
    _unharmed(lab)


def test_reading_another_tenants_job_log_gives_nothing_of_it(lab):
    r = lab.node.mt_job(lab.alice, "logs", str(lab.bob_job))
    assert r.returncode != 0 and SECRET not in r.stdout + r.stderr and str(lab.bob_job) in r.stderr, r.stderr
    _unharmed(lab)


def _groups(pid: int) -> dict[str, str]:
    """{controllers: path} of a process (/proc/PID/cgroup)."""
    return {line.split(":", 2)[1]: line.split(":", 2)[2]
            for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if line.count(":") >= 2}


def test_exec_into_another_tenants_workspace_is_refused_and_joins_nothing(lab):
    r = mtc(lab.node, lab.alice, "exec", "bobws", "--", "cat", "/tmp/bob-secret")
    assert r.returncode != 0 and "no workspace 'bobws' of yours" in r.stderr and SECRET not in r.stdout, r.stderr
    r = lab.node.run_cli("mtgpu.cli.podman", lab.alice, "exec", lab.bob_ws["workspace"]["container"],
                         "cat", "/tmp/bob-secret")
    assert r.returncode != 0 and SECRET not in r.stdout and "no such container" in r.stderr, r.stderr
    # asking the node to be moved into bob's container's cgroup (what mt-podman exec NAME asks)
    # (each of the session's groups is compared whole, before and after: a substring such as "/2" for
    # job 2 matched a hash in the CI machine's own cgroup path; the node's sessions group is where a
    # tenant's session belongs, and it may be moved there)
    with TenantSession(lab.node.socket_path, lab.alice) as s:
        before = _groups(s.proc.pid)
        got = s.call("podman_env", None, lab.bob_ws["workspace"]["container"])
        after = _groups(s.proc.pid)
        moved = {k: v for k, v in after.items() if v != before.get(k) and not v.endswith("-sessions")}
        assert got["entered"] is None and not moved, (got, before, after)
    _unharmed(lab)


def test_stopping_another_tenants_workspace_by_its_name_is_refused(lab):
    r = mtc(lab.node, lab.alice, "stop", "bobws")
    assert r.returncode != 0 and "no workspace 'bobws' of yours" in r.stderr, r.stderr
    assert lab.node.job(lab.bob_ws["id"])["state"] == "running"
    _unharmed(lab)


# ------------------------------------------------------------------ the network API (LISTEN), signed requests
@pytest.fixture(scope="module")
def net(lab, tmp_path_factory):
    """Two tenants that joined over the network with their keys; one queued job of each."""
    d = tmp_path_factory.mktemp("keys")
    base = f"http://127.0.0.1:{lab.node.port}"
    keys = {}
    for name in lab.net_tenants:
        r = lab.node.admin("tenant", "invite", name, "--json")
        assert r.returncode == 0, r.stderr
        public = generate_key_pair(d / name)
        j = httpx.post(f"{base}/v1/join", json={"code": json.loads(r.stdout)["code"], "key": public}, timeout=30)
        assert j.status_code == 200, j.text
        keys[name] = load_private_key(d / name)

    def send(method, path, who, body=b"", headers=None):
        h = headers if headers is not None else sign_headers(keys[who], who, method, path, body)
        return httpx.request(method, base + path, content=body, headers={"content-type": "application/json", **h},
                             timeout=30)

    script = json.dumps({"script": "#!/bin/sh\nsleep 600\n", "overrides": {}}).encode()
    jobs = {}
    for name in lab.net_tenants:
        r = send("POST", "/v1/jobs", name, script)
        assert r.status_code == 200, r.text
        jobs[name] = r.json()["job_id"]
    return SimpleNamespace(send=send, keys=keys, jobs=jobs, a=lab.net_tenants[0], b=lab.net_tenants[1], script=script)


def _jobs_of(lab, tenant: str) -> list[dict]:
    with lab.node.client() as c:
        return [j for j in c.jobs(all_tenants=True) if j["tenant"] == tenant]


def test_network_a_signed_request_sent_to_another_path_is_refused(lab, net):
    h = sign_headers(net.keys[net.a], net.a, "POST", f"/v1/jobs/{net.jobs[net.a]}/cancel", b"")
    r = net.send("POST", f"/v1/jobs/{net.jobs[net.b]}/cancel", None, headers=h)
    assert r.status_code == 401, r.text
    assert lab.node.job(net.jobs[net.b])["state"] in ("queued", "running")


def test_network_a_signed_request_with_another_body_is_refused(lab, net):
    h = sign_headers(net.keys[net.a], net.a, "POST", "/v1/jobs", net.script)
    evil = json.dumps({"script": "#!/bin/sh\necho other\n", "overrides": {}}).encode()
    before = len(_jobs_of(lab, net.a))
    r = net.send("POST", "/v1/jobs", None, evil, headers=h)
    assert r.status_code == 401, r.text
    assert len(_jobs_of(lab, net.a)) == before


def test_network_a_request_signed_by_one_tenant_under_anothers_name_is_refused(lab, net):
    h = sign_headers(net.keys[net.a], net.a, "POST", f"/v1/jobs/{net.jobs[net.b]}/cancel", b"")
    r = net.send("POST", f"/v1/jobs/{net.jobs[net.b]}/cancel", None, headers={**h, HEADER_TENANT: net.b})
    assert r.status_code == 401, r.text
    assert lab.node.job(net.jobs[net.b])["state"] in ("queued", "running")


def test_network_a_replayed_submit_submits_once(lab, net):
    h = sign_headers(net.keys[net.a], net.a, "POST", "/v1/jobs", net.script)
    before = len(_jobs_of(lab, net.a))
    assert net.send("POST", "/v1/jobs", None, net.script, headers=h).status_code == 200
    again = net.send("POST", "/v1/jobs", None, net.script, headers=h)
    assert again.status_code == 401 and "replay" in again.text, again.text
    assert len(_jobs_of(lab, net.a)) == before + 1


def test_network_another_tenants_job_answers_as_for_nothing(lab, net):
    for method, path in (("GET", f"/v1/jobs/{net.jobs[net.b]}"), ("POST", f"/v1/jobs/{net.jobs[net.b]}/cancel")):
        assert net.send(method, path, net.a).status_code == 404, (method, path)
    assert lab.node.job(net.jobs[net.b])["state"] in ("queued", "running")


# ------------------------------------------------------------------ LD_PRELOAD and PATH into what root runs
def _marks(lab, f: str) -> list[str]:
    return (lab.marks / f).read_text().splitlines()


def _host_uid(line: str) -> int:
    """The uid as the host sees it, from 'UID INSIDE OUTSIDE COUNT TOOL' (uid_map's first line)."""
    uid, inside, outside = (int(x) for x in line.split()[:3])
    return uid - inside + outside


def test_ld_preload_and_path_set_by_a_tenant_reach_none_of_roots_processes(lab):
    """Through every door a tenant's environment passes: its job's script (which ends, so the
    keeper and the shim reap it), mt-job, mt-podman and mt-container exec (whose node moves and
    serves them as root), a workspace's containerEnv (podman started by the member)."""
    env = f"LD_PRELOAD={lab.evil}/preload.so PATH={lab.evil}/bin:/usr/bin:/bin"
    job, out = _finished(lab, f"#!/bin/bash\nexport {env}\nsh -c 'srun true; scontrol show job $MTGPU_JOB_ID' >/dev/null\n"
                              "sleep 1\n")
    assert job["state"] == "completed", (job, out)
    with TenantSession(lab.node.socket_path, lab.alice) as s:
        s.call("create_workspace", {**_devcontainer(lab, env={"LD_PRELOAD": f"{lab.evil}/preload.so",
                                                               "PATH": f"{lab.evil}/bin:/usr/bin:/bin"}), "name": "preload"})
    ws = _up(lab, "preload")
    cli_env = {**lab.node.env_for(lab.alice.home), "LD_PRELOAD": f"{lab.evil}/preload.so",
               "PATH": f"{lab.evil}/bin:/usr/bin:/bin"}
    for module, args in (("mtgpu.cli.job", ["list"]), ("mtgpu.cli.podman", ["ps"]),
                         ("mtgpu.cli.container", ["exec", "preload", "--", "true"])):
        r = subprocess.run([sys.executable, "-m", module, *args], env=cli_env, user=lab.alice.uid, group=lab.alice.gid,
                           extra_groups=[], cwd=lab.alice.home, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (module, r.stderr)
    assert mtc(lab.node, lab.alice, "rm", "preload").returncode == 0
    preload, path = _marks(lab, "preload"), _marks(lab, "path")
    # each line: the host's uid of the process (through its user namespace), its own uid, what it ran
    # the traps work: the tenant's own processes recorded themselves
    assert any(line.startswith(f"{lab.alice.uid} {lab.alice.uid} ") for line in preload) and path, (preload, path)
    assert {line.split()[0] for line in preload} == {str(lab.alice.uid)}, \
        f"a process of another uid loaded the tenant's library: {preload}"
    assert {_host_uid(line) for line in path} == {lab.alice.uid}, f"another uid ran the tenant's tools: {path}"
    assert ws["workspace"]["container"]
    _unharmed(lab)


# ------------------------------------------------------------------ the tenant's own podman, with every flag
# Rootless podman takes these from any user; what they give is the tenant's own user namespace.
PROBES = {
    "read_another_home_mounted": "cat /homes/BOB/secret.txt",
    "write_host_etc_mounted": "echo x >> /host-etc/passwd",
    "write_roots_file_mounted": "echo x > /nodebase/rootfile",
    "read_another_tenants_container_root": "cat /proc/BOBPID/root/tmp/bob-secret",
    "read_the_servers_environment": "cat /proc/SERVERPID/environ",
    "signal_the_server_from_pid_host": "kill -STOP SERVERPID",
    "mknod_a_gpu_node": "mknod /tmp/g c GPUMAJOR GPUMINOR && cat /tmp/g",
    "open_a_gpu_node_mounted": "cat /gpus/gpu0",
    "write_a_host_sysctl": "mount -o remount,rw /proc/sys; echo SWAPPINESS > /proc/sys/vm/swappiness",
}
# A simulated GPU's node fails to open even unfenced (ENXIO: no driver behind it), so these count
# as denied only when refused with EPERM, the device cgroup's answer (for mknod, the user
# namespace's may come first: a node made anyway must then be refused by the cgroup); any other
# failure is "NOT-FENCED", with what it printed on the lines before
FENCE_PROBES = {"mknod_a_gpu_node", "open_a_gpu_node_mounted"}


def _probe_line(name: str, cmd: str) -> str:
    if name not in FENCE_PROBES:
        return f"if ( {cmd} ) >/dev/null 2>&1; then echo '{name} DONE'; else echo '{name} DENIED'; fi"
    return (f"if out=$( ( {cmd} ) 2>&1 ); then echo '{name} DONE'; else case \"$out\" in "
            f"*'Operation not permitted'*) echo '{name} DENIED';; "
            f"*) echo \"$out\" | sed 's/^/    /'; echo '{name} NOT-FENCED';; esac; fi")


@pytest.fixture(scope="module")
def own_podman(lab):
    """One `mt-podman run` as alice with --privileged, --pid=host, --cap-add=ALL, seccomp and
    labels off, the host's /etc, the homes' folder, root's folder and the GPUs' device folder
    mounted: each probe prints its name and whether it was DENIED."""
    controls = "test -e /proc/SERVERPID/environ && test -r /host-etc/passwd && test -d /homes/BOB && test -e /gpus/gpu0"
    script = "; ".join(_probe_line(name, cmd) for name, cmd in {**PROBES, "controls": controls}.items())
    swappiness = Path("/proc/sys/vm/swappiness").read_text().strip()  # written back unchanged, were it allowed
    with TenantSession(lab.node.socket_path, lab.alice) as s:  # the image in alice's store, run alone too
        assert s.call("podman_env", [lab.image], None)["loaded"] == [lab.image]
    gpu0 = os.stat(os.path.join(lab.gpu_dir, "gpu0")).st_rdev  # the simulated GPU's own numbers
    script = (script.replace("GPUMAJOR", str(os.major(gpu0))).replace("GPUMINOR", str(os.minor(gpu0)))
              .replace("BOBPID", str(lab.bob_pid)).replace("SERVERPID", str(lab.server_pid))
              .replace("BOB", os.path.basename(lab.bob.home)).replace("SWAPPINESS", swappiness))
    r = lab.node.run_cli("mtgpu.cli.podman", lab.alice, "run", "--rm", "--pull=never", "--privileged", "--pid=host",
                         "--cap-add=ALL", "--security-opt", "seccomp=unconfined", "--security-opt", "label=disable",
                         "--userns=host", "--network=none", "-v", "/etc:/host-etc",
                         "-v", f"{os.path.dirname(lab.bob.home)}:/homes",
                         "-v", f"{lab.base}:/nodebase", "-v", f"{lab.gpu_dir}:/gpus", lab.image, "sh", "-c", script,
                         timeout_s=180)
    assert r.returncode == 0 and "open_a_gpu_node_mounted" in r.stdout, (r.returncode, r.stdout, r.stderr)
    # the probes were not denied for want of what they aim at: the flags took effect
    assert "controls DONE" in r.stdout, r.stdout
    said = dict(line.rsplit(" ", 1) for line in r.stdout.splitlines()
                if line.endswith(("DONE", "DENIED", "NOT-FENCED")))
    return {**said, "output": r.stdout}


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_own_podman_with_every_flag_reaches_nothing_outside_the_tenant(lab, own_podman, probe):
    assert own_podman[probe] == "DENIED", own_podman["output"]
    _unharmed(lab)


def test_own_podman_cannot_publish_a_privileged_port(lab):
    r = lab.node.run_cli("mtgpu.cli.podman", lab.alice, "run", "--rm", "--pull=never", "-p", "0.0.0.0:81:8080",
                         lab.image, "true", timeout_s=120)
    assert r.returncode != 0 and "81" in r.stderr, (r.stdout, r.stderr)
    assert not [s for s in _listening() if s[1] == 81 and s[2] == lab.alice.uid]


def _up(lab, name: str) -> dict:
    def up():
        ws = lab.node.workspace_of(lab.alice.name, name)  # as `mt-container show --json NAME` says it
        assert ws is not None and ws["state"] in ("queued", "running"), ws and (ws["state"], ws["reason"])
        return ws if ws["state"] == "running" and ws["workspace"]["container"] else None
    return wait_for(f"workspace {name} to run", up, timeout_s=90, interval_s=0.3)


def _listening() -> list[tuple[str, int, int]]:
    """(address, port, uid) of every TCP socket listening in this network namespace."""
    out = []
    for f, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(f).read_text().splitlines()[1:]:
            cols = line.split()
            addr, port = cols[1].split(":")
            if cols[3] == "0A":
                out.append((addr, int(port, 16), int(cols[7])))
    return out


# ------------------------------------------------------------------ a workspace's port
def test_a_workspace_port_is_published_on_loopback_only(lab):
    with TenantSession(lab.node.socket_path, lab.alice) as s:
        s.call("create_workspace", {**_devcontainer(lab, ports=[8080]),
                                    "name": "ports"})
    ws = _up(lab, "ports")
    try:
        host_port = ws["workspace"]["ports"][0]["host_port"]
        # the port listens a moment after the container runs (podman's port forwarder)
        bound = wait_for(f"port {host_port} to listen", lambda: [(a, p) for a, p, _ in _listening() if p == host_port],
                         timeout_s=30, interval_s=0.2)
        assert all(a == "0100007F" for a, _ in bound), bound  # 127.0.0.1, never 0.0.0.0 or ::
    finally:
        mtc(lab.node, lab.alice, "rm", "ports")
    _unharmed(lab)

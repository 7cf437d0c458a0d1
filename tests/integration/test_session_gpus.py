"""GPUs only through a reservation, for sessions too (issue 25): a tenant logged in over real
SSH (the node's own sshd on a loopback port, the real login wrapper, real tmux) opens no
GPU; a login adopted by one of its running jobs (`SetEnv MTGPU_JOB=ID`), or a session that
runs `mt-job attach ID`, opens exactly that job's GPUs, sees its CUDA_VISIBLE_DEVICES and
is measured as the job's by the GPU telemetry; `mt-job gpus` shows what the session can
open; with SESSION_GPUS = "all" a plain session opens every GPU. Simulated GPUs have real
device nodes of their own: opening one gives ENXIO (no driver), a fenced one EPERM.

The sessions group's fence, its lifting by SESSION_GPUS = "all" and the joining of a job's
group are also checked on the machine's cgroups directly: v1 here, and v2 on its cgroup2
hierarchy (/sys/fs/cgroup/unified), with a device eBPF program."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from mtgpu.agent.podman.cdi import sim_device_path, spec_name
from mtgpu.agent.podman.tenant import PodmanHost
from mtgpu.agent.runners.cgroups import SESSIONS_SUFFIX, CgroupManager
from tests.integration.test_device_bpf import cgroup2_mount, free_local_major, remove_cgroup_tree
from tests.support.laptop import invite_and_join
from tests.support.node import PYTHON, REPO_ROOT, free_port, running_node, wait_for
from tests.support.users import can_create_users, stop_node_and_remove_tenants

GPUS2 = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 2}]
UID_RANGE = (470000, 474999)  # its own: the accounts these nodes make never meet another test's
OPEN_UID_RANGE = (475000, 479999)
WS_UID_RANGE = (485000, 489999)
PROBE = """import errno, os, sys
out = []
for i, path in enumerate(sys.argv[1:]):
    try:
        os.close(os.open(path, os.O_RDONLY))
        out.append(f"gpu{i}=opened")
    except OSError as e:
        out.append(f"gpu{i}={errno.errorcode[e.errno]}")
print("OPENS", " ".join(out), "CVD=" + os.environ.get("CUDA_VISIBLE_DEVICES", "unset"), flush=True)
"""
OPENS_RE = re.compile(r"OPENS gpu0=(\w+) gpu1=(\w+) CVD=(\S+)")
# this checkout's CLI, as the session gets it from the node's sshd (MTGPU_PYTHON, MTGPU_PKG_ROOT)
MT_JOB = 'PYTHONPATH="$MTGPU_PKG_ROOT" "$MTGPU_PYTHON" -m mtgpu.cli.job'


def _why_no_ssh() -> str | None:
    return can_create_users() or (
        None if (shutil.which("sshd") or os.path.exists("/usr/sbin/sshd")) and shutil.which("tmux") else
        "openssh-server and tmux are needed")


def ssh_node(uid_range, name: str, **settings):
    """A node with two simulated GPUs and its tenant sshd on loopback, one tenant joined
    from a 'laptop' (its key), and a world-readable probe script; removed afterwards."""
    import contextlib

    @contextlib.contextmanager
    def made():
        why = _why_no_ssh()
        if why:
            pytest.skip(why)
        asyncssh = pytest.importorskip("asyncssh")
        ssh_port = free_port()
        laptop = Path(tempfile.mkdtemp(prefix="mtgpu-sg-laptop-"))
        with running_node(GPUS2, parent_dir="/var/lib", CLUSTER_ID="lab-sg", SSH_LISTEN=f"127.0.0.1:{ssh_port}",
                          TENANT_UID_RANGE=list(uid_range), GPU_POLICY={"vram_grace": "2s"}, **settings) as n:
            try:
                pw = invite_and_join(n, name, laptop)
                probe = n.base / "probe.py"
                probe.write_text(PROBE)
                probe.chmod(0o644)
                sim = spec_name("node-a", PodmanHost(n.state_dir).key)
                paths = [sim_device_path(sim, i) for i in range(2)]
                yield SimpleNamespace(node=n, ssh_port=ssh_port, key=str(laptop / "id_ed25519"), asyncssh=asyncssh,
                                      user=SimpleNamespace(uid=pw.pw_uid, gid=pw.pw_gid, home=pw.pw_dir, name=name),
                                      probe=f"python3 {probe} {' '.join(paths)}", paths=paths)
            finally:
                stop_node_and_remove_tenants(n, [name], uid_range)
                shutil.rmtree(laptop, ignore_errors=True)
    return made()


@pytest.fixture(scope="module")
def lab():
    with ssh_node(UID_RANGE, f"sg{os.getpid() % 10000}") as made:
        yield made


def ssh(lab, *steps, timeout_s: float = 120):
    """Run `steps` (each: (command, env) for conn.run) in one SSH connection as the tenant."""
    async def go():
        conn = await lab.asyncssh.connect("127.0.0.1", lab.ssh_port, username=lab.user.name,
                                          client_keys=[lab.key], known_hosts=None)
        try:
            return [await conn.run(cmd, env=env or {}, check=False) for cmd, env in steps]
        finally:
            conn.close()
    return asyncio.run(asyncio.wait_for(go(), timeout_s))


def opens(result) -> tuple[str, str, str]:
    m = OPENS_RE.search(result.stdout)
    assert m, (result.exit_status, result.stdout, result.stderr)
    return m.groups()


def running_job(lab, *args: str, script: str = "#!/bin/bash\nsleep 600\n") -> tuple[int, int]:
    """A job of the tenant's, running: (its id, its GPU's index)."""
    jid = lab.node.submit_json(lab.user, *args, script=script)["job_id"]
    job = lab.node.wait_state(jid, "running", timeout_s=60)
    return jid, job["gpus"][0]["index"]


def expected(mine: int) -> tuple[str, str]:
    return ("ENXIO", "EPERM") if mine == 0 else ("EPERM", "ENXIO")


def test_a_plain_ssh_session_opens_no_gpu_and_sees_none(lab):
    plain, view = ssh(lab, (lab.probe, None), (f"{MT_JOB} gpus --json", None))
    assert opens(plain)[:2] == ("EPERM", "EPERM")
    assert view.exit_status == 0 and json.loads(view.stdout) == [], (view.stdout, view.stderr)


def test_an_ssh_login_with_mtgpu_job_opens_exactly_that_jobs_gpu_in_a_command_and_in_tmux(lab):
    jid, mine = running_job(lab, "--gpus", "1")
    try:
        command, view, plain = ssh(lab, (lab.probe, {"MTGPU_JOB": str(jid)}),
                                   (f"{MT_JOB} gpus --json", {"MTGPU_JOB": str(jid)}), (lab.probe, None))
        assert opens(command) == (*expected(mine), str(mine))  # its GPU only, and the job's visibility variable
        assert [(g["index"], g["your_jobs"]) for g in json.loads(view.stdout)] == [(mine, [jid])], view.stdout
        assert opens(plain)[:2] == ("EPERM", "EPERM")  # the same tenant's next plain command: none again

        async def terminal():
            conn = await lab.asyncssh.connect("127.0.0.1", lab.ssh_port, username=lab.user.name,
                                              client_keys=[lab.key], known_hosts=None)
            try:
                proc = await conn.create_process(term_type="xterm", term_size=(160, 40), env={"MTGPU_JOB": str(jid)})
                await asyncio.wait_for(proc.stdout.readuntil(f"attached to job {jid}"), 60)
                proc.stdin.write(lab.probe + "\n")
                seen = ""
                while not OPENS_RE.search(seen):
                    seen += await asyncio.wait_for(proc.stdout.read(4096), 60)
                sessions = await conn.run("tmux list-sessions -F '#S'", check=False)
                return OPENS_RE.search(seen).groups(), sessions.stdout.split()
            finally:
                conn.close()

        in_tmux, sessions = asyncio.run(asyncio.wait_for(terminal(), 120))
        assert in_tmux == (*expected(mine), str(mine))
        assert f"job-{jid}" in sessions, sessions  # a persistent terminal, as a workspace's ws-NAME
    finally:
        lab.node.mt_job(lab.user, "cancel", str(jid))
    lab.node.wait_state(jid, "cancelled", timeout_s=60)


def test_mt_job_attach_in_a_plain_session_opens_that_jobs_gpu_and_refuses_what_is_not_its_to_join(lab):
    jid, mine = running_job(lab, "--gpus", "1")
    try:
        attached, bad = ssh(lab, (f"{MT_JOB} attach {jid} -- {lab.probe}", None),
                            (f"{MT_JOB} attach 999999 -- true", None))
        assert opens(attached) == (*expected(mine), str(mine))
        assert bad.exit_status != 0 and "no job 999999 of yours" in bad.stderr, bad.stderr

        async def refused_terminal():  # in tmux the refusal stays on the pane until Enter
            conn = await lab.asyncssh.connect("127.0.0.1", lab.ssh_port, username=lab.user.name,
                                              client_keys=[lab.key], known_hosts=None)
            try:
                proc = await conn.create_process(term_type="xterm", term_size=(160, 40), env={"MTGPU_JOB": "999999"})
                seen = await asyncio.wait_for(proc.stdout.readuntil("press Enter to close"), 60)
                proc.stdin.write("\n")
                await asyncio.wait_for(proc.wait(), 60)  # the pane closed, and with it the login
                return seen
            finally:
                conn.close()

        assert "no job 999999 of yours" in asyncio.run(asyncio.wait_for(refused_terminal(), 120))
    finally:
        lab.node.mt_job(lab.user, "cancel", str(jid))
    lab.node.wait_state(jid, "cancelled", timeout_s=60)
    ended = ssh(lab, (f"{MT_JOB} attach {jid} -- true", None))[0]
    assert ended.exit_status != 0 and f"job {jid} is cancelled: only a running job can be attached to" in ended.stderr


def test_vram_an_attached_session_uses_counts_as_the_jobs_and_the_session_ends_with_the_job(lab):
    """The telemetry's per-process figures are the job's through its cgroup: an attached
    process above the job's VRAM reservation gets the job stopped, with the figures."""
    from mtgpu.agent.telemetry.simulated import default_override_path, write_simulated_load

    jid, mine = running_job(lab, "--gpus", "1", "--gpu-mode", "shared", "--vram", "8G")
    pid_file = Path(lab.user.home) / f"attached-{jid}"
    session = subprocess.Popen(
        [sys.executable, "-m", "mtgpu.cli.job", "attach", str(jid), "--", "sh", "-c",
         f"echo $$ > {pid_file}; exec sleep 600"],
        env=lab.node.env_for(lab.user.home), user=lab.user.uid, group=lab.user.gid, extra_groups=[],
        cwd=lab.user.home, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        pid = int(wait_for("the attached session's pid", lambda: pid_file.exists() and pid_file.read_text().strip(),
                           timeout_s=60))
        write_simulated_load(default_override_path(lab.node.state_dir), mine, processes=[
            {"pid": pid, "used_vram_bytes": 12 << 30, "name": "attached"}])
        job = lab.node.wait_state(jid, {"completed", "failed", "cancelled"}, timeout_s=60)
        assert job["state"] == "failed", job
        assert job["reason"].startswith(f"used 12G of VRAM on GPU {mine}, above the 8G it reserved"), job["reason"]
        wait_for("the attached session to end with its job", lambda: session.poll() is not None, timeout_s=30)
    finally:
        write_simulated_load(default_override_path(lab.node.state_dir), mine, processes=[])
        if session.poll() is None:
            os.killpg(session.pid, signal.SIGKILL)
        session.communicate(timeout=30)
        pid_file.unlink(missing_ok=True)


# what a tenant runs to use podman itself, with the settings mt-podman would give it, but
# without telling the node which container it will exec into
PODMAN_ENV = """from mtgpu.client.local import LocalClient
import shlex
with LocalClient() as c:
    print(" ".join(f"export {k}={shlex.quote(v)}" for k, v in c.podman_env()["env"].items() if k != "HOME"))
"""


@pytest.fixture(scope="module")
def wslab():
    """A node as `lab`'s with containers on, a running workspace of its tenant's holding one
    GPU (its container sleeps), and each GPU's device node again, with a stray one, in the
    tenant's home, which the workspace has mounted (test_container_devices' copies)."""
    # imported here: that module skips itself where podman or cgroups are missing, as this fixture must
    from tests.integration import test_container_devices as cd
    from tests.support.images import busybox_image

    with busybox_image() as image, ssh_node(
            WS_UID_RANGE, f"sw{os.getpid() % 10000}",
            CONTAINERS={"enabled": True, "images": [image],
                        "templates": {"holder": {"image": image, "command": "exec sleep 3600"}}}) as made:
        wait_for("the image to be staged", lambda: image in cd._staged(made.node), timeout_s=120)
        podman_env = made.node.base / "podman_env.py"
        podman_env.write_text(PODMAN_ENV)
        podman_env.chmod(0o644)
        with cd.gpu_node_copies(made.node, made.user.home) as folder:
            r = made.node.run_cli("mtgpu.cli.container", made.user, "create", "--template", "holder", "--gpus", "1",
                                  "--name", "held", "--json", timeout_s=180)
            assert r.returncode == 0, (r.stdout, r.stderr, made.node.server_log()[-3000:])
            ws = json.loads(r.stdout)
            try:
                assert ws["state"] == "running", (ws["state"], ws["reason"])
                raw_env = f'eval "$(PYTHONPATH="$MTGPU_PKG_ROOT" "$MTGPU_PYTHON" {podman_env})"'
                yield SimpleNamespace(lab=made, ws=ws, mine=ws["gpus"][0]["index"], opens=cd.opens,
                                      open_all=cd.OPEN_ALL.format(folder=folder), raw_podman_env=raw_env)
            finally:
                made.node.run_cli("mtgpu.cli.container", made.user, "rm", "held", timeout_s=120)


def test_an_ssh_login_with_mtgpu_workspace_opens_its_gpu_and_is_denied_the_other(wslab):
    """`ssh -o SetEnv=MTGPU_WORKSPACE=NAME` (issue 25, point 1): the command runs in the
    workspace's container and cgroup, whose allow-list holds its one GPU: its own node opens
    (ENXIO: past the fence, no driver), the other GPU's and a stray node are denied (EPERM).
    The same tenant's plain login next to it opens neither GPU."""
    inside, plain = ssh(wslab.lab, (wslab.open_all, {"MTGPU_WORKSPACE": "held"}), (wslab.open_all, None))
    mine = wslab.mine
    assert wslab.opens(inside.stdout + inside.stderr) == {mine: "ENXIO", 1 - mine: "EPERM", "stray": "EPERM"}, \
        (inside.exit_status, inside.stdout, inside.stderr)
    assert wslab.opens(plain.stdout + plain.stderr) == {0: "EPERM", 1: "EPERM", "stray": "ENXIO"}, plain.stdout


def test_a_raw_podman_exec_from_a_plain_ssh_session_into_the_workspace_gets_no_gpu(wslab):
    """`podman exec` itself (not mt-podman: the node is not asked to move it) starts its
    process in the caller's cgroup, here the sessions group, which holds no GPU: not even
    the workspace's own (EPERM on both), whatever the container may open."""
    container = wslab.ws["workspace"]["container"]
    raw, = ssh(wslab.lab, (f"{wslab.raw_podman_env}; podman exec {container} sh -c '{wslab.open_all}'", None))
    assert raw.exit_status == 0, (raw.stdout, raw.stderr)
    assert wslab.opens(raw.stdout + raw.stderr) == {0: "EPERM", 1: "EPERM", "stray": "ENXIO"}, \
        (raw.stdout, raw.stderr)


def test_mt_job_gpus_in_a_jobs_own_script_shows_exactly_its_gpus(lab):
    """Run by a native job's script (no SSH session around it): its one GPU, held by it; a job
    without a GPU sees none."""
    view = (f"MTGPU_SOCKET={lab.node.socket_path} PYTHONPATH={REPO_ROOT} {PYTHON} -m mtgpu.cli.job gpus --json"
            " > $HOME/gpus-$MTGPU_JOB_ID.json")
    one = lab.node.submit_json(lab.user, "--gpus", "1", script=f"#!/bin/bash\n{view}\n")["job_id"]
    none = lab.node.submit_json(lab.user, script=f"#!/bin/bash\n{view}\n")["job_id"]
    seen = {}
    try:
        for jid in (one, none):
            job = lab.node.wait_state(jid, {"completed", "failed"}, timeout_s=90)
            assert job["state"] == "completed", (job["reason"], lab.node.mt_job(lab.user, "logs", str(jid)).stdout)
            seen[jid] = (job["gpus"], json.loads((Path(lab.user.home) / f"gpus-{jid}.json").read_text()))
    finally:
        for jid in (one, none):
            (Path(lab.user.home) / f"gpus-{jid}.json").unlink(missing_ok=True)
    (held,), shown = seen[one]
    assert [(g["index"], g["your_jobs"]) for g in shown] == [(held["index"], [one])], shown
    assert seen[none] == ([], []), seen[none]


def test_with_session_gpus_all_a_plain_ssh_session_opens_every_gpu():
    with ssh_node(OPEN_UID_RANGE, f"so{os.getpid() % 10000}", SESSION_GPUS="all") as open_lab:
        plain, view = ssh(open_lab, (open_lab.probe, None), (f"{MT_JOB} gpus --json", None))
        assert opens(plain)[:2] == ("ENXIO", "ENXIO")
        assert [g["index"] for g in json.loads(view.stdout)] == [0, 1], view.stdout
        assert "SESSION_GPUS" in open_lab.node.server_log()  # the node warns about it at start


# -- the cgroups themselves: v1 here, v2 on the machine's cgroup2 hierarchy ------------------

class Probe:
    """A device node no driver holds (ENXIO when let through, EPERM when fenced), and child
    processes that open it from a given cgroup (moved there before they try); all removed
    afterwards, children first."""

    def __init__(self):
        base = tempfile.gettempdir()
        if os.statvfs(base).f_flag & os.ST_NODEV:
            base = "/dev"
        self.dir = tempfile.mkdtemp(prefix="mtgpu-test-sessions-", dir=base)
        self.path = os.path.join(self.dir, "gpu")
        self.rule = ("c", free_local_major(), 4711)
        os.mknod(self.path, 0o666 | stat.S_IFCHR, os.makedev(self.rule[1], self.rule[2]))
        self.children: list[subprocess.Popen] = []

    def sleeper(self) -> int:
        child = subprocess.Popen(["sleep", "600"])
        self.children.append(child)
        return child.pid

    def open_from(self, procs_files: list[str]) -> str:
        code = ("import errno, os, sys; sys.stdin.readline()\ntry:\n os.close(os.open(sys.argv[1], os.O_RDONLY)); "
                "print('opened')\nexcept OSError as e:\n print(errno.errorcode[e.errno])")
        child = subprocess.Popen([sys.executable, "-I", "-c", code, self.path], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        self.children.append(child)
        for f in procs_files:
            with open(f, "w") as fh:
                fh.write(str(child.pid))
        out, _ = child.communicate("go\n", timeout=60)
        return out.strip()

    def close(self):
        for child in self.children:
            if child.poll() is None:
                child.kill()
                child.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def sessions_groups(manager: CgroupManager) -> dict[str, Path]:
    return {c: b.with_name(manager.parent + SESSIONS_SUFFIX) for c, b in manager.bases.items()}


def fence_then_open(manager_for) -> tuple[str, str, str, str]:
    """A member fences its sessions group, a session in it is placed and tries the node; a
    job's group is joined (CgroupManager.enter) and tried; then the member starts again with
    SESSION_GPUS = "all" (the group and a session in it outlive it) and a new session tries:
    what each open gave."""
    probe = Probe()
    first = manager_for()
    again = None
    try:
        first.fence_sessions([probe.rule])
        assert first.place_sessions(probe.sleeper()) is None
        groups = [str(g / "cgroup.procs") for g in sessions_groups(first).values()]
        fenced = probe.open_from(groups)
        first.create(1, cpus=None, mem_bytes=None, deny_devices=[])  # a job given the GPU
        in_job = probe.open_from([str(Path(p) / "cgroup.procs") for p in first.get(1).paths.values()])
        first.create(2, cpus=None, mem_bytes=None, deny_devices=[probe.rule])  # a job not given it
        joined = subprocess.Popen(["sleep", "600"])
        probe.children.append(joined)
        first.enter(2, joined.pid)
        assert first.job_of(joined.pid) == 2
        other_job = probe.open_from([str(Path(p) / "cgroup.procs") for p in first.get(2).paths.values()])
        again = manager_for()
        again.fence_sessions([probe.rule])  # what the agent does at every start ...
        again.open_sessions()  # ... and SESSION_GPUS = "all" after it
        again.fence_sessions([probe.rule])  # a later call does not close it again
        assert again.place_sessions(probe.sleeper()) is None
        opened = probe.open_from(groups)
        return fenced, in_job, other_job, opened
    finally:
        probe.close()
        for job in (1, 2):
            first.kill_all(job)
            first.remove(job)
        first.release()
        if again is not None:
            again.release()


@pytest.mark.skipif(not os.path.isdir("/sys/fs/cgroup/devices"), reason="no cgroup v1 devices controller here")
def test_v1_the_sessions_group_is_fenced_a_job_is_joined_and_session_gpus_all_lifts_the_fence():
    if os.geteuid() != 0:
        pytest.skip("needs root: cgroups and device nodes")
    parent = f"mtgpu-test-sessions-{os.getpid()}"
    assert fence_then_open(lambda: CgroupManager(parent)) == ("EPERM", "ENXIO", "EPERM", "ENXIO")


def test_v2_the_sessions_group_is_fenced_a_job_is_joined_and_session_gpus_all_detaches_the_program():
    if os.geteuid() != 0:
        pytest.skip("needs root: cgroups, device nodes and eBPF programs")
    root = cgroup2_mount()
    if root is None:
        pytest.skip("no cgroup2 (unified) hierarchy is mounted on this machine")
    parent = f"mtgpu-test-sessions-{os.getpid()}"
    made = []

    def manager():
        m = CgroupManager(parent, root=root)
        assert m.version == "v2" and m.device_fencing_problem() is None, m.unavailable
        made.append(m)
        return m

    try:
        assert fence_then_open(manager) == ("EPERM", "ENXIO", "EPERM", "ENXIO")
    finally:
        for m in made:
            for d in [*sessions_groups(m).values(), *m.bases.values()]:
                remove_cgroup_tree(str(d))

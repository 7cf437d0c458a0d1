"""Containers are fenced to their own GPUs' device nodes, as native jobs are (issue 24,
point 2): real rootless Podman as a real tenant, simulated GPUs with real device nodes
(opening one gives ENXIO, no driver behind it; a fenced one EPERM).

A container only sees the device nodes CDI gives it, so each test makes another GPU's node
reachable inside the way a mount or a shared file system would: a device node with that
GPU's numbers in the tenant's home, which every container has mounted. The fence is by
number (the devices cgroup, or cgroup v2's device program), so the path does not matter."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from mtgpu.agent.podman.cdi import sim_device_number, spec_name
from mtgpu.agent.podman.tenant import PodmanHost
from tests.support.images import busybox_image, podman_missing
from tests.support.node import running_node, wait_for
from tests.support.users import can_create_users

if can_create_users() or podman_missing():
    pytest.skip(can_create_users() or podman_missing(), allow_module_level=True)
if not os.path.isdir("/sys/fs/cgroup/devices") and not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
    pytest.skip("no cgroup hierarchy to fence devices with", allow_module_level=True)

GPUS2 = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 2}]
NO_DRIVER = "No such device or address"  # ENXIO: the open reached the (missing) driver
FENCED = "Operation not permitted"  # EPERM: the device cgroup refused it


@pytest.fixture(scope="module")
def image():
    with busybox_image() as name:
        yield name


@pytest.fixture(scope="module")
def dnode(image, alice):
    # the workspace's own command opens the nodes too (its log), then stays up for the execs
    opener = f"{OPEN_ALL.format(folder=Path(alice.home) / 'gpu-nodes')}; echo opened; exec sleep 3600"
    templates = {"opener": {"image": image, "command": opener}}
    with running_node(GPUS2, CONTAINERS={"enabled": True, "images": [image], "templates": templates}) as node:
        wait_for("the image to be staged", lambda: image in _staged(node), timeout_s=120)
        yield node


@pytest.fixture(scope="module")
def copies(dnode, alice):
    """Each GPU's device node again, as `gpuN` in a folder of the tenant's home (mode 0666,
    as /dev/nvidiaN is on a real node), and `stray`, a node of no GPU of this node's (a
    device the GPU backend does not report: a container's allow-list denies it too);
    removed afterwards."""
    name = spec_name("node-a", PodmanHost(dnode.state_dir).key)
    folder = Path(alice.home) / "gpu-nodes"
    folder.mkdir(mode=0o755, exist_ok=True)
    major, minor0 = sim_device_number(name, 0)
    numbers = {"gpu0": sim_device_number(name, 0), "gpu1": sim_device_number(name, 1), "stray": (major, minor0 + 1000)}
    for node, (major, minor) in numbers.items():
        os.mknod(folder / node, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        os.chmod(folder / node, 0o666)
    try:
        yield str(folder)
    finally:
        for node in numbers:
            (folder / node).unlink(missing_ok=True)
        folder.rmdir()


def _staged(node) -> dict:
    with node.client() as c:
        for n in c.nodes():
            return (n.get("containers") or {}).get("staged") or {}
    return {}


def mt_podman(node, user, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return node.run_cli("mtgpu.cli.podman", user, *args, timeout_s=timeout_s)


def mtc(node, user, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return node.run_cli("mtgpu.cli.container", user, *args, timeout_s=timeout_s)


def opens(text: str) -> dict:
    """What `cat` said for each node in the output of OPEN_ALL: {0: .., 1: .., "stray": ..}."""
    out = {}
    for key, node in ((0, "gpu0"), (1, "gpu1"), ("stray", "stray")):
        line = next((ln for ln in text.splitlines() if f"/{node}:" in ln), "")
        out[key] = "ENXIO" if NO_DRIVER in line else "EPERM" if FENCED in line else f"? {line!r}"
    return out


OPEN_ALL = "for f in {folder}/gpu0 {folder}/gpu1 {folder}/stray; do cat $f 2>&1 | sed \"s|^|$f: |\"; done"


def _job_and_exec(node, user, image, copies, *gpus: str) -> tuple[dict, str, str]:
    """A container job that prints what it opens, then waits while `mt-podman exec` into
    its container, by name and by id, does the same: (the job, its log, the two execs' output)."""
    flag = Path(user.home) / "go-devices"
    script = f"{OPEN_ALL.format(folder=copies)}\necho opened\nwhile [ ! -e {flag} ]; do sleep 0.1; done\n"
    jid = node.submit_json(user, "--container", image, *gpus, "--wrap", script)["job_id"]
    try:
        wait_for(f"job {jid} to open the nodes", lambda: "opened" in node.mt_job(user, "logs", str(jid)).stdout,
                 timeout_s=90)
        name = wait_for(f"the container of job {jid}", lambda: mt_podman(
            node, user, "ps", "--filter", f"label=mtgpu.job={jid}", "--format", "{{.Names}}").stdout.strip(),
            timeout_s=30, interval_s=0.2)
        r = mt_podman(node, user, "exec", "-e", "X=1", name, "sh", "-c", OPEN_ALL.format(folder=copies))
        cid = mt_podman(node, user, "inspect", "--format", "{{.Id}}", name).stdout.strip()[:12]
        by_id = mt_podman(node, user, "exec", cid, "sh", "-c", OPEN_ALL.format(folder=copies))  # as VS Code does
    finally:
        flag.touch()
    job = node.wait_state(jid, {"completed", "failed"}, timeout_s=60)
    flag.unlink()
    assert job["state"] == "completed", job["reason"]
    return job, node.mt_job(user, "logs", str(jid)).stdout, r.stdout + r.stderr, by_id.stdout + by_id.stderr


def test_a_container_job_and_an_exec_into_it_open_its_own_gpu_and_are_denied_the_other(dnode, alice, image, copies):
    job, main, execd, by_id = _job_and_exec(dnode, alice, image, copies, "--gpus", "1")
    mine = job["gpus"][0]["index"]
    assert opens(main) == {mine: "ENXIO", 1 - mine: "EPERM", "stray": "EPERM"}, main
    assert opens(execd) == {mine: "ENXIO", 1 - mine: "EPERM", "stray": "EPERM"}, execd
    assert opens(by_id) == {mine: "ENXIO", 1 - mine: "EPERM", "stray": "EPERM"}, by_id
    assert job["enforced"]["devices"].startswith("cgroup-") and "nodes allowed" in job["enforced"]["devices"], job["enforced"]


def test_a_container_job_with_no_gpu_and_an_exec_into_it_open_no_gpu_node(dnode, alice, image, copies):
    job, main, execd, by_id = _job_and_exec(dnode, alice, image, copies)
    assert opens(main) == {0: "EPERM", 1: "EPERM", "stray": "EPERM"}, main
    assert opens(execd) == {0: "EPERM", 1: "EPERM", "stray": "EPERM"}, execd
    assert opens(by_id) == {0: "EPERM", 1: "EPERM", "stray": "EPERM"}, by_id


def test_a_workspace_its_command_and_every_exec_into_it_open_its_own_gpu_and_are_denied_the_other(dnode, alice, copies):
    r = mtc(dnode, alice, "create", "--template", "opener", "--gpus", "1", "--name", "fenced")
    assert r.returncode == 0, (r.stdout, r.stderr, dnode.server_log()[-3000:])
    try:
        ws = wait_for("workspace fenced to run", lambda: _running(dnode, alice, "fenced"), timeout_s=90, interval_s=0.2)
        mine = ws["gpus"][0]["index"]
        r = mtc(dnode, alice, "exec", "fenced", "--", "sh", "-c", OPEN_ALL.format(folder=copies))
        assert opens(r.stdout) == {mine: "ENXIO", 1 - mine: "EPERM", "stray": "EPERM"}, (r.stdout, r.stderr)
        main = wait_for("its command's output", lambda: _opened(mtc(dnode, alice, "logs", "fenced").stdout),
                        timeout_s=60, interval_s=0.3)
        assert opens(main) == {mine: "ENXIO", 1 - mine: "EPERM", "stray": "EPERM"}, main
    finally:
        mtc(dnode, alice, "rm", "fenced")


def test_a_workspace_with_no_gpu_and_every_exec_into_it_open_no_gpu_node(dnode, alice, copies):
    r = mtc(dnode, alice, "create", "--template", "opener", "--name", "nogpu")
    assert r.returncode == 0, (r.stdout, r.stderr, dnode.server_log()[-3000:])
    try:
        wait_for("workspace nogpu to run", lambda: _running(dnode, alice, "nogpu"), timeout_s=90, interval_s=0.2)
        r = mtc(dnode, alice, "exec", "nogpu", "--", "sh", "-c", OPEN_ALL.format(folder=copies))
        assert opens(r.stdout) == {0: "EPERM", 1: "EPERM", "stray": "EPERM"}, (r.stdout, r.stderr)
        main = wait_for("its command's output", lambda: _opened(mtc(dnode, alice, "logs", "nogpu").stdout),
                        timeout_s=60, interval_s=0.3)
        assert opens(main) == {0: "EPERM", 1: "EPERM", "stray": "EPERM"}, main
    finally:
        mtc(dnode, alice, "rm", "nogpu")


def _opened(log: str) -> str | None:
    return log if "opened" in log else None


def _running(node, user, name: str) -> dict | None:
    ws = node.workspace_of(user.name, name)  # as `mt-container show --json NAME` says it
    assert ws is not None and ws["state"] in ("queued", "running"), ws
    return ws if ws["state"] == "running" and ws["workspace"]["container"] else None


def test_a_tenants_own_podman_outside_its_jobs_opens_no_gpu_node(dnode, alice, image, copies):
    """mt-podman run (and what a tenant's SSH session runs) is in the sessions group, which
    holds no GPU: a container it starts gets EPERM on every GPU's node, `--device` included."""
    jid = dnode.submit_json(alice, "--container", image, "--wrap", "true")["job_id"]  # the image in its store
    assert dnode.wait_state(jid, {"completed", "failed"}, timeout_s=90)["state"] == "completed"
    r = mt_podman(dnode, alice, "run", "--rm", "--pull=never", "--network=none", "-v", f"{copies}:{copies}", image,
                  "sh", "-c", OPEN_ALL.format(folder=copies))
    assert opens(r.stdout + r.stderr) == {0: "EPERM", 1: "EPERM", "stray": "ENXIO"}, (r.stdout, r.stderr)

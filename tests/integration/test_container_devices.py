"""Containers are fenced to their own GPUs' device nodes, as native jobs are (issue 24,
point 2): real rootless Podman as a real tenant, simulated GPUs with real device nodes
(opening one gives ENXIO, no driver behind it; a fenced one EPERM).

A container only sees the device nodes CDI gives it, so each test makes another GPU's node
reachable inside the way a mount or a shared file system would: a device node with that
GPU's numbers in the tenant's home, which every container has mounted. The fence is by
number (the devices cgroup, or cgroup v2's device program), so the path does not matter."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from mtgpu.agent.podman.cdi import sim_device_number, sim_device_path, spec_name
from mtgpu.agent.podman.tenant import PodmanHost
from tests.support.images import busybox_image, podman_missing
from tests.support.node import PYTHON, REPO_ROOT, running_node, wait_for
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
    with running_node(GPUS2, GPU_POLICY={"vram_grace": "2s"},
                      CONTAINERS={"enabled": True, "images": [image], "templates": templates}) as node:
        wait_for("the image to be staged", lambda: image in _staged(node), timeout_s=120)
        yield node


@pytest.fixture(scope="module")
def copies(dnode, alice):
    with gpu_node_copies(dnode, alice.home) as folder:
        yield folder


@contextlib.contextmanager
def gpu_node_copies(node, home: str) -> Iterator[str]:
    """Each GPU's device node of `node` again, as `gpuN` in a folder of the tenant's `home`
    (mode 0666, as /dev/nvidiaN is on a real node), and `stray`, a node of no GPU of this
    node's (a device the GPU backend does not report: a container's allow-list denies it
    too); removed afterwards."""
    name = spec_name("node-a", PodmanHost(node.state_dir).key)
    folder = Path(home) / "gpu-nodes"
    folder.mkdir(mode=0o755, exist_ok=True)
    major, minor0 = sim_device_number(name, 0)
    numbers = {"gpu0": sim_device_number(name, 0), "gpu1": sim_device_number(name, 1), "stray": (major, minor0 + 1000)}
    for dev, (major, minor) in numbers.items():
        os.mknod(folder / dev, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        os.chmod(folder / dev, 0o666)
    try:
        yield str(folder)
    finally:
        for dev in numbers:
            (folder / dev).unlink(missing_ok=True)
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


def _container_of(node, user, jid: int) -> str:
    return wait_for(f"the container of job {jid}", lambda: mt_podman(
        node, user, "ps", "--filter", f"label=mtgpu.job={jid}", "--format", "{{.Names}}").stdout.strip(),
        timeout_s=30, interval_s=0.2)


def _job_and_exec(node, user, image, copies, *gpus: str) -> tuple[dict, str, str]:
    """A container job that prints what it opens, then waits while `mt-podman exec` into
    its container, by name and by id, does the same: (the job, its log, the two execs' output)."""
    flag = Path(user.home) / "go-devices"
    script = f"{OPEN_ALL.format(folder=copies)}\necho opened\nwhile [ ! -e {flag} ]; do sleep 0.1; done\n"
    jid = node.submit_json(user, "--container", image, *gpus, "--wrap", script)["job_id"]
    try:
        wait_for(f"job {jid} to open the nodes", lambda: "opened" in node.mt_job(user, "logs", str(jid)).stdout,
                 timeout_s=90)
        name = _container_of(node, user, jid)
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


def _host_pid_of(argv: list[str]) -> int | None:
    """The pid, as the host numbers it, of the one process whose command line is `argv`."""
    found = []
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")[:-1] == [a.encode() for a in argv]:
                found.append(int(d))
        except OSError:
            continue  # it ended meanwhile
    assert len(found) <= 1, found
    return found[0] if found else None


def test_vram_an_exec_session_uses_counts_as_the_container_jobs_and_it_ends_with_the_job(dnode, alice, image):
    """An `mt-podman exec` into a container job joins the job's cgroup, so the GPU telemetry's
    per-process figures are the job's (issue 25): VRAM the exec's process uses, above the
    job's reservation, gets the job stopped with the figures, and the exec ends with it."""
    from mtgpu.agent.telemetry.simulated import default_override_path, write_simulated_load

    jid = dnode.submit_json(alice, "--container", image, "--gpus", "1", "--gpu-mode", "shared", "--vram", "8G",
                            "--wrap", "sleep 600")["job_id"]
    mine = dnode.wait_state(jid, "running", timeout_s=90)["gpus"][0]["index"]
    marker = ["sleep", str(700000 + os.getpid() % 100000)]  # the exec's process, found by its command line
    session = subprocess.Popen(
        [PYTHON, "-m", "mtgpu.cli.podman", "exec", _container_of(dnode, alice, jid), *marker],
        env=dnode.env_for(alice.home), user=alice.uid, group=alice.gid, extra_groups=[], cwd=alice.home,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    override = default_override_path(dnode.state_dir)
    try:
        pid = wait_for("the exec's process", lambda: _host_pid_of(marker), timeout_s=60, interval_s=0.2)
        assert f"/job-{jid}" in Path(f"/proc/{pid}/cgroup").read_text()  # moved into the job's groups
        write_simulated_load(override, mine, processes=[{"pid": pid, "used_vram_bytes": 12 << 30, "name": "exec"}])
        job = dnode.wait_state(jid, {"completed", "failed", "cancelled"}, timeout_s=60)
        assert job["state"] == "failed", job
        assert job["reason"].startswith(f"used 12G of VRAM on GPU {mine}, above the 8G it reserved"), job["reason"]
        wait_for("the exec to end with its job", lambda: session.poll() is not None, timeout_s=30)
    finally:
        write_simulated_load(override, mine, processes=[])
        if session.poll() is None:
            os.killpg(session.pid, signal.SIGKILL)
        session.communicate(timeout=30)
        if dnode.job(jid)["state"] not in ("completed", "failed", "cancelled"):
            dnode.mt_job(alice, "cancel", str(jid))


def _opened(log: str) -> str | None:
    return log if "opened" in log else None


def _running(node, user, name: str) -> dict | None:
    ws = node.workspace_of(user.name, name)  # as `mt-container show --json NAME` says it
    assert ws is not None and ws["state"] in ("queued", "running"), ws
    return ws if ws["state"] == "running" and ws["workspace"]["container"] else None


def _image_in_store(node, user, image) -> None:
    """A container job of the tenant's has run `image`: the image is in the tenant's store."""
    jid = node.submit_json(user, "--container", image, "--wrap", "true")["job_id"]
    assert node.wait_state(jid, {"completed", "failed"}, timeout_s=90)["state"] == "completed"


def test_a_tenants_own_podman_outside_its_jobs_opens_no_gpu_node(dnode, alice, image, copies):
    """mt-podman run (and what a tenant's SSH session runs) is in the sessions group, which
    holds no GPU: a container it starts gets EPERM on every GPU's node it mounts (`--device`:
    the next test)."""
    _image_in_store(dnode, alice, image)
    r = mt_podman(dnode, alice, "run", "--rm", "--pull=never", "--network=none", "-v", f"{copies}:{copies}", image,
                  "sh", "-c", OPEN_ALL.format(folder=copies))
    assert opens(r.stdout + r.stderr) == {0: "EPERM", 1: "EPERM", "stray": "ENXIO"}, (r.stdout, r.stderr)


def _devices(*pairs: tuple[str, str]) -> list[str]:
    return [a for host, inside in pairs for a in ("--device", f"{host}:{inside}")]


def test_a_tenants_own_podman_run_with_device_opens_no_gpu_node(dnode, alice, image, copies):
    """`mt-podman run --device NODE` (issue 25, point 3): rootless podman cannot make a device
    node, so it bind-mounts the host's, and the container, in the sessions group, is denied
    every GPU's node, the node's own `/dev/mtgpu/...` as a copy in the home; a GPU a job of
    the tenant's holds is no different outside that job. The stray node is no GPU: nothing
    fences it (ENXIO), as in a plain session."""
    _image_in_store(dnode, alice, image)
    sim = spec_name("node-a", PodmanHost(dnode.state_dir).key)
    held, mine = _holding_job(dnode, alice)
    try:
        r = mt_podman(dnode, alice, "run", "--rm", "--pull=never", "--network=none",
                      *_devices((sim_device_path(sim, 0), "/dev/g/gpu0"), (f"{copies}/gpu1", "/dev/g/gpu1"),
                                (f"{copies}/stray", "/dev/g/stray")),
                      image, "sh", "-c", f"ls -l /dev/g; {OPEN_ALL.format(folder='/dev/g')}")
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert all(f"/dev/g/{n}:" in r.stdout for n in ("gpu0", "gpu1", "stray")), r.stdout  # each was there
        assert opens(r.stdout + r.stderr) == {0: "EPERM", 1: "EPERM", "stray": "ENXIO"}, (r.stdout, r.stderr)
        # the held GPU's own node, by --device, from outside the job that holds it
        r = mt_podman(dnode, alice, "run", "--rm", "--pull=never", "--network=none",
                      *_devices((sim_device_path(sim, mine), "/dev/g/gpu0")), image, "cat", "/dev/g/gpu0")
        assert r.returncode != 0 and FENCED in r.stderr, (r.stdout, r.stderr)
    finally:
        dnode.mt_job(alice, "cancel", str(held))
    dnode.wait_state(held, "cancelled", timeout_s=60)


def _holding_job(node, user) -> tuple[int, int]:
    """A native job of the tenant's holding one GPU, running: (its id, its GPU's index)."""
    jid = node.submit_json(user, "--gpus", "1", "--wrap", "sleep 600")["job_id"]
    return jid, node.wait_state(jid, "running", timeout_s=60)["gpus"][0]["index"]


def test_own_podman_run_with_device_inside_a_native_job_opens_only_that_jobs_gpu(dnode, alice, image, copies):
    """From a job's own script `mt-podman run` stays in the job's cgroup (its GPUs are a
    reservation's): `--device` of both GPUs' nodes, its own opens (ENXIO), the other is
    denied (EPERM)."""
    _image_in_store(dnode, alice, image)
    sim = spec_name("node-a", PodmanHost(dnode.state_dir).key)
    run = " ".join([f"MTGPU_SOCKET={dnode.socket_path}", f"PYTHONPATH={REPO_ROOT}", PYTHON, "-m", "mtgpu.cli.podman",
                    "run", "--rm", "--pull=never", "--network=none",
                    *_devices((sim_device_path(sim, 0), "/dev/g/gpu0"), (sim_device_path(sim, 1), "/dev/g/gpu1"),
                              (f"{copies}/stray", "/dev/g/stray")),
                    image, "sh", "-c", f"'{OPEN_ALL.format(folder='/dev/g')}'"])
    jid = dnode.submit_json(alice, "--gpus", "1", script=f"#!/bin/bash\n{run} 2>&1\necho rc=$?\n")["job_id"]
    job = dnode.wait_state(jid, {"completed", "failed"}, timeout_s=120)
    out = dnode.mt_job(alice, "logs", str(jid)).stdout
    assert job["state"] == "completed" and "rc=0" in out, (job["reason"], out)
    mine = job["gpus"][0]["index"]
    assert opens(out) == {mine: "ENXIO", 1 - mine: "EPERM", "stray": "ENXIO"}, out  # a native job's deny-list

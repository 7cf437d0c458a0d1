"""GPU device fencing on cgroup v2, in the kernel (agent/runners/devbpf.py and the v2 path
of runners/cgroups.py): real cgroups under the machine's cgroup2 hierarchy, two real
character device nodes of a major reserved for local use that no driver holds (opening
one gives ENXIO, no driver; a denied one EPERM, before any driver is asked), and child
processes placed in the cgroups before they open the nodes.

Everything made here is removed at teardown, also when a test fails: the children this
test started are killed, then the cgroups (innermost first) and the device nodes removed."""

from __future__ import annotations

import errno
import json
import logging
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import pytest

from mtgpu.agent.runners import devbpf
from mtgpu.agent.runners.cgroups import STANDARD_DEVICES, CgroupManager
from tests.support.devices import OPENER


def cgroup2_mount() -> str | None:
    """Where the cgroup2 (unified) hierarchy is mounted: /sys/fs/cgroup/unified on a
    hybrid machine, /sys/fs/cgroup on a v2-only one."""
    try:
        lines = open("/proc/self/mountinfo").read().splitlines()
    except OSError:
        return None
    for line in lines:
        pre, _, post = line.partition(" - ")
        if post.split()[:1] == ["cgroup2"]:
            return pre.split()[4].replace("\\040", " ")
    return None


def free_local_major() -> int:
    """A character major of the range reserved for local use (240-254) that no driver of
    this machine registered (dynamic majors are handed out from 254 down)."""
    used, section = set(), None
    for line in open("/proc/devices").read().splitlines():
        if line.endswith(":"):
            section = line
        elif section == "Character devices:" and line.split():
            used.add(int(line.split()[0]))
    for major in range(240, 255):
        if major not in used:
            return major
    pytest.fail(f"every character major of 240-254 is registered on this machine ({sorted(used)})")


class Lab:
    def __init__(self, root: str):
        self.root = root
        self.cgroups: list[str] = []
        self.children: list[subprocess.Popen] = []
        base = tempfile.gettempdir()
        if os.statvfs(base).f_flag & os.ST_NODEV:  # device nodes would not open at all there
            base = "/dev"
        self.node_dir = tempfile.mkdtemp(prefix="mtgpu-test-devbpf-", dir=base)
        major = free_local_major()
        self.denied = self._mknod("denied", major, 4242)
        self.allowed = self._mknod("allowed", major, 4243)

    def _mknod(self, name: str, major: int, minor: int) -> str:
        path = os.path.join(self.node_dir, name)
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        return path

    @staticmethod
    def rule(path: str) -> tuple[str, int, int]:
        st = os.stat(path)
        return ("c", os.major(st.st_rdev), os.minor(st.st_rdev))

    def mkcg(self, parent: str | None = None, name: str | None = None) -> str:
        d = os.path.join(parent or self.root, name or f"mtgpu-test-devbpf-{os.getpid()}-{secrets.token_hex(4)}")
        os.mkdir(d)
        self.cgroups.append(d)
        return d

    def track(self, d: str) -> None:
        """A cgroup made by the code under test, to remove at teardown (with what is below it)."""
        self.cgroups.append(str(d))

    def open_in(self, cgroup: str) -> dict[str, str]:
        """A child process, moved into `cgroup` before it tries, opens both nodes:
        {"denied": errno name or "opened", "allowed": ...}."""
        child = subprocess.Popen([sys.executable, "-I", "-c", OPENER, self.denied, self.allowed],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.children.append(child)
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(child.pid))
        rel = "/" + os.path.relpath(cgroup, self.root)
        assert f"0::{rel}\n" in open(f"/proc/{child.pid}/cgroup").read(), f"the child is not in {cgroup}"
        out, _ = child.communicate("go\n", timeout=60)
        assert child.returncode == 0, out
        got = json.loads(out)
        return {"denied": got[self.denied], "allowed": got[self.allowed]}

    def close(self) -> None:
        for child in self.children:  # only the processes this test started
            if child.poll() is None:
                child.kill()
                child.wait()
        for d in reversed(self.cgroups):
            remove_cgroup_tree(d)
        shutil.rmtree(self.node_dir, ignore_errors=True)


def remove_cgroup_tree(d: str, timeout_s: float = 5.0) -> None:
    if not os.path.isdir(d):
        return
    for entry in os.scandir(d):
        if entry.is_dir(follow_symlinks=False):
            remove_cgroup_tree(entry.path, timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.rmdir(d)
            return
        except FileNotFoundError:
            return
        except OSError as e:  # EBUSY while the killed children are being released
            if e.errno != errno.EBUSY or time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


@pytest.fixture
def lab():
    if os.geteuid() != 0:
        pytest.skip("needs root: making cgroups and device nodes and loading eBPF programs")
    root = cgroup2_mount()
    if root is None:
        pytest.skip("no cgroup2 (unified) hierarchy is mounted on this machine")
    made = Lab(root)
    try:
        yield made
    finally:
        made.close()


def attach_with_flags(cgroup: str, deny: list[tuple[str, int, int]], flags: int) -> None:
    """What a container manager might do above a job: its own device program, attached
    with `flags` (devbpf itself always uses BPF_F_ALLOW_MULTI)."""
    prog = devbpf.load(deny)
    fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        devbpf._bpf(devbpf.BPF_PROG_ATTACH, devbpf._AttachAttr(
            target_fd=fd, attach_bpf_fd=prog, attach_type=devbpf.BPF_CGROUP_DEVICE, attach_flags=flags),
            f"attaching a manager's program to {cgroup}")
    finally:
        os.close(fd)
        os.close(prog)


def test_the_fenced_cgroup_is_denied_the_node_with_eperm_and_opens_the_other_up_to_the_driver(lab):
    fenced, sibling = lab.mkcg(), lab.mkcg()
    devbpf.fence(fenced, [lab.rule(lab.denied)])
    assert lab.open_in(fenced) == {"denied": "EPERM", "allowed": "ENXIO"}
    assert lab.open_in(lab.mkcg(parent=fenced)) == {"denied": "EPERM", "allowed": "ENXIO"}  # below it too
    assert lab.open_in(sibling) == {"denied": "ENXIO", "allowed": "ENXIO"}  # no program: only "no driver"


def test_a_managers_program_above_the_job_keeps_running(lab):
    manager = lab.mkcg()
    devbpf.fence(manager, [lab.rule(lab.allowed)])  # attached with BPF_F_ALLOW_MULTI, as systemd and runc do
    job = lab.mkcg(parent=manager)
    devbpf.fence(job, [lab.rule(lab.denied)])
    assert lab.open_in(job) == {"denied": "EPERM", "allowed": "EPERM"}


def test_a_program_attached_above_with_allow_override_is_not_silently_replaced(lab):
    manager = lab.mkcg()
    attach_with_flags(manager, [lab.rule(lab.allowed)], devbpf.BPF_F_ALLOW_OVERRIDE)
    job = lab.mkcg(parent=manager)
    with pytest.raises(OSError) as e:
        devbpf.fence(job, [lab.rule(lab.denied)])
    assert e.value.errno == errno.EPERM and "BPF_F_ALLOW_OVERRIDE" in e.value.strerror, e.value
    assert "detached again" in e.value.strerror
    assert lab.open_in(job) == {"denied": "ENXIO", "allowed": "EPERM"}  # the manager's program still runs


def test_a_verifier_refusal_is_reported_with_the_verifiers_text():
    if os.geteuid() != 0:
        pytest.skip("needs root: loading eBPF programs")
    with pytest.raises(OSError) as e:
        devbpf.load_code(devbpf.insn(devbpf.EXIT))  # returns r0 without setting it
    assert e.value.errno == errno.EACCES, e.value
    assert "BPF_PROG_LOAD" in e.value.strerror and "the verifier said" in e.value.strerror
    assert "R0 !read_ok" in e.value.strerror, e.value.strerror


def test_the_cgroup_manager_fences_a_v2_job_with_the_program_and_says_so(lab):
    parent = f"mtgpu-test-devbpf-mgr-{os.getpid()}-{secrets.token_hex(4)}"
    lab.track(os.path.join(lab.root, parent))
    manager = CgroupManager(parent, root=lab.root)
    assert manager.version == "v2" and manager.device_fencing_problem() is None, manager.unavailable
    assert not [n for n in os.listdir(manager.bases["unified"]) if n.startswith("devbpf-probe")], "the probe's cgroup is left"
    cg = manager.create(1, cpus=None, mem_bytes=None, deny_devices=[lab.rule(lab.denied)])
    assert cg.enforced["devices"] == "cgroup-v2 (eBPF)" and not cg.not_enforced, cg
    assert lab.open_in(cg.paths["unified"]) == {"denied": "EPERM", "allowed": "ENXIO"}
    assert manager.kill_all(1)
    manager.remove(1)
    assert not os.path.exists(cg.paths["unified"])


def test_where_no_program_can_be_attached_the_manager_and_the_agents_warning_say_why(lab, caplog, tmp_path):
    from mtgpu.agent.local import LocalAgent

    parent = f"mtgpu-test-devbpf-mgr-{os.getpid()}-{secrets.token_hex(4)}"
    base = lab.mkcg(name=parent)
    attach_with_flags(base, [], 0)  # a program that forbids any below it (no ALLOW_* flag)
    manager = CgroupManager(parent, root=lab.root)
    why = manager.device_fencing_problem()
    assert why and "device eBPF program cannot be used" in why and "EPERM" in why, why
    assert "BPF_F_ALLOW_MULTI" in why, why  # what to change
    cg = manager.create(2, cpus=None, mem_bytes=None, deny_devices=[lab.rule(lab.denied)])
    try:
        assert "devices" not in cg.enforced and cg.not_enforced["devices"] == why, cg
        assert lab.open_in(cg.paths["unified"]) == {"denied": "ENXIO", "allowed": "ENXIO"}  # truly unfenced
    finally:
        manager.kill_all(2)
        manager.remove(2)

    class Backend:
        name = "test"

        def sample(self):
            return []

        def device_nodes(self):
            return {0: lab.denied, 1: lab.allowed}

    agent = LocalAgent(tmp_path / "state", runner=SimpleNamespace(cgroups=manager), backend=Backend())
    caplog.set_level(logging.WARNING, logger="mtgpu.agent.local")
    agent._find_gpu_devices("n1")
    assert f"GPU device fencing is unavailable on this node: {why}" in caplog.text, caplog.text


def test_a_containers_allow_list_opens_its_own_nodes_and_the_standard_ones_and_denies_the_rest(lab):
    only = lab.mkcg()
    devbpf.fence(only, allow=[*STANDARD_DEVICES, lab.rule(lab.allowed)])
    assert lab.open_in(only) == {"denied": "EPERM", "allowed": "ENXIO"}
    assert lab.open_in(lab.mkcg(parent=only)) == {"denied": "EPERM", "allowed": "ENXIO"}  # below it too
    major = lab.rule(lab.allowed)[1]
    every_minor = lab.mkcg()
    devbpf.fence(every_minor, allow=[*STANDARD_DEVICES, ("c", major, None)])  # as the pseudo-terminals' 136:*
    assert lab.open_in(every_minor) == {"denied": "ENXIO", "allowed": "ENXIO"}
    with pytest.raises(ValueError):
        devbpf.assemble([("c", major, None)])  # a deny rule names one node


def test_the_cgroup_manager_fences_a_v2_container_job_with_its_allow_list(lab):
    parent = f"mtgpu-test-devbpf-mgr-{os.getpid()}-{secrets.token_hex(4)}"
    lab.track(os.path.join(lab.root, parent))
    manager = CgroupManager(parent, root=lab.root)
    allow = [*STANDARD_DEVICES, lab.rule(lab.allowed)]
    cg = manager.create(3, cpus=None, mem_bytes=None, allow_devices=allow)
    assert cg.enforced["devices"] == f"cgroup-v2 (eBPF, {len(allow)} nodes allowed)" and not cg.not_enforced, cg
    assert lab.open_in(cg.paths["unified"]) == {"denied": "EPERM", "allowed": "ENXIO"}
    manager.remove(3)

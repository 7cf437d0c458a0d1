"""What a member says when no cgroup hierarchy is usable: the reason detection met, not a
bare "no writable cgroup hierarchy" (a real H200 machine, cgroup v2 without a writable
hierarchy for the member, said only that; bench/gpu_check.sh)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from mtgpu.agent.runners.cgroups import CgroupManager


def test_an_unusable_v2_hierarchy_is_reported_with_what_detection_met(tmp_path):
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory pids\n")  # looks like cgroup v2...
    own = next((line.split(":", 2)[2] for line in open("/proc/self/cgroup").read().splitlines()
                if line.startswith("0::")), "/")
    own_dir = root / own.strip("/") if own.strip("/") else root
    own_dir.mkdir(parents=True, exist_ok=True)
    (own_dir / "cgroup.controllers").write_text("cpu memory pids\n")
    (own_dir / "cgroup.subtree_control").mkdir()  # ...whose controllers cannot be enabled
    manager = CgroupManager("mtgpu-test", root=str(root))
    assert manager.version is None and not manager.bases
    said = manager.hold_member()
    assert said.startswith("no writable cgroup hierarchy (not writable ("), said
    assert "Is a directory" in said and "cgroup.subtree_control" in said, said
    fencing = manager.device_fencing_problem()
    assert fencing.startswith("the devices cgroup is not usable (no writable cgroup hierarchy (not writable ("), fencing


def test_v2_moves_the_processes_that_share_the_members_group_into_a_leaf_of_it(tmp_path, monkeypatch):
    """cgroup v2 enables controllers only in a group with no process of its own: a member
    started from a shell shares its group with that shell (a real H200 machine's runner:
    EBUSY, then no cgroups at all). The others go into `<own>/<parent>-neighbours`, the
    member into its services group, and the controllers are enabled."""
    from mtgpu.agent.runners import cgroups as cg

    root = tmp_path / "cgroup"
    own = root / "process_api" / "abc"
    own.mkdir(parents=True)
    for d in (root, own):
        (d / "cgroup.controllers").write_text("cpu memory pids\n")
    me = os.getpid()
    (own / "cgroup.procs").write_text(f"{me}\n4242\n4343\n")
    monkeypatch.setattr(cg.CgroupManager, "_own_paths", staticmethod(lambda: {"": "/process_api/abc"}))
    real_write = cg._write

    def write(path, value):  # the kernel's rules, as far as detection meets them
        path = Path(path)
        if path.name == "cgroup.subtree_control" and path.parent == own and (own / "cgroup.procs").read_text().split():
            raise OSError(errno.EBUSY, "Device or resource busy")
        if path.name == "cgroup.procs":
            for procs in root.rglob("cgroup.procs"):
                procs.write_text("".join(f"{p}\n" for p in procs.read_text().split() if p != str(value)))
            path.parent.mkdir(exist_ok=True)
            with open(path, "a") as f:
                f.write(f"{value}\n")
            return
        real_write(path, value)
    monkeypatch.setattr(cg, "_write", write)
    monkeypatch.setattr(cg.devbpf, "probe", lambda base: "")
    manager = cg.CgroupManager("mtgpu-test", root=str(root))
    assert manager.version == "v2" and manager.bases == {"unified": own / "mtgpu-test"}, manager.unavailable
    assert sorted(manager.moved_neighbours) == [4242, 4343]
    assert (own / "mtgpu-test-neighbours" / "cgroup.procs").read_text().split() == ["4242", "4343"]
    assert (own / "mtgpu-test-services" / "cgroup.procs").read_text().split() == [str(me)]
    assert (own / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"

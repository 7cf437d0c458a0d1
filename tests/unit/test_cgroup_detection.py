"""What a member says when no cgroup hierarchy is usable: the reason detection met, not a
bare "no writable cgroup hierarchy" (a real H200 machine, cgroup v2 without a writable
hierarchy for the member, said only that; bench/gpu_check.sh)."""

from __future__ import annotations

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

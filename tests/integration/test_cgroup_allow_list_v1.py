"""A container's device allow-list on cgroup v1 (runners/cgroups.py) below a group that
denies some of it: a member under a service manager or in a system container whose devices
group does not allow, say, /dev/fuse. Real v1 devices groups, made and removed here, and a
real child process placed in the job's group before it opens the nodes."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from mtgpu.agent.runners.cgroups import STANDARD_DEVICES, CgroupManager
from tests.support.devices import opened, start_opener

if os.path.exists("/sys/fs/cgroup/cgroup.controllers") or not os.path.isdir("/sys/fs/cgroup/devices"):
    pytest.skip("no cgroup v1 devices hierarchy here", allow_module_level=True)
if os.geteuid() != 0:
    pytest.skip("making devices groups needs root", allow_module_level=True)

FUSE = ("c", 10, 229)


def test_a_containers_allow_list_below_a_group_that_denies_part_of_it_still_fences_the_container():
    """The parent denies /dev/fuse: the kernel refuses to allow it below (EPERM), and that
    refusal made the whole job group fail, so the container ran in no group at all (no
    device fence, no memory or pids limit). Now the rules the parent denies stay denied,
    the rest are allowed, and the record says which were denied above."""
    manager = CgroupManager(f"mtgpu-test-allow-{secrets.token_hex(4)}")
    if "devices" not in manager.bases:
        manager.release()
        pytest.skip(f"no writable devices group here: {manager.unavailable}")
    child = None
    try:
        parent = manager.bases["devices"]
        (parent / "devices.deny").write_text("a")
        for typ, major, minor in STANDARD_DEVICES:
            if (typ, major, minor) != FUSE:
                (parent / "devices.allow").write_text(f"{typ} {major}:{'*' if minor is None else minor} rwm")
        cg = manager.create(7, cpus=None, mem_bytes=None, allow_devices=list(STANDARD_DEVICES))
        assert cg is not None and "devices" in cg.paths, cg
        assert cg.enforced["devices"] == (f"cgroup-v1 ({len(STANDARD_DEVICES) - 1} nodes allowed; "
                                          "denied above it: c 10:229)"), cg.enforced
        listed = Path(cg.paths["devices"], "devices.list").read_text().splitlines()
        assert "c 1:3 rwm" in listed and "c 136:* rwm" in listed and "c 10:229 rwm" not in listed, listed
        child = start_opener("/dev/null", "/dev/fuse")
        manager.enter(7, child.pid)
        assert opened(child) == {"/dev/null": "opened", "/dev/fuse": "EPERM"}
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        manager.remove(7)
        manager.release()

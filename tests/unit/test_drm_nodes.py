"""AMD and Intel GPUs' DRM nodes from their PCI addresses (telemetry/drm.py), on a sysfs tree of
our own; the backends' device_nodes; the agent taking several nodes per GPU; and the native
runner denying every node of the other GPUs (real device nodes, numbers for local use)."""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
from functools import partial
from types import SimpleNamespace

import pytest

from mtgpu.agent.local import LocalAgent
from mtgpu.agent.runners.base import Launch
from mtgpu.agent.runners.native import NativeRunner
from mtgpu.agent.telemetry import amd, drm, intel
from tests.unit.telemetry.test_telemetry_amd import make_fake_amdsmi
from tests.unit.telemetry.test_telemetry_intel import GiB, make_card

# Two GPUs with a card and a render node each, the second with a leftover control node
# (older kernels) that is no GPU's to deny; an integrated GPU (its drm entries only in a
# connector's folder, which is not a node); a PCI device with no drm folder (audio).
GPUS = {
    "0000:c1:00.0": ("card1", "renderD128"),
    "0000:c2:00.0": ("card2", "renderD129", "controlD65"),
    "0000:00:02.0": (),
}


@pytest.fixture
def roots(tmp_path):
    sys_root, dev_root = tmp_path / "sys", tmp_path / "dev"
    for address, entries in GPUS.items():
        device = sys_root / "bus" / "pci" / "devices" / address
        device.mkdir(parents=True)
        (device / "uevent").write_text(f"DRIVER=amdgpu\nPCI_ID=1002:74A1\nPCI_SLOT_NAME={address}\n")
        if entries:
            (device / "drm").mkdir()
        for name in entries:
            (device / "drm" / name).mkdir()
            if name.startswith("card"):
                (device / "drm" / name / f"{name}-DP-1").mkdir()
    (sys_root / "bus" / "pci" / "devices" / "0000:00:1f.3").mkdir()
    return sys_root, dev_root


def nodes(dev_root, *names):
    return tuple(str(dev_root / "dri" / n) for n in names)


# ------------------------------------------------------------------ addresses and sysfs
@pytest.mark.parametrize("spelling", ["0000:c1:00.0", "0000:C1:00.0", "00000000:C1:00.0", "c1:00.0",
                                      " 0000:c1:0.0\n", "0:c1:00.0"])
def test_every_spelling_of_a_pci_address_finds_the_same_card_and_render_node(roots, spelling):
    sys_root, dev_root = roots
    assert drm.normalize_pci_address(spelling) == "0000:c1:00.0"
    assert drm.drm_nodes(spelling, sys_root, dev_root) == nodes(dev_root, "card1", "renderD128")


def test_a_vmd_domain_keeps_its_fifth_digit():
    assert drm.normalize_pci_address("00010000:E1:00.0") == "10000:e1:00.0"


@pytest.mark.parametrize("bad", ["", "gpu0", "0000:c1:00", "0000:c1:20.0", "0000:c1:00.8", "0000:1c1:00.0",
                                 "000000000:c1:00.0"])
def test_a_malformed_pci_address_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="PCI address .* is not DOMAIN:BUS:DEVICE.FUNCTION"):
        drm.normalize_pci_address(bad)


def test_card_then_render_nodes_and_nothing_else(roots):
    sys_root, dev_root = roots
    assert drm.drm_nodes("0000:c2:00.0", sys_root, dev_root) == nodes(dev_root, "card2", "renderD129")


def test_a_pci_device_without_a_drm_folder_has_no_nodes(roots):
    sys_root, dev_root = roots
    assert drm.drm_nodes("0000:00:1f.3", sys_root, dev_root) == ()
    assert drm.drm_nodes("0000:00:02.0", sys_root, dev_root) == ()
    assert drm.drm_nodes("0000:99:00.0", sys_root, dev_root) == ()  # no such device


def test_pci_address_of_a_sysfs_device_from_its_uevent_or_its_link(roots, tmp_path):
    sys_root, _ = roots
    assert drm.pci_address_of(sys_root / "bus" / "pci" / "devices" / "0000:c1:00.0") == "0000:c1:00.0"
    link = tmp_path / "card9-device"
    link.symlink_to(sys_root / "bus" / "pci" / "devices" / "0000:00:1f.3")  # no uevent there: its name
    assert drm.pci_address_of(link) == "0000:00:1f.3"
    plain = tmp_path / "device"
    plain.mkdir()
    assert drm.pci_address_of(plain) is None


def test_gpus_without_a_known_address_or_nodes_or_sharing_a_device_are_left_out_and_said(roots, caplog):
    sys_root, dev_root = roots
    caplog.set_level(logging.WARNING, logger="mtgpu.agent.telemetry.drm")
    got = drm.nodes_by_gpu({0: "0000:C1:00.0", 1: None, 2: "0000:00:02.0", 3: "bogus",
                            4: "0000:c2:00.0", 5: "00000000:C2:00.0"}, "test SMI", sys_root, dev_root)
    assert got == {0: nodes(dev_root, "card1", "renderD128")}
    text = caplog.text
    assert "GPU 1: test SMI does not report its PCI address" in text
    assert "GPU 2 (PCI 0000:00:02.0)" in text and "lists no cardN or renderDN node" in text
    assert "GPU 3: PCI address 'bogus'" in text
    assert "GPUs 4, 5 share the PCI device 0000:c2:00.0" in text
    assert text.count("not fenced") == 4


# ------------------------------------------------------------------ the backends
def test_amd_device_nodes_are_each_gpus_card_and_render_node_from_amd_smis_address(roots, monkeypatch):
    sys_root, dev_root = roots
    monkeypatch.setitem(sys.modules, "amdsmi", make_fake_amdsmi(bdfs={"h0": "0000:C2:00.0", "h1": "0000:c1:00.0"}))
    backend = amd.AmdSmiBackend()
    assert backend.device_nodes(sys_root, dev_root) == {
        0: nodes(dev_root, "card2", "renderD129"),
        1: nodes(dev_root, "card1", "renderD128"),
    }
    assert not any(str(p).endswith("kfd") for ps in backend.device_nodes(sys_root, dev_root).values() for p in ps)


def test_amd_without_the_address_leaves_the_gpus_unfenced_and_says_so(roots, monkeypatch, caplog):
    sys_root, dev_root = roots
    monkeypatch.setitem(sys.modules, "amdsmi", make_fake_amdsmi(unsupported=("amdsmi_get_gpu_device_bdf",)))
    caplog.set_level(logging.WARNING)
    backend = amd.AmdSmiBackend()
    assert len(backend.sample()) == 2  # telemetry unaffected
    assert backend.device_nodes(sys_root, dev_root) == {}
    assert "GPU 0: AMD SMI (amdsmi_get_gpu_device_bdf) does not report its PCI address" in caplog.text


def test_intel_device_nodes_from_xpu_smis_pci_bdf_address(roots):
    sys_root, dev_root = roots
    listing = {"device_list": [
        {"device_id": 0, "device_name": "Intel(R) Data Center GPU Max 1550", "uuid": "u0",
         "pci_bdf_address": "0000:c2:00.0", "memory_physical_size_byte": str(128 * GiB)},
        {"device_id": 1, "device_name": "Intel(R) Data Center GPU Max 1550", "uuid": "u1"},
    ]}
    detail = {"memory_physical_size_byte": str(128 * GiB), "pci_bdf_address": "0000:C1:00.0"}

    def run(args):
        return json.dumps(listing if args == ["discovery", "-j"] else detail)

    backend = intel.IntelBackend(run=run)
    assert backend.device_nodes(sys_root, dev_root) == {
        0: nodes(dev_root, "card2", "renderD129"),
        1: nodes(dev_root, "card1", "renderD128"),  # the address came from `discovery -d 1 -j`
    }


def test_intel_sysfs_backend_takes_each_cards_address_from_its_uevent(roots, tmp_path, monkeypatch):
    sys_root, dev_root = roots
    monkeypatch.setattr(intel.shutil, "which", lambda _: None)
    drm_root = tmp_path / "class-drm"
    make_card(drm_root, "card1")
    (drm_root / "card1" / "device" / "uevent").write_text("DRIVER=xe\nPCI_SLOT_NAME=0000:c1:00.0\n")
    backend = intel.IntelBackend(drm_root=drm_root)
    assert backend.device_nodes(sys_root, dev_root) == {0: nodes(dev_root, "card1", "renderD128")}


# ------------------------------------------------------------------ the agent
def test_the_agent_keeps_every_existing_node_of_each_gpu(roots, tmp_path, monkeypatch):
    sys_root, dev_root = roots
    monkeypatch.setitem(sys.modules, "amdsmi", make_fake_amdsmi(bdfs={"h0": "0000:c1:00.0", "h1": "0000:c2:00.0"}))
    backend = amd.AmdSmiBackend()
    backend.device_nodes = partial(backend.device_nodes, sys_root, dev_root)
    (dev_root / "dri").mkdir(parents=True)
    for name in ("card1", "renderD128", "card2"):  # GPU 1's render node is absent from /dev
        (dev_root / "dri" / name).touch()
    agent = LocalAgent(tmp_path / "state", runner=SimpleNamespace(), backend=backend)
    agent._find_gpu_devices("n1")
    assert agent.gpu_devices == {0: nodes(dev_root, "card1", "renderD128"), 1: nodes(dev_root, "card2")}


class OneNodePerGpu:
    """NVML's shape: one path per GPU (device_nodes of telemetry/nvml.py)."""

    name = "nvml"

    def __init__(self, paths):
        self.paths = paths

    def sample(self):
        return []

    def device_nodes(self):
        return self.paths


def test_the_agent_still_takes_nvidias_single_path_per_gpu(tmp_path, caplog):
    present = tmp_path / "nvidia7"
    present.touch()
    agent = LocalAgent(tmp_path / "state", runner=SimpleNamespace(),
                       backend=OneNodePerGpu({0: str(present), 1: str(tmp_path / "nvidia6")}))
    caplog.set_level(logging.WARNING)
    agent._find_gpu_devices("n1")
    assert agent.gpu_devices == {0: (str(present),)}
    assert f"GPU 1: {tmp_path / 'nvidia6'}" in caplog.text


# ------------------------------------------------------------------ the runner's deny list
LOCAL_MAJOR = 243  # 240-254: "local/experimental use" (Documentation/admin-guide/devices.txt)


@pytest.fixture
def char_nodes(tmp_path):
    """make(name, minor): a real character device node under tmp_path; removed afterwards."""
    made = []

    def make(name, minor):
        path = tmp_path / name
        try:
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(LOCAL_MAJOR, minor))
        except PermissionError as e:
            pytest.skip(f"mknod needs CAP_MKNOD (run the unit tests as root to cover this): {e}")
        made.append(path)
        return str(path)

    yield make
    for path in made:
        path.unlink(missing_ok=True)


def test_the_native_runner_denies_every_node_of_each_gpu_the_job_was_not_given(tmp_path, char_nodes):
    devices = {
        0: (char_nodes("card1", 1), char_nodes("renderD128", 128)),
        1: (char_nodes("card2", 2), char_nodes("renderD129", 129)),
        2: (char_nodes("card3", 3), str(tmp_path / "renderD130")),  # a missing node is skipped
    }
    runner = NativeRunner(tmp_path / "runs", cgroups=SimpleNamespace(version="v1"))
    launch = Launch(job_id=1, uid=0, gid=0, extra_gids=(), home="/", workdir="/", script="true", env={},
                    log_path=str(tmp_path / "log"), gpu_vendor="amd", gpu_indices=(1,),
                    all_gpu_indices=(0, 1, 2), gpu_devices=devices)
    assert runner._denied_devices(launch) == [("c", LOCAL_MAJOR, 1), ("c", LOCAL_MAJOR, 128), ("c", LOCAL_MAJOR, 3)]
    none = Launch(**{**launch.__dict__, "gpu_indices": ()})
    assert len(runner._denied_devices(none)) == 5
    every = Launch(**{**launch.__dict__, "gpu_indices": (0, 1, 2)})
    assert runner._denied_devices(every) == []

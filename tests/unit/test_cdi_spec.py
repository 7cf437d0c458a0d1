"""The node's CDI spec for real GPUs (agent/podman/cdi.py), written from a device folder
made in a temporary directory: NVIDIA's per-GPU and control nodes and driver libraries,
AMD's render node and /dev/kfd, Intel's render node, the render nodes found from each
GPU's PCI address on a sysfs tree of our own (telemetry/drm.py, the lookup native fencing
uses). (Simulated GPUs, with real device nodes, run through podman in
tests/integration/test_containers.py.)"""

from __future__ import annotations

import json
import logging
import sys

import pytest

from mtgpu.agent.podman.cdi import spec_name, write_spec
from mtgpu.agent.telemetry import amd, drm
from tests.unit.telemetry.test_telemetry_amd import make_fake_amdsmi


def touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")


def test_nvidia_gets_its_gpu_node_the_control_nodes_and_the_driver_libraries(tmp_path):
    dev, lib = tmp_path / "dev", tmp_path / "lib"
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        touch(dev / name)
    touch(lib / "libcuda.so.550.1")
    touch(lib / "libnvidia-ml.so.1")
    touch(lib / "libunrelated.so")
    spec = write_spec(spec_name("gpu-1", "k"), {0: "nvidia", 1: "nvidia"}, simulated=False, cdi_dir=tmp_path / "cdi",
                      dev=str(dev), lib_dirs=(str(lib),))
    doc = json.loads(spec.path.read_text())
    assert doc["kind"] == spec.kind == "mtgpu.local/gpu-gpu-1-k"
    assert spec.device_args((1,)) == ["--device", "mtgpu.local/gpu-gpu-1-k=1"]
    assert {d["name"]: d["containerEdits"]["deviceNodes"] for d in doc["devices"]} == {
        "0": [{"path": f"{dev}/nvidia0"}], "1": [{"path": f"{dev}/nvidia1"}]}
    assert {n["path"] for n in doc["containerEdits"]["deviceNodes"]} == {f"{dev}/nvidiactl", f"{dev}/nvidia-uvm"}
    mounted = {m["hostPath"] for m in doc["containerEdits"]["mounts"]}
    assert {f"{lib}/libcuda.so.550.1", f"{lib}/libnvidia-ml.so.1"} <= mounted and f"{lib}/libunrelated.so" not in mounted
    assert all("ro" in m["options"] for m in doc["containerEdits"]["mounts"])


def pci_gpu(sys_root, address, *entries):
    """A PCI device in a sysfs tree of our own, its drm folder listing `entries` (none: no drm folder)."""
    device = sys_root / "bus" / "pci" / "devices" / address
    device.mkdir(parents=True)
    (device / "uevent").write_text(f"DRIVER=amdgpu\nPCI_SLOT_NAME={address}\n")
    for name in entries:
        (device / "drm" / name).mkdir(parents=True)


def device_nodes_of(spec):
    doc = json.loads(spec.path.read_text())
    return {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in doc["devices"]}


def test_amd_gets_its_render_node_and_kfd_and_intel_its_render_node(tmp_path):
    dev = tmp_path / "dev"
    for name in ("dri/card0", "dri/renderD128", "dri/card1", "dri/renderD129", "kfd"):
        touch(dev / name)
    spec = write_spec("n-k", {0: "amd", 1: "intel"}, simulated=False, cdi_dir=tmp_path / "cdi", dev=str(dev),
                      gpu_nodes={0: (f"{dev}/dri/card0", f"{dev}/dri/renderD128"),
                                 1: (f"{dev}/dri/card1", f"{dev}/dri/renderD129")})
    assert device_nodes_of(spec) == {"0": [f"{dev}/dri/renderD128", f"{dev}/kfd"], "1": [f"{dev}/dri/renderD129"]}


def test_an_amd_gpus_render_node_is_the_one_sysfs_lists_under_its_pci_address_not_one_from_its_index(
        tmp_path, monkeypatch):
    """GPU 0 of AMD SMI sits at 0000:c3:00.0, whose render node is renderD131; renderD128 (what
    128 + index would give) exists too, and is another GPU's."""
    sys_root, dev = tmp_path / "sys", tmp_path / "dev"
    pci_gpu(sys_root, "0000:c3:00.0", "card4", "renderD131")
    pci_gpu(sys_root, "0000:c1:00.0", "card1", "renderD128")
    for name in ("dri/card1", "dri/renderD128", "dri/card4", "dri/renderD131", "kfd"):
        touch(dev / name)
    monkeypatch.setitem(sys.modules, "amdsmi", make_fake_amdsmi(bdfs={"h0": "0000:C3:00.0", "h1": "0000:c1:00.0"}))
    backend = amd.AmdSmiBackend()
    gpu_nodes = backend.device_nodes(sys_root, dev)  # what fences native jobs (agent/local.py)
    spec = write_spec("n-k", {0: "amd", 1: "amd"}, simulated=False, cdi_dir=tmp_path / "cdi", dev=str(dev),
                      gpu_nodes=gpu_nodes)
    assert device_nodes_of(spec) == {"0": [f"{dev}/dri/renderD131", f"{dev}/kfd"],
                                     "1": [f"{dev}/dri/renderD128", f"{dev}/kfd"]}
    assert spec.device_args((0,)) == ["--device", f"{spec.kind}=0"]
    assert drm.render_node(gpu_nodes[0]) == f"{dev}/dri/renderD131"


def test_a_gpu_whose_render_node_is_not_found_gets_no_device_and_the_reason_is_said(tmp_path, caplog):
    """GPU 0: its PCI device has no drm folder (no driver bound); GPU 1: sysfs lists only its card
    node; GPU 2: its render node is listed but not in /dev; GPU 3 (Intel): fine. The render
    nodes 128 + index exist, and must not be guessed."""
    sys_root, dev = tmp_path / "sys", tmp_path / "dev"
    pci_gpu(sys_root, "0000:c1:00.0")
    pci_gpu(sys_root, "0000:c2:00.0", "card2")
    pci_gpu(sys_root, "0000:c3:00.0", "card3", "renderD140")
    pci_gpu(sys_root, "0000:c4:00.0", "card4", "renderD133")
    for name in ("dri/renderD128", "dri/renderD129", "dri/renderD130", "dri/card2", "dri/card3",
                 "dri/renderD133", "kfd"):
        touch(dev / name)
    caplog.set_level(logging.WARNING)
    gpu_nodes = drm.nodes_by_gpu({0: "0000:c1:00.0", 1: "0000:c2:00.0", 2: "0000:c3:00.0", 3: "0000:c4:00.0"},
                                 "test SMI", sys_root, dev)
    spec = write_spec("n-k", {0: "amd", 1: "amd", 2: "amd", 3: "intel"}, simulated=False,
                      cdi_dir=tmp_path / "cdi", dev=str(dev), gpu_nodes=gpu_nodes)
    assert device_nodes_of(spec) == {"3": [f"{dev}/dri/renderD133"]}
    assert set(spec.missing) == {0, 1, 2}
    assert "shows no render node for its PCI device: no node" in spec.missing[0]
    assert f"only {dev}/dri/card2" in spec.missing[1]
    assert f"its render node {dev}/dri/renderD140 (from sysfs) is not on this machine" == spec.missing[2]
    for i in (0, 1, 2):
        assert f"GPU {i} (amd) gets no device in the CDI spec, so no container job can be given it" in caplog.text
    with pytest.raises(KeyError, match=r"GPU 2 has no device in the CDI spec .*renderD140 \(from sysfs\)"):
        spec.device_args((3, 2))


def test_without_device_nodes_from_the_backend_an_amd_gpu_gets_no_guessed_render_node(tmp_path, caplog):
    dev = tmp_path / "dev"
    for name in ("dri/renderD128", "kfd"):
        touch(dev / name)
    caplog.set_level(logging.WARNING)
    spec = write_spec("n-k", {0: "amd"}, simulated=False, cdi_dir=tmp_path / "cdi", dev=str(dev))
    assert device_nodes_of(spec) == {}
    assert "reports no device nodes" in spec.missing[0] and "GPU 0 (amd) gets no device" in caplog.text


def test_a_gpu_without_a_device_node_is_not_offered(tmp_path):
    spec = write_spec("n-k", {0: "nvidia"}, simulated=False, cdi_dir=tmp_path / "cdi", dev=str(tmp_path / "dev"))
    try:
        spec.device_args((0,))
    except KeyError as e:
        assert "GPU 0 has no device in the CDI spec" in str(e)
    else:
        raise AssertionError("a GPU without a device node was offered")


def test_an_nvidia_gpus_node_is_the_one_nvml_names_by_its_minor_number(tmp_path):
    dev = tmp_path / "dev"
    touch(dev / "nvidia5")
    spec = write_spec("n-k", {0: "nvidia"}, simulated=False, cdi_dir=tmp_path / "cdi", dev=str(dev),
                      gpu_nodes={0: f"{dev}/nvidia5"})
    doc = json.loads(spec.path.read_text())
    assert doc["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": f"{dev}/nvidia5"}]

"""The node's CDI spec for real GPUs (agent/podman/cdi.py), written from a device folder
made in a temporary directory: NVIDIA's per-GPU and control nodes and driver libraries,
AMD's render node and /dev/kfd, Intel's render node. (Simulated GPUs, with real device
nodes, run through podman in tests/integration/test_containers.py.)"""

from __future__ import annotations

import json

from mtgpu.agent.podman.cdi import spec_name, write_spec


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


def test_amd_gets_its_render_node_and_kfd_and_intel_its_render_node(tmp_path):
    dev = tmp_path / "dev"
    for name in ("dri/renderD128", "dri/renderD129", "kfd"):
        touch(dev / name)
    spec = write_spec("n-k", {0: "amd", 1: "intel"}, simulated=False, cdi_dir=tmp_path / "cdi", dev=str(dev))
    doc = json.loads(spec.path.read_text())
    nodes = {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in doc["devices"]}
    assert nodes == {"0": [f"{dev}/dri/renderD128", f"{dev}/kfd"], "1": [f"{dev}/dri/renderD129"]}


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
                      nvidia_nodes={0: f"{dev}/nvidia5"})
    doc = json.loads(spec.path.read_text())
    assert doc["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": f"{dev}/nvidia5"}]

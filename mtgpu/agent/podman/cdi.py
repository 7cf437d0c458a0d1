"""The node's CDI spec: each of its GPUs as a device a container can be given by name
(`--device KIND=INDEX`), so a container job gets exactly its GPUs.

- NVIDIA: `nvidia-ctk cdi generate` when that tool is installed (it also mounts the
  driver's libraries); else a spec of our own: `/dev/nvidiaN` per GPU (N: the minor number
  NVML reports for it), the control nodes
  (`/dev/nvidiactl`, `/dev/nvidia-uvm`, ...) for every GPU, and the host's
  libcuda/libnvidia-ml libraries and nvidia-smi mounted read-only at their own paths.
- AMD: `/dev/kfd` and the GPU's render node; Intel: its render node. The render node is the
  one sysfs lists under the GPU's PCI device (telemetry/drm.py: the lookup that fences native
  jobs, through the backend's `device_nodes()`), never guessed from the index; a GPU whose
  render node is not found gets no device, with a warning saying why.
- Simulated GPUs: real character device nodes the node creates under
  `/dev/mtgpu/NODE-KEY/gpuN`, with numbers from the majors reserved for local use (240), never
  those of a real device, so the whole path (spec, podman, runc, the node inside the
  container) runs without hardware. Opening one gives ENXIO: there is no driver.

Rootless CDI needs each device node to exist on the host at the same path (TESTING.md).
Two members on one machine (a test cluster) each have their own kind, file and device
folder: all named by the node's name and a key of its STATE_DIR (spec_name).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from ..telemetry import drm

log = logging.getLogger(__name__)

CDI_DIR = Path("/var/run/cdi")
SIM_MAJOR = 240  # "local/experimental use" (Documentation/admin-guide/devices.txt)
NVIDIA_CONTROL = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
NVIDIA_LIBS = ("libcuda.so*", "libnvidia-ml.so*", "libnvidia-ptxjitcompiler.so*", "libnvidia-nvvm.so*")
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu")


def slug(node_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", node_name)[:60] or "node"


def spec_name(node_name: str, key: str) -> str:
    """What names this member's spec, kind and device folder: its name and a key of its
    STATE_DIR, so two members on one machine (even with one name) never share them."""
    return f"{slug(node_name)}-{key}"


@dataclass
class CdiSpec:
    """What was written: the kind, the device name of each GPU index, and the file."""

    kind: str
    devices: dict[int, str] = field(default_factory=dict)
    path: Path | None = None
    source: str = ""  # "mtgpu", "nvidia-ctk"
    sim_nodes: list[str] = field(default_factory=list)
    missing: dict[int, str] = field(default_factory=dict)  # GPU index -> why it has no device

    def device_args(self, indices: tuple[int, ...]) -> list[str]:
        """podman arguments that give a container these GPUs."""
        out = []
        for i in indices:
            name = self.devices.get(i)
            if name is None:
                why = f": {self.missing[i]}" if i in self.missing else ""
                raise KeyError(f"GPU {i} has no device in the CDI spec {self.path} (kind {self.kind}){why}")
            out += ["--device", f"{self.kind}={name}"]
        return out


def sim_device_number(name: str, index: int) -> tuple[int, int]:
    return SIM_MAJOR, (zlib.crc32(name.encode()) % 1024) * 1024 + index


def sim_device_path(name: str, index: int) -> str:
    return f"/dev/mtgpu/{name}/gpu{index}"


def make_sim_nodes(name: str, indices: list[int]) -> list[str]:
    """Create (or fix) the simulated GPUs' device nodes (`name`: spec_name()); returns their paths."""
    paths = []
    for i in indices:
        path = sim_device_path(name, i)
        major, minor = sim_device_number(name, i)
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        try:
            st = os.lstat(path)
            if not stat.S_ISCHR(st.st_mode) or st.st_rdev != os.makedev(major, minor):
                os.unlink(path)
                raise FileNotFoundError
        except FileNotFoundError:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        os.chmod(path, 0o666)
        paths.append(path)
    return paths


def remove_sim_nodes(name: str) -> None:
    shutil.rmtree(f"/dev/mtgpu/{name}", ignore_errors=True)
    try:
        os.rmdir("/dev/mtgpu")
    except OSError:
        pass


def _paths(nodes: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    """A GPU's entry of `device_nodes()`: one path (NVML) or several (DRM), as a tuple."""
    if not nodes:
        return ()
    return (nodes,) if isinstance(nodes, str) else tuple(nodes)


def _nvidia_own(indices: list[int], dev: str, lib_dirs: tuple[str, ...],
                nodes: dict[int, str | tuple[str, ...]] | None) -> tuple[dict, list[dict], dict[int, str]]:
    control = [p.replace("/dev", dev, 1) for p in NVIDIA_CONTROL]
    common_nodes = [{"path": p} for p in control if os.path.exists(p)]
    mounts = []
    for d in lib_dirs:
        for pattern in NVIDIA_LIBS:
            for f in sorted(glob.glob(os.path.join(d, pattern))):
                mounts.append({"hostPath": f, "containerPath": f, "options": ["ro", "nosuid", "nodev", "bind"]})
    smi = shutil.which("nvidia-smi")
    if smi:
        mounts.append({"hostPath": smi, "containerPath": "/usr/bin/nvidia-smi", "options": ["ro", "nosuid", "nodev", "bind"]})
    path = {i: (_paths((nodes or {}).get(i)) or (f"{dev}/nvidia{i}",))[0] for i in indices}
    devices = [{"name": str(i), "containerEdits": {"deviceNodes": [{"path": path[i]}]}}
               for i in indices if os.path.exists(path[i])]
    missing = {i: f"its device node {path[i]} is not on this machine" for i in indices if not os.path.exists(path[i])}
    return {"deviceNodes": common_nodes, "mounts": mounts}, devices, missing


def _drm_device(index: int, vendor: str, nodes: tuple[str, ...] | None, kfd: str) -> tuple[dict | None, str]:
    """The CDI device of an AMD or Intel GPU from its DRM nodes (drm.nodes_by_gpu, through the
    backend's `device_nodes()`; None: the backend reports none): its render node, and
    /dev/kfd for AMD; else None and why."""
    if nodes is None:
        return None, "the GPU backend reports no device nodes (device_nodes()), so its render node is unknown"
    render = drm.render_node(nodes)
    if render is None:
        found = f"only {', '.join(nodes)}" if nodes else "no node (the warning from mtgpu.agent.telemetry.drm says why)"
        return None, f"sysfs shows no render node for its PCI device: {found}"
    if not os.path.exists(render):
        return None, f"its render node {render} (from sysfs) is not on this machine"
    edits = [{"path": render}] + ([{"path": kfd}] if vendor == "amd" and os.path.exists(kfd) else [])
    return {"name": str(index), "containerEdits": {"deviceNodes": edits}}, ""


def write_spec(name: str, vendor_by_index: dict[int, str], simulated: bool,
               cdi_dir: Path = CDI_DIR, dev: str = "/dev", lib_dirs: tuple[str, ...] = LIB_DIRS,
               gpu_nodes: dict[int, str | tuple[str, ...]] | None = None) -> CdiSpec:
    """Write this member's spec for its GPUs (index -> vendor; `name`: spec_name()); returns
    what a job needs. `dev`, `lib_dirs`: where /dev/kfd, NVIDIA's control nodes and the
    driver libraries are. `gpu_nodes`: each GPU's device nodes as the backend's
    `device_nodes()` gives them, the same that fence native jobs (agent/local.py): NVIDIA's
    /dev/nvidiaN by NVML's minor number; AMD's and Intel's /dev/dri nodes of the GPU's PCI
    device (telemetry/drm.py), of which the device takes the render node. A GPU whose node
    is not found or not on this machine gets no device (its reason in `missing`, and a
    warning), as native fencing leaves such a GPU out: never a node guessed from the index."""
    kind = f"mtgpu.local/gpu-{name}"
    indices = sorted(vendor_by_index)
    spec = CdiSpec(kind=kind, source="mtgpu")
    common: dict = {}
    devices: list[dict] = []
    if simulated:
        spec.sim_nodes = make_sim_nodes(name, indices)
        devices = [{"name": str(i), "containerEdits": {"deviceNodes": [{"path": p}]}}
                   for i, p in zip(indices, spec.sim_nodes)]
    else:
        nvidia = [i for i in indices if vendor_by_index[i] == "nvidia"]
        if nvidia and shutil.which("nvidia-ctk"):
            return _nvidia_ctk(name, nvidia, cdi_dir)
        if nvidia:
            common, devices, spec.missing = _nvidia_own(nvidia, dev, lib_dirs, gpu_nodes)
        kfd = f"{dev}/kfd"
        for i in indices:
            v = vendor_by_index[i]
            if v not in ("amd", "intel"):
                continue
            device, why = _drm_device(i, v, None if gpu_nodes is None else _paths(gpu_nodes.get(i)), kfd)
            if device is None:
                spec.missing[i] = why
                log.warning("GPU %d (%s) gets no device in the CDI spec, so no container job can be given it: %s",
                            i, v, why)
            else:
                devices.append(device)
    spec.devices = {int(d["name"]): d["name"] for d in devices}
    doc = {"cdiVersion": "0.5.0", "kind": kind, "devices": devices, "containerEdits": common}
    cdi_dir.mkdir(parents=True, exist_ok=True)
    path = cdi_dir / f"mtgpu-{name}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    spec.path = path
    return spec


def _nvidia_ctk(name: str, indices: list[int], cdi_dir: Path) -> CdiSpec:
    path = cdi_dir / f"mtgpu-{name}-nvidia.yaml"
    cdi_dir.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["nvidia-ctk", "cdi", "generate", f"--output={path}", "--device-name-strategy=index"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise OSError(f"nvidia-ctk cdi generate failed: {r.stderr.strip()[-500:]}")
    return CdiSpec(kind="nvidia.com/gpu", devices={i: str(i) for i in indices}, path=path, source="nvidia-ctk")


def remove_spec(spec: CdiSpec, name: str) -> None:
    if spec.path is not None:
        try:
            spec.path.unlink()
        except FileNotFoundError:
            pass
    if spec.sim_nodes:
        remove_sim_nodes(name)

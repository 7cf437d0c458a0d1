"""The node's CDI spec: each of its GPUs as a device a container can be given by name
(`--device KIND=INDEX`), so a container job gets exactly its GPUs.

- NVIDIA: `nvidia-ctk cdi generate` when that tool is installed (it also mounts the
  driver's libraries); else a spec of our own: `/dev/nvidiaN` per GPU (N: the minor number
  NVML reports for it), the control nodes
  (`/dev/nvidiactl`, `/dev/nvidia-uvm`, ...) for every GPU, and the host's
  libcuda/libnvidia-ml libraries and nvidia-smi mounted read-only at their own paths.
- AMD: `/dev/kfd` and the GPU's render node; Intel: its render node.
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
import os
import re
import shutil
import stat
import subprocess
import zlib
from dataclasses import dataclass, field
from pathlib import Path

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

    def device_args(self, indices: tuple[int, ...]) -> list[str]:
        """podman arguments that give a container these GPUs."""
        out = []
        for i in indices:
            name = self.devices.get(i)
            if name is None:
                raise KeyError(f"GPU {i} has no device in the CDI spec {self.path} (kind {self.kind})")
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


def _nvidia_own(indices: list[int], dev: str, lib_dirs: tuple[str, ...],
                nodes: dict[int, str] | None) -> tuple[dict, list[dict]]:
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
    path = {i: (nodes or {}).get(i, f"{dev}/nvidia{i}") for i in indices}
    devices = [{"name": str(i), "containerEdits": {"deviceNodes": [{"path": path[i]}]}}
               for i in indices if os.path.exists(path[i])]
    return {"deviceNodes": common_nodes, "mounts": mounts}, devices


def _render_node(index: int, dev: str) -> str:
    return f"{dev}/dri/renderD{128 + index}"


def write_spec(name: str, vendor_by_index: dict[int, str], simulated: bool,
               cdi_dir: Path = CDI_DIR, dev: str = "/dev", lib_dirs: tuple[str, ...] = LIB_DIRS,
               nvidia_nodes: dict[int, str] | None = None) -> CdiSpec:
    """Write this member's spec for its GPUs (index -> vendor; `name`: spec_name()); returns
    what a job needs. `dev`, `lib_dirs`: where device nodes and driver libraries are;
    `nvidia_nodes`: each NVIDIA GPU's device node as NVML says (its minor number)."""
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
            common, devices = _nvidia_own(nvidia, dev, lib_dirs, nvidia_nodes)
        kfd = f"{dev}/kfd"
        for i in indices:
            v = vendor_by_index[i]
            if v in ("amd", "intel") and os.path.exists(_render_node(i, dev)):
                nodes = [{"path": _render_node(i, dev)}] + ([{"path": kfd}] if v == "amd" and os.path.exists(kfd) else [])
                devices.append({"name": str(i), "containerEdits": {"deviceNodes": nodes}})
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

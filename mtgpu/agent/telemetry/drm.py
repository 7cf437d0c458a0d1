"""A GPU's DRM device nodes, found from its PCI address through sysfs (AMD and Intel fencing).

The kernel lists a PCI device's DRM minors in /sys/bus/pci/devices/DOMAIN:BUS:DEV.FN/drm/:
`cardN` (the primary node, /dev/dri/cardN) and `renderDNNN` (the render node,
/dev/dri/renderDNNN). A job that was not given a GPU is denied both (docs/ISOLATION.md).
On AMD, /dev/kfd is one node for every GPU and stays open: when a process opens a GPU
through it, the amdgpu KFD driver checks the device cgroup's permission on that GPU's
render node, so denying the render node also keeps ROCm compute off the GPU.

NVML prints PCI addresses with an 8-digit domain ("00000000:01:00.0"), AMD SMI and sysfs
with 4 digits ("0000:c1:00.0"); case varies. `normalize_pci_address` gives sysfs's form.

The same lookup (`nodes_by_gpu`, through each backend's `device_nodes()`) serves the
fencing of native jobs (agent/local.py) and the CDI spec of container jobs
(agent/podman/cdi.py, which takes each GPU's render node from it with `render_node`).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

log = logging.getLogger(__name__)

SYS_ROOT = Path("/sys")
DEV_ROOT = Path("/dev")

_PCI_ADDRESS = re.compile(r"^(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$")
_CARD = re.compile(r"^card(\d+)$")
_RENDER = re.compile(r"^renderD(\d+)$")


def normalize_pci_address(address: str) -> str:
    """`address` as sysfs names the device: lower case, a domain of at least 4 hex digits
    (VMD domains have 5), 2-digit bus and device, 1-digit function. A missing domain is 0.
    Raises ValueError naming the value when it is no PCI address."""
    text = str(address).strip().lower()
    m = _PCI_ADDRESS.match(text)
    if m is None or int(m.group(3), 16) > 0x1F:
        raise ValueError(f"PCI address {address!r} is not DOMAIN:BUS:DEVICE.FUNCTION in hex "
                         "(e.g. 0000:c1:00.0, device at most 1f, function at most 7)")
    domain, bus, device, function = (int(g, 16) if g else 0 for g in m.groups())
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def drm_nodes(pci_address: str, sys_root: Path = SYS_ROOT, dev_root: Path = DEV_ROOT) -> tuple[str, ...]:
    """The /dev paths of the DRM nodes of the PCI device `pci_address`: its card nodes, then
    its render nodes, each in number order; () when the device has no drm directory (no
    DRM driver bound, or not a GPU). Raises ValueError for an address that is none, and
    OSError when the drm directory exists but cannot be read."""
    drm = Path(sys_root) / "bus" / "pci" / "devices" / normalize_pci_address(pci_address) / "drm"
    if not drm.is_dir():
        return ()
    cards, renders = [], []
    for entry in drm.iterdir():
        for pattern, found in ((_CARD, cards), (_RENDER, renders)):
            m = pattern.match(entry.name)
            if m:
                found.append((int(m.group(1)), entry.name))
    return tuple(str(Path(dev_root) / "dri" / name) for _, name in sorted(cards) + sorted(renders))


def render_node(nodes: str | tuple[str, ...] | list[str] | None) -> str | None:
    """The render node (/dev/dri/renderDNNN) among a GPU's DRM nodes as `drm_nodes` or
    `nodes_by_gpu` give them (the lowest-numbered when there are several); None when there is none."""
    if not nodes:
        return None
    found = []
    for path in (nodes,) if isinstance(nodes, str) else nodes:
        m = _RENDER.match(Path(path).name)
        if m:
            found.append((int(m.group(1)), str(path)))
    return min(found)[1] if found else None


def pci_address_of(device_dir: Path) -> str | None:
    """The PCI address of a sysfs device directory (e.g. /sys/class/drm/card1/device): its
    uevent's PCI_SLOT_NAME, else the name the directory links to; None when neither is one."""
    device_dir = Path(device_dir)
    try:
        for line in (device_dir / "uevent").read_text().splitlines():
            key, _, value = line.partition("=")
            if key == "PCI_SLOT_NAME":
                return normalize_pci_address(value)
    except (OSError, ValueError):
        pass
    try:
        return normalize_pci_address(device_dir.resolve().name)
    except (OSError, ValueError):
        return None


def nodes_by_gpu(pci_by_index: dict[int, str | None], source: str,
                 sys_root: Path = SYS_ROOT, dev_root: Path = DEV_ROOT) -> dict[int, tuple[str, ...]]:
    """Each GPU's DRM nodes, by GPU index, from its PCI address (`source` names who reported
    the addresses, for the warnings). A GPU is left out, with a warning saying it is not
    fenced, when its address is unknown or malformed, when sysfs shows no DRM node for it,
    or when it shares its PCI device with another GPU (a partitioned GPU, whose partitions'
    nodes are not under the PCI device): denying those nodes to a job that holds the other
    GPU of the pair would deny it its own."""
    addresses: dict[int, str] = {}
    for index, address in sorted(pci_by_index.items()):
        if not address:
            log.warning("GPU %d: %s does not report its PCI address, so its DRM nodes are unknown and it is not "
                        "fenced off other jobs (every native job can open it)", index, source)
            continue
        try:
            addresses[index] = normalize_pci_address(address)
        except ValueError as e:
            log.warning("GPU %d: %s; reported by %s. It is not fenced off other jobs", index, e, source)
    sharing: dict[str, list[int]] = {}
    for index, address in addresses.items():
        sharing.setdefault(address, []).append(index)
    out: dict[int, tuple[str, ...]] = {}
    for index, address in addresses.items():
        if len(sharing[address]) > 1:
            if index == sharing[address][0]:
                log.warning("GPUs %s share the PCI device %s (a partitioned GPU): their DRM nodes cannot be told "
                            "apart from sysfs, so they are not fenced off other jobs",
                            ", ".join(map(str, sharing[address])), address)
            continue
        where = Path(sys_root) / "bus" / "pci" / "devices" / address / "drm"
        try:
            nodes = drm_nodes(address, sys_root, dev_root)
        except OSError as e:
            log.warning("GPU %d: %s cannot be read (%s): it is not fenced off other jobs", index, where, e)
            continue
        if not nodes:
            log.warning("GPU %d (PCI %s): %s lists no cardN or renderDN node (is the GPU's DRM driver bound?): "
                        "it is not fenced off other jobs", index, address, where)
            continue
        out[index] = nodes
    return out

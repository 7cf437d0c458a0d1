"""A node's container side, made at start when `[CONTAINERS] enabled = true`: the tenants'
Podman settings, the CDI spec for its GPUs, the staged images, and the container runner."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ...workspaces.feature_archive import StagedArchive
from ..runners.cgroups import parent_for
from ..runners.podman import ContainerRunner
from ..telemetry.base import GpuBackend
from .cdi import CdiSpec, remove_spec, spec_name, write_spec
from .images import ImageStore
from .tenant import PodmanHost, PodmanSetupError, podman_available

log = logging.getLogger(__name__)

SAVED_PREFIX = "localhost/mtgpu-saved/"  # + TENANT/NAME:TAG: saved workspaces, their tenant's only


@dataclass(frozen=True)
class ContainerSettings:
    """[CONTAINERS] as the agent needs it (the server builds it from the config)."""

    images: tuple[str, ...] = ()  # staged: `images` and the templates' images
    images_dir: Path | None = None  # default STATE_DIR/images
    registry_auth_file: Path | None = None
    cache_volume: str = "mtgpu-cache"
    network: str = "slirp4netns"
    allow_user_images: bool = False
    read_only: tuple[str, ...] = ()  # DATASETS_DIRECTORIES and PYTHON_INTERPRETERS roots
    features: Mapping[str, StagedArchive] = field(default_factory=dict)  # [CONTAINERS] features, read at start


@dataclass
class ContainerSetup:
    settings: ContainerSettings
    podman: PodmanHost
    images: ImageStore
    cdi: CdiSpec | None
    runner: ContainerRunner
    node_name: str
    _threads: list[threading.Thread] = field(default_factory=list)

    def capabilities(self) -> dict:
        """What this member tells the cluster (node.register): the images it offers and
        which of them are staged here."""
        st = self.images.state
        saved = sorted(n for n in st.ready if n.startswith(SAVED_PREFIX))  # `mt-container save` here
        return {"images": list(self.settings.images) + saved, "staged": dict(sorted(st.ready.items())),
                "failed": dict(sorted(st.failed.items())), "user_images": self.settings.allow_user_images}

    def sweep_later(self) -> None:
        def sweep() -> None:
            try:
                removed = self.runner.sweep(self.runner.active_tokens())
                if removed:
                    log.info("removed %d container(s) no run owns: %s", len(removed), ", ".join(removed))
            except Exception as e:  # never fatal: the next start sweeps again
                log.warning("could not look for leftover containers: %s", e, exc_info=True)
        t = threading.Thread(target=sweep, name="container-sweep", daemon=True)
        t.start()
        self._threads.append(t)

    def close(self) -> None:
        self.runner.ports.close()
        if self.cdi is not None:
            remove_spec(self.cdi, spec_name(self.node_name, self.podman.key))


def open_tun(path: str = "/dev/net/tun") -> None:
    """Rootless user-mode networking opens /dev/net/tun as the tenant: give it the mode a
    stock Debian has (0666; the kernel checks CAP_NET_ADMIN in the namespace that owns a
    device, so this lets no one configure the host's network)."""
    try:
        mode = os.stat(path).st_mode & 0o777
        if mode != 0o666:
            os.chmod(path, 0o666)
            log.warning("%s had mode %o; set to 666 so that rootless containers get a network", path, mode)
    except OSError as e:
        log.warning("%s: %s; rootless containers with network = slirp4netns may fail", path, e)


def open_containers(state_dir: Path, node_name: str, settings: ContainerSettings, backend: GpuBackend) -> ContainerSetup:
    why = podman_available()
    if why:
        raise PodmanSetupError(f"[CONTAINERS] enabled = true, but {why}")
    podman = PodmanHost(state_dir)
    podman.setup()
    if settings.network in ("slirp4netns", "pasta"):
        open_tun()
    gpus = backend.sample()
    nodes = getattr(backend, "device_nodes", None)  # NVML: each GPU's node from its minor number
    cdi = write_spec(spec_name(node_name, podman.key), {g.index: g.vendor for g in gpus},
                     simulated=backend.name == "simulated", gpu_nodes=nodes() if nodes else None) if gpus else None
    root_env = {"CONTAINERS_CONF": str(podman.root / "containers.conf"),
                "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
    images = ImageStore(settings.images_dir or state_dir / "images", root_env, settings.registry_auth_file)
    images.setup()
    runner = ContainerRunner(state_dir / "runs", cgroup_parent=parent_for(node_name, state_dir), node_name=node_name,
                             podman=podman, images=images, cdi=cdi, read_only=list(settings.read_only),
                             cache_volume=settings.cache_volume, network=settings.network)
    setup = ContainerSetup(settings, podman, images, cdi, runner, node_name)
    if settings.images:
        setup._threads.append(images.start_staging(list(settings.images)))
    return setup

"""Run one node in the foreground: the local socket API, the network API, the loop."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
from pathlib import Path

import uvicorn

from ..agent.local import LocalAgent
from ..agent.podman.setup import ContainerSettings
from ..config import Config
from ..state.journal import JournaledState
from ..storage.shared import interpreter_publish_root
from ..workspaces.feature_archive import FeatureArchiveError, read_all_staged
from .api.routes import local_app, public_app
from .cluster.errors import ClusterSetupError
from .cluster.link import open_cluster_member
from .api.identity import PeerCredProtocol
from .api.report_protocol import report_protocol
from .member.runtime import Member
from .ports import take_ports
from .api.service import MemberService
from .api.tenants import TenantService

log = logging.getLogger(__name__)


def simulated_gpu_dicts(config: Config) -> list[dict]:
    """The config's [[SIMULATED_GPUS]] in the telemetry layer's key names."""
    return [
        {
            "model": g.model,
            "vendor": g.vendor,
            "vram_bytes": g.vram,
            "count": g.count,
            "used_vram_bytes": g.used_vram,
            "utilization_pct": g.utilization,
        }
        for g in config.SIMULATED_GPUS
    ]


def prepare_state_dir(state_dir: Path) -> None:
    """STATE_DIR is world-traversable (tenants reach the socket and their own log
    folders); the journal, runner and agent folders inside it are root-only."""
    state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o755)
    logs = state_dir / "logs"
    logs.mkdir(exist_ok=True)
    os.chmod(logs, 0o755)


def container_settings(config: Config) -> ContainerSettings | None:
    """[CONTAINERS] for the agent; None when containers are off. Raises ClusterSetupError
    for a registry_auth_file others could read (tenants never see the credentials)."""
    c = config.CONTAINERS
    if not c.enabled:
        return None
    if c.registry_auth_file is not None:
        try:
            st = os.stat(c.registry_auth_file)
        except OSError as e:
            raise ClusterSetupError(f"[CONTAINERS] registry_auth_file = {str(c.registry_auth_file)!r}: {e.strerror}; "
                                    "give the path of a containers-auth.json") from None
        if st.st_uid != 0 or st.st_mode & 0o077:
            raise ClusterSetupError(f"[CONTAINERS] registry_auth_file = {str(c.registry_auth_file)!r} is not root's "
                                    f"alone (mode {st.st_mode & 0o777:o}, owner uid {st.st_uid}); tenants must never "
                                    f"read it: chown root {c.registry_auth_file} && chmod 600 {c.registry_auth_file}")
    try:  # the staged Features' archives, read and checked once, as root (docs/CONTAINERS.md)
        features = read_all_staged({k: str(v) for k, v in c.features.items()})
    except FeatureArchiveError as e:
        raise ClusterSetupError(str(e)) from None
    shared = config.HOME_LAYOUT == "shared"
    # the same paths the node publishes read-only (an interpreter inside ENV/bin: all of ENV)
    read_only = [str(p) for p in config.DATASETS_DIRECTORIES] + [
        str(interpreter_publish_root(Path(p.path))) for p in config.PYTHON_INTERPRETERS]
    return ContainerSettings(
        images=tuple(c.allowed_images()),
        images_dir=Path(config.TENANT_HOME_ROOT) / ".mtgpu-images" if shared else None,
        registry_auth_file=c.registry_auth_file, cache_volume=c.cache_volume, network=c.network,
        allow_user_images=c.allow_user_images, read_only=tuple(read_only), features=features)


def make_directlink(config: Config, secret: str):
    """The member's DirectLink side, started, when [DIRECTLINK] names relays or relay_listen."""
    dl = config.DIRECTLINK
    if not (config.is_cluster and dl.enabled and (dl.relays or dl.relay_listen)):
        return None
    from .member.directlink import MemberDirectLink
    link = MemberDirectLink(config, secret)
    link.start()
    return link


def hold_member_above_jobs(agent: LocalAgent) -> None:
    """This process into its services group, weighted above its jobs (runners/cgroups.py),
    before its first job starts: jobs that burn every CPU must not delay its reports, Raft
    and API until it is taken for dead (issue 23). The agent's close() takes it back out."""
    cgroups = getattr(agent.runner, "cgroups", None)
    why = cgroups.hold_member() if cgroups is not None else "the runner has no cgroups"
    if why:
        log.warning("this member's own work is not weighted above its jobs (%s): jobs that keep every CPU busy "
                    "can delay its reports past MEMBER_DOWN_AFTER_S", why)


def open_sessions_if_asked(agent: LocalAgent, setting: str) -> None:
    """SESSION_GPUS = "all" (a single-user workstation): what tenants run outside their jobs
    may open every GPU; the default "none" keeps the sessions group fenced (docs/ISOLATION.md)."""
    cgroups = getattr(agent.runner, "cgroups", None)
    if setting == "all" and cgroups is not None:
        cgroups.open_sessions()
        log.warning('SESSION_GPUS = "all": tenants\' SSH sessions and their own podman can open every GPU of this '
                    "node, also the ones other tenants' jobs hold")


def build_service(config: Config) -> MemberService:
    state_dir = Path(config.STATE_DIR)
    prepare_state_dir(state_dir)
    agent = LocalAgent.open(state_dir, config.GPU_BACKEND, simulated_gpu_dicts(config), node_name=config.NODE_NAME,
                            containers=container_settings(config))
    open_sessions_if_asked(agent, config.SESSION_GPUS)
    hold_member_above_jobs(agent)
    links = []

    def directlink(secret: str):
        link = make_directlink(config, secret)
        if link is not None:
            links.append(link)
        return link

    try:
        if config.CLUSTER_MODE == "cluster":
            member = open_cluster_member(config, agent, directlink)
        else:
            member = Member(config, agent, JournaledState(state_dir / "state"))
    except BaseException:
        agent.close()  # its device nodes and CDI spec go with it
        for link in links:
            link.stop()
        raise
    service = MemberService(member)
    if links:
        links[0].attach(member)
        service.directlink = links[0]
    return service


class QuietServer(uvicorn.Server):
    """uvicorn's server, whose main loop wakes once a second instead of ten times (an idle
    member's two servers woke its event loop 20 times a second for nothing: issue 28 target
    5). It refreshes the Date header once a second as uvicorn does; `stop()` ends it at once."""

    WAKE_S = 1.0

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._stopping: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._stopping = asyncio.Event()
        if self.should_exit:
            return
        counter = 0  # uvicorn's on_tick refreshes the Date header when counter % 10 == 0
        while not await self.on_tick(counter):
            try:
                await asyncio.wait_for(self._stopping.wait(), self.WAKE_S)
            except asyncio.TimeoutError:
                pass
            counter = (counter + 10) % 864000

    def stop(self) -> None:
        self.should_exit = True
        if self._stopping is not None:
            self._stopping.set()


async def _serve(service: MemberService, config: Config, public_sock: socket.socket) -> None:
    host, port = config.listen_host_port()
    sock_path = str(config.socket_path)
    quiet = {"log_level": "warning", "access_log": False, "lifespan": "off"}
    tenants = TenantService(service)
    local = QuietServer(uvicorn.Config(local_app(service, tenants), uds=sock_path, http=PeerCredProtocol,
                                          timeout_keep_alive=30, **quiet))
    link = service.member.link
    fast = {"http": report_protocol(link)} if link.is_cluster else {}  # members' reports, ahead of the app
    public = QuietServer(uvicorn.Config(public_app(service, tenants), host=host, port=port, **fast, **quiet))
    for server in (local, public):
        server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(local.serve()), asyncio.create_task(public.serve(sockets=[public_sock]))]
    log.info("node %s serving on %s and %s:%d", config.NODE_NAME, sock_path, host, port)
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
    for task in done:
        if task is not stopper and task.exception():
            log.error("an API server stopped: %s", task.exception())
    local.stop()
    public.stop()
    await asyncio.gather(*tasks, return_exceptions=True)


def event_loop_factory():
    """uvloop's loop where it is installed (it is a dependency on Linux): the event loop
    serves every member's report once a second, and uvloop's takes about half the CPU of
    asyncio's for each (bench/telemetry.py); asyncio's otherwise."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


# The cyclic collector's first generation runs after this many more allocations than
# frees (700 by default). Every member's report makes objects that live a second (its
# telemetry replaces the last one): collected every 700, they outlived two collections,
# reached the oldest generation and made full collections run every few seconds, ~4% of a
# core and pauses of up to 100 ms at a thousand members (bench/telemetry.py). At 50,000
# they are freed (by reference counting) before a collection finds them.
GC_THRESHOLDS = (50_000, 50, 100)


def run_node(config: Config) -> int:
    gc.set_threshold(*GC_THRESHOLDS)
    public_sock = take_ports(config)  # a port in use stops the start here, before anything is announced
    try:
        service = build_service(config)
        gc.freeze()  # what the start made (modules, the replayed state) is not scanned again
        link = service.directlink
        service.member.start()
        try:
            with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
                runner.run(_serve(service, config, public_sock))
        finally:
            service.member.stop()
            if link is not None:
                link.stop()
    finally:
        public_sock.close()
    return 0

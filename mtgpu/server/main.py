"""Run one node in the foreground: the local socket API, the network API, the loop."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

import uvicorn

from ..agent.local import LocalAgent
from ..config import Config
from ..state.journal import JournaledState
from .api.routes import local_app, public_app
from .cluster.link import open_cluster_member
from .api.identity import PeerCredProtocol
from .member.runtime import Member
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


def build_service(config: Config) -> MemberService:
    state_dir = Path(config.STATE_DIR)
    prepare_state_dir(state_dir)
    agent = LocalAgent.open(state_dir, config.GPU_BACKEND, simulated_gpu_dicts(config), node_name=config.NODE_NAME)
    if config.CLUSTER_MODE == "cluster":
        member = open_cluster_member(config, agent)
    else:
        member = Member(config, agent, JournaledState(state_dir / "state"))
    return MemberService(member)


async def _serve(service: MemberService, config: Config) -> None:
    host, port = config.listen_host_port()
    sock_path = str(config.socket_path)
    quiet = {"log_level": "warning", "access_log": False, "lifespan": "off"}
    tenants = TenantService(service)
    local = uvicorn.Server(uvicorn.Config(local_app(service, tenants), uds=sock_path, http=PeerCredProtocol,
                                          timeout_keep_alive=30, **quiet))
    public = uvicorn.Server(uvicorn.Config(public_app(service, tenants), host=host, port=port, **quiet))
    for server in (local, public):
        server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(local.serve()), asyncio.create_task(public.serve())]
    log.info("node %s serving on %s and %s:%d", config.NODE_NAME, sock_path, host, port)
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
    for task in done:
        if task is not stopper and task.exception():
            log.error("an API server stopped: %s", task.exception())
    local.should_exit = public.should_exit = True
    await asyncio.gather(*tasks, return_exceptions=True)


def run_node(config: Config) -> int:
    service = build_service(config)
    service.member.start()
    try:
        asyncio.run(_serve(service, config))
    finally:
        service.member.stop()
    return 0

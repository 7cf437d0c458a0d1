"""HTTP routes: thin wrappers over server.service.

Two apps. `local_app` is served on the Unix socket: callers are identified by the
kernel (SO_PEERCRED) and may submit, list, cancel and read logs. `public_app` is
served on LISTEN for clients off the node; until key authentication exists it
answers health and metadata only, and has no route that could accept a job.
"""

from __future__ import annotations

import base64
import json

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from ..state.raft import ReplicationError
from .cluster_errors import ClusterSetupError
from .identity import Caller, caller_from_peer
from .service import NodeService, ServiceError


class SubmitRequest(BaseModel):
    script: str = Field(description="the job file's text")
    overrides: dict[str, str] = Field(default_factory=dict, description="directives given as CLI flags")
    workdir: str | None = Field(default=None, description="where the job starts (default: the tenant's home)")


class DrainRequest(BaseModel):
    reason: str = ""


def _error_response(_request: Request, exc: ServiceError) -> JSONResponse:
    return JSONResponse(status_code=exc.status, content={"error": str(exc), "refused": exc.refused})


def local_app(service: NodeService) -> FastAPI:
    app = FastAPI(title="mtgpu node (local socket)", docs_url=None, redoc_url=None)
    app.add_exception_handler(ServiceError, _error_response)
    admin_group = service.config.ADMIN_GROUP

    def caller(request: Request) -> Caller:
        c = caller_from_peer(getattr(request.state, "peer", None), admin_group, getattr(request.state, "memo", None))
        if c is None:
            raise ServiceError(401, "the caller could not be identified (connect through the Unix socket)")
        return c

    @app.get("/v1/health")
    async def health() -> dict:
        return {"ok": True, **service.info()}

    @app.get("/v1/whoami")
    def whoami(request: Request) -> dict:
        c = caller(request)
        return {"name": c.name, "uid": c.uid, "gid": c.gid, "admin": c.is_admin}

    @app.post("/v1/jobs")
    async def submit(body: SubmitRequest, request: Request) -> dict:
        return await service.submit(caller(request), body.script, body.overrides, body.workdir)

    @app.get("/v1/jobs")
    def list_jobs(request: Request, all: bool = False, active: bool = False) -> list[dict]:
        return service.list_jobs(caller(request), all_tenants=all, include_final=not active)

    @app.get("/v1/jobs/{job_id}")
    def show(job_id: int, request: Request) -> dict:
        return service.show(caller(request), job_id)

    @app.post("/v1/jobs/{job_id}/cancel")
    def cancel(job_id: int, request: Request) -> dict:
        return service.cancel(caller(request), job_id)

    @app.get("/v1/jobs/{job_id}/log")
    def log(job_id: int, request: Request, offset: int = 0) -> dict:
        return service.read_log(caller(request), job_id, offset)

    @app.get("/v1/nodes")
    def nodes(request: Request) -> list[dict]:
        return service.nodes(caller(request))

    @app.post("/v1/nodes/{name}/drain")
    def drain(name: str, body: DrainRequest, request: Request) -> dict:
        return service.set_drain(caller(request), name, True, body.reason)

    @app.post("/v1/nodes/{name}/resume")
    def resume(name: str, request: Request) -> dict:
        return service.set_drain(caller(request), name, False)

    @app.post("/v1/nodes/{name}/remove")
    def remove(name: str, request: Request) -> dict:
        return service.remove_node(caller(request), name)

    return app


def public_app(service: NodeService) -> FastAPI:
    app = FastAPI(title="mtgpu node (network)", docs_url=None, redoc_url=None)
    app.add_exception_handler(ServiceError, _error_response)

    @app.get("/v1/health")
    def health() -> dict:
        return {"ok": True, **service.info()}

    @app.get("/v1/info")
    def info() -> dict:
        return service.info()

    if service.node.cluster is not None:
        add_cluster_routes(app, service)
    return app


def add_cluster_routes(app: FastAPI, service: NodeService) -> None:
    """Member-to-member routes: every request must be signed with the cluster secret."""
    link = service.node.cluster

    async def verified(request: Request) -> bytes:
        body = await request.body()
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        why = link.signer.verify(request.method, path, body, request.headers)
        if why:
            raise ServiceError(401, f"refused: {why}")
        return body

    @app.post("/cluster/v1/report")
    async def report(request: Request) -> dict:
        body = await verified(request)
        link.handle_report(json.loads(body))
        return {"ok": True}

    @app.post("/cluster/v1/join")
    async def join(request: Request) -> dict:
        body = json.loads(await verified(request))
        try:
            return await run_in_threadpool(link.handle_join, body["name"], body["listen"], body["raft"])
        except ReplicationError as e:
            raise ServiceError(503, str(e)) from None

    @app.post("/cluster/v1/remove")
    async def remove(request: Request) -> dict:
        body = json.loads(await verified(request))
        try:
            return await run_in_threadpool(link.handle_remove, body["name"])
        except (ReplicationError, ClusterSetupError) as e:
            raise ServiceError(409, str(e)) from None

    @app.get("/cluster/v1/pending")
    async def pending(request: Request) -> dict:
        await verified(request)
        return {str(k): v for k, v in service.node.scheduler.pending_reasons.items()}

    @app.get("/cluster/v1/nodes")
    async def nodes(request: Request) -> list[dict]:
        await verified(request)
        return await run_in_threadpool(service.nodes_view)

    @app.get("/cluster/v1/jobs/{job_id}/log")
    async def log(job_id: int, request: Request, offset: int = 0, limit: int = 1 << 20) -> dict:
        await verified(request)
        job = service.store.machine.jobs.get(job_id)
        data = service.local_log(job, offset, limit) if job else b""
        return {"data": base64.b64encode(data).decode()}

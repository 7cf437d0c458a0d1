"""HTTP routes: thin wrappers over server.service.

Two apps. `local_app` is served on the Unix socket: callers are identified by the
kernel (SO_PEERCRED). `public_app` is served on LISTEN for clients off the node:
health and metadata for anyone; `POST /v1/join` with a one-time invite code; every
other tenant route only for requests signed with the tenant's registered key; `GET
/metrics` only when [METRICS] is enabled and for the addresses it allows; the web
dashboard (server/dashboard.py) for the holder of a session a one-time link opened; and, in
cluster mode, member-to-member routes signed with the cluster secret. No
unauthenticated request can submit a job.
"""

from __future__ import annotations

import json
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.datastructures import Headers

from ...model import logstream
from ...state.store import ReplicationError
from ..cluster.errors import ClusterSetupError
from ..cluster.link import IMAGE_PATH
from .. import dashboard as web_dashboard
from .. import metrics as node_metrics
from ...model.api import STALE_HEADER
from . import logs
from .clusters import add_admin_routes, summary as cluster_summary
from .encoding import in_turn, list_response
from .identity import Caller, caller_from_peer
from .logs import LogResponse
from .report_protocol import REPORT_PATH, take_report
from . import sessions
from .service import MemberService, ServiceError
from .tenants import TenantService
from .workspaces import WorkspaceRequest, WorkspaceService


class SubmitRequest(BaseModel):
    script: str = Field(description="the job file's text")
    overrides: dict[str, str] = Field(default_factory=dict, description="directives given as CLI flags")
    workdir: str | None = Field(default=None, description="where the job starts (default: the tenant's home)")


class PodmanEnvRequest(BaseModel):
    load: list[str] = Field(default_factory=list, max_length=32,
                            description="staged images to load into the caller's store first")
    enter: str | None = Field(default=None, max_length=200,
                              description="the container the caller will `podman exec` into: it is moved into "
                                          "that job's cgroup first (its GPUs only)")
    features: list[str] = Field(default_factory=list, max_length=100,
                                description="Features from a registry or URL (features.feature_key) whose staged "
                                            "archives the caller's devcontainer build needs; those staged here come "
                                            "back under `features`")


class SaveRequest(BaseModel):
    image: str = Field(max_length=200, description="NAME[:TAG]")


class DrainRequest(BaseModel):
    reason: str = ""


def _error_response(_request: Request, exc: ServiceError) -> JSONResponse:
    return JSONResponse(status_code=exc.status, content={"error": str(exc), "refused": exc.refused})


class AnswerHeaders:
    """Adds `headers(scope)` to every HTTP answer of the app it wraps (a pure ASGI
    middleware). Starlette's @app.middleware("http") spends a task group and memory
    streams on every request, about 0.3 ms each: more than a member's telemetry
    report costs itself, once a second from every member (bench/telemetry.py)."""

    def __init__(self, app, headers: Callable[[dict], dict[str, str]]) -> None:
        self.app = app
        self.headers = headers

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message) -> None:
            if message["type"] == "http.response.start":
                extra = self.headers(scope)
                if extra:
                    message = {**message, "headers": [*message.get("headers", ()), *(
                        (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in extra.items())]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


# async: a sync handler would run in a worker thread, for each of a storm of reports a
# member that just stopped scheduling answers
async def _unavailable(_request: Request | None, e: Exception) -> JSONResponse:
    return JSONResponse(status_code=503, content={"error": str(e)})


async def _refused(_request: Request | None, e: Exception) -> JSONResponse:
    return JSONResponse(status_code=409, content={"error": str(e)})


class InviteRequest(BaseModel):
    name: str
    clusters: list[str] = Field(default_factory=list, description="cluster ids (default: this one)")
    ttl_s: float = Field(default=7 * 86400.0, gt=0, le=90 * 86400.0, description="how long the code is valid")


class RetentionRequest(BaseModel):
    dry_run: bool = True
    as_of: float | None = Field(default=None, ge=0, le=32503680000.0,
                                description="evaluate at this time (Unix seconds, up to the year 3000); default now")


class AssignRequest(BaseModel):
    clusters: list[str]
    servers: dict[str, str] = Field(default_factory=dict,
                                    description="where the other clusters answer (HOST:PORT), for the tenant's client")


class ShareRequest(BaseModel):
    share: float = Field(description="the tenant's fair-share weight (checked by the service, which names the range)")


class JoinRequest(BaseModel):
    code: str = Field(max_length=200)
    key: str = Field(max_length=2000, description="an OpenSSH ed25519 public key line")


def local_app(service: MemberService, tenants: TenantService) -> FastAPI:
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

    async def identify(request: Request) -> Caller:
        return caller(request)

    add_job_routes(app, service, identify)
    web_dashboard.add_link_route(app, service, tenants, identify, via="socket")

    @app.post("/v1/podman/env")
    def podman_env(request: Request, body: PodmanEnvRequest | None = None) -> dict:
        """The environment the caller's podman runs with here (prepared on first call)."""
        return service.podman_env(caller(request), body.load if body else None, body.enter if body else None,
                                  body.features if body else None)

    @app.post("/v1/jobs/{job_id}/attach")
    def attach(job_id: int, request: Request) -> dict:
        """The calling process joins its running job's cgroups here (mt-job attach): the job's GPUs only."""
        return sessions.attach(service, caller(request), job_id)

    @app.get("/v1/gpus/here")
    def gpus_here(request: Request) -> list[dict]:
        """This member's GPUs with their device nodes and telemetry (mt-job gpus)."""
        return sessions.local_gpus(service, caller(request))

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

    @app.post("/v1/retention")
    def retention(body: RetentionRequest, request: Request) -> dict:
        return service.retention(caller(request), body.dry_run, body.as_of)

    @app.get("/v1/backup")
    def backup(request: Request) -> dict:
        """The node's whole state, consistent (root or the admin group, on the Unix socket only)."""
        return service.backup(caller(request))

    @app.get("/v1/usage")
    def usage(request: Request, since: str | None = None, until: str | None = None, by: str = "tenant") -> dict:
        """Every tenant's finished jobs' usage (root or the admin group; docs/ACCOUNTING.md)."""
        return service.usage(caller(request), since, until, by, mine=False)

    @app.post("/v1/tenants")
    def invite(body: InviteRequest, request: Request) -> dict:
        return tenants.invite(caller(request), body.name, body.clusters, body.ttl_s)

    @app.get("/v1/tenants")
    def tenant_list(request: Request) -> list[dict]:
        return tenants.tenants(caller(request))

    @app.post("/v1/tenants/{name}/remove")
    def tenant_remove(name: str, request: Request) -> dict:
        return tenants.remove(caller(request), name)

    @app.post("/v1/tenants/{name}/assign")
    def tenant_assign(name: str, body: AssignRequest, request: Request) -> dict:
        return tenants.assign(caller(request), name, body.clusters, body.servers)

    @app.get("/v1/admin/summary")
    def admin_summary(request: Request) -> dict:
        """This cluster at a glance, for `mtgpu-admin clusters` (root or the admin group)."""
        if not caller(request).is_admin:
            raise ServiceError(403, "the clusters' summary needs root or the admin group")
        return cluster_summary(service)

    @app.post("/v1/tenants/{name}/share")
    def tenant_share(name: str, body: ShareRequest, request: Request) -> dict:
        return tenants.set_share(caller(request), name, body.share)

    return app


def add_job_routes(app: FastAPI, service: MemberService, identify) -> None:
    """The tenant's job routes; `identify(request)` says who calls (peer credentials or signature)."""

    def stale_warning(_scope: dict) -> dict[str, str]:
        """Every answer of a member that does not hear the cluster says so (clients print it)."""
        problem = service.member.link.quorum_problem()
        return {STALE_HEADER: problem} if problem else {}

    app.add_middleware(AnswerHeaders, headers=stale_warning)

    @app.post("/v1/jobs")
    async def submit(body: SubmitRequest, request: Request) -> dict:
        return await service.submit(await identify(request), body.script, body.overrides, body.workdir)

    @app.get("/v1/jobs")
    async def list_jobs(request: Request, all: bool = False, active: bool = False) -> list[dict]:
        """The jobs, built one list at a time and encoded in chunks off the event loop (encoding.py:
        thousands of them in one call held the interpreter lock from the member's Raft thread)."""
        who = await identify(request)
        return await in_turn(lambda: list_response(service.list_jobs(who, all_tenants=all, include_final=not active)))

    @app.get("/v1/jobs/{job_id}")
    async def show(job_id: int, request: Request) -> dict:
        return await run_in_threadpool(service.show, await identify(request), job_id)

    @app.post("/v1/jobs/{job_id}/cancel")
    async def cancel(job_id: int, request: Request) -> dict:
        return await run_in_threadpool(service.cancel, await identify(request), job_id)

    @app.get("/v1/usage/mine")
    async def my_usage(request: Request, since: str | None = None, until: str | None = None,
                       by: str = "model") -> dict:
        """The caller's own finished jobs' usage (docs/ACCOUNTING.md)."""
        return await run_in_threadpool(service.usage, await identify(request), since, until, by, True)

    @app.get(logstream.LOG_STREAM_PATH, response_class=LogResponse)
    async def log(job_id: int, request: Request, offset: int = 0, tail: int | None = None,
                  rank: int = 0) -> LogResponse:
        """The job's log from `offset` (or its last `tail` lines) to its size now, as raw bytes."""
        return LogResponse(await logs.job_log(service, await identify(request), job_id, offset, tail, rank))

    workspaces = WorkspaceService(service)

    @app.post("/v1/workspaces")
    async def ws_create(body: WorkspaceRequest, request: Request) -> dict:
        return await workspaces.create(await identify(request), body)

    @app.get("/v1/workspaces")
    async def ws_list(request: Request, all: bool = False) -> list[dict]:
        return await run_in_threadpool(workspaces.list, await identify(request), all)

    @app.get("/v1/workspaces/{name}")
    async def ws_show(name: str, request: Request) -> dict:
        return await run_in_threadpool(workspaces.show, await identify(request), name)

    @app.post("/v1/workspaces/{name}/save")
    async def ws_save(name: str, body: SaveRequest, request: Request) -> dict:
        return await run_in_threadpool(workspaces.save, await identify(request), name, body.image)

    @app.post("/v1/workspaces/{name}/{action}")
    async def ws_action(name: str, action: str, request: Request) -> dict:
        do = {"stop": workspaces.stop, "start": workspaces.start, "rm": workspaces.remove}.get(action)
        if do is None:
            raise ServiceError(404, f"no workspace action {action!r}; the actions are stop, start and rm")
        return await run_in_threadpool(do, await identify(request), name)


def public_app(service: MemberService, tenants: TenantService) -> FastAPI:
    app = FastAPI(title="mtgpu node (network)", docs_url=None, redoc_url=None)
    app.add_exception_handler(ServiceError, _error_response)

    @app.get("/v1/health")
    def health() -> dict:
        return {"ok": True, **service.info()}

    @app.get("/v1/info")
    def info() -> dict:
        return service.info()

    @app.post("/v1/join")
    def join(body: JoinRequest) -> dict:
        return tenants.join(body.code, body.key)

    async def identify(request: Request) -> Caller:
        body = await request.body()
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return await run_in_threadpool(tenants.identify, request.method, path, body, request.headers)

    @app.get("/v1/me")
    async def me(request: Request) -> dict:
        who = await identify(request)
        t = service.store.machine.tenants[who.name]
        return {"name": t.name, "uid": t.uid, "gid": t.gid, "clusters": t.clusters, "cluster_id": tenants.cluster_id,
                "node": service.node_name, "servers": {c: a for c, a in t.servers.items() if c in t.clusters}}

    @app.get("/v1/directlink")
    async def directlink(request: Request, id: str = "") -> dict:
        who = await identify(request)
        return await run_in_threadpool(tenants.directlink, who, id)

    @app.get("/v1/nodes")
    async def nodes(request: Request) -> list[dict]:
        """The members and their GPUs' live use, as the local socket shows it to a
        non-admin (the terminal app's servers view)."""
        who = await identify(request)
        return await run_in_threadpool(service.nodes, who)

    add_job_routes(app, service, identify)
    add_metrics_route(app, service)
    web_dashboard.add_link_route(app, service, tenants, identify, via="key")
    web_dashboard.add_page_routes(app, service, tenants)

    if service.member.link.is_cluster:
        add_cluster_routes(app, service)
    return app


def add_metrics_route(app: FastAPI, service: MemberService) -> None:
    """`GET /metrics` for the scrapers [METRICS] allows (server/metrics.py, docs/METRICS.md)."""
    registry: list = []  # made at the first scrape: an app that is never scraped reads nothing

    @app.get("/metrics", response_class=Response)
    async def metrics(request: Request) -> Response:
        settings = service.config.METRICS
        refusal = node_metrics.scrape_refusal(settings, request.client.host if request.client else None,
                                              request.headers)
        if refusal:
            raise ServiceError(*refusal)
        if not registry:
            registry.append(node_metrics.member_registry(service, settings.tenant_labels))
        body = await run_in_threadpool(node_metrics.exposition, registry[0])
        return Response(body, media_type=node_metrics.CONTENT_TYPE)


def add_cluster_routes(app: FastAPI, service: MemberService) -> None:
    """Member-to-member routes: every request must be signed with the cluster secret.
    A change the cluster could not record answers 503; a refusal of membership, 409."""
    link = service.member.link
    app.add_exception_handler(ReplicationError, _unavailable)
    app.add_exception_handler(ClusterSetupError, _refused)

    def member_clock(scope: dict) -> dict[str, str]:
        """Every answer to a member carries this member's time, signed for its request, so
        that a member whose clock is elsewhere signs in ours (cluster/signer.py)."""
        if not scope["path"].startswith("/cluster/"):
            return {}
        return link.signer.clock_headers(Headers(scope=scope))

    app.add_middleware(AnswerHeaders, headers=member_clock)

    async def verified(request: Request) -> bytes:
        body = await request.body()
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        why = link.signer.verify(request.method, path, body, request.headers)
        if why:
            raise ServiceError(401, f"refused: {why}")
        return body

    @app.post(REPORT_PATH)
    async def report(request: Request) -> dict:
        """LISTEN's protocol (report_protocol.py) takes reports before the app; this route
        serves those that still reach it (pipelined behind another request, with a query)."""
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return take_report(link, path, await request.body(), request.headers)

    @app.post("/cluster/v1/role")
    async def role(request: Request) -> dict:
        body = json.loads(await verified(request))
        try:
            voter, voters, term = bool(body["voter"]), [str(v) for v in body["voters"]], int(body["term"])
        except (KeyError, TypeError, ValueError) as e:
            raise ServiceError(422, f"a role change needs voter (bool), voters (list) and term (int): {e}") from None
        return await run_in_threadpool(link.handle_role, voter, voters, term)

    @app.get("/cluster/v1/raft")
    async def raft(request: Request) -> dict:
        await verified(request)
        return link.raft_info()

    @app.post("/cluster/v1/join")
    async def join(request: Request) -> dict:
        body = json.loads(await verified(request))
        return await run_in_threadpool(link.handle_join, body["name"], body["listen"], body["raft"],
                                       body.get("cluster_id"))

    @app.post("/cluster/v1/remove")
    async def remove(request: Request) -> dict:
        body = json.loads(await verified(request))
        try:
            return await run_in_threadpool(link.handle_remove, body["name"])
        except ReplicationError as e:  # the caller says "could not remove": a conflict, not an outage
            raise ServiceError(409, str(e)) from None

    @app.get("/cluster/v1/pending")
    async def pending(request: Request) -> dict:
        await verified(request)
        return {str(k): v for k, v in service.member.scheduler.pending_reasons.items()}

    @app.get("/cluster/v1/nodes")
    async def nodes(request: Request) -> list[dict]:
        await verified(request)
        return await run_in_threadpool(service.nodes_view)

    add_admin_routes(app, service, verified)  # another cluster's admin (clusters.py)

    @app.get(IMAGE_PATH)
    async def image_archive(digest: str, request: Request) -> FileResponse:
        """An image archive this member staged, for a member that runs a job in it."""
        await verified(request)
        setup = service.member.agent.containers
        if setup is None or digest not in setup.images.state.ready.values():
            raise ServiceError(404, f"{service.node_name} has no staged image with digest {digest}")
        return FileResponse(setup.images.archive(digest), media_type="application/x-tar")

    @app.get(logstream.MEMBER_LOG_STREAM_PATH, response_class=LogResponse)
    async def log(job_id: int, request: Request, offset: int = 0, tail: int | None = None,
                  rank: int = 0) -> LogResponse:
        await verified(request)
        return LogResponse(await logs.member_log(service, job_id, offset, tail, rank))

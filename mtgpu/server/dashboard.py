"""The web dashboard on LISTEN (docs/DASHBOARD.md): one page and the JSON it polls.

No new port and no new kind of credential: a caller the API already trusts asks for a
one-time link (`POST /v1/dashboard/link`, signed with the tenant's key on LISTEN, or on
the node's socket with the kernel's word for who calls). `GET /dashboard?token=T` takes
the link once and gives an HttpOnly, SameSite=Strict session cookie bound to that
identity, then redirects to drop the token from the address bar. The page
(`dashboard_page.html`, self-contained: no CDN) polls `/dashboard/api/...` with the
cookie; each of those answers with the very service call the API route makes for the
same identity, so the page cannot show other figures than `remotegpu-cli` or `mt-job`.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import re
from dataclasses import dataclass
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from .api.encoding import in_turn, list_response
from .api.identity import Caller
from .api.service import MemberService, ServiceError
from .api.tenants import TenantService
from .api.workspaces import WorkspaceService
from .dashboard_access import Outcome, TooManyLinks

LINK_PATH = "/v1/dashboard/link"
PAGE_PATH = "/dashboard"
API_PATH = "/dashboard/api"
REFRESH_S = 2.0
HOW_TO_GET_A_LINK = ("run `remotegpu-cli dashboard` on your computer (a tenant), or `mtgpu-admin dashboard` on "
                     "the node (an admin)")
NO_STORE = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff"}


@dataclass(frozen=True)
class Viewer:
    """Whom a link or a session is for: the caller as the API identified it, and how
    (`key`: a request signed with the tenant's key; `socket`: the node's Unix socket)."""

    caller: Caller
    via: str

    @property
    def key(self) -> str:
        return f"{self.via}:{self.caller.name}:{self.caller.uid}"


def cookie_name(service: MemberService) -> str:
    """One cookie name per node: browsers keep cookies per host, not per port, so two
    nodes reached on the same host (127.0.0.1 through two forwards) keep theirs apart."""
    tag = hashlib.sha256(f"{service.cluster_id}/{service.node_name}".encode()).hexdigest()[:12]
    return f"mtgpu_dashboard_{tag}"


def still_allowed(service: MemberService, viewer: Viewer) -> str | None:
    """Why a session may no longer be served, or None. A tenant that signed in with its
    key must still be a tenant of this cluster with a key (removed: its session ends);
    a caller of the socket was identified by the kernel, and stays who it was."""
    if viewer.via != "key":
        return None
    t = service.store.machine.tenants.get(viewer.caller.name)
    if t is None or not t.keys or t.uid != viewer.caller.uid:
        return f"tenant {viewer.caller.name!r} is no longer a tenant here; the dashboard session ended"
    if service.cluster_id not in t.clusters:
        return f"tenant {viewer.caller.name!r} is no longer authorized for cluster {service.cluster_id!r}"
    return None


# ---------------------------------------------------------------- the page
_INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.S)


@functools.cache
def page() -> tuple[bytes, str]:
    """The page's bytes and its Content-Security-Policy: only its own inline script and
    style run (by their hashes), it connects only to this origin, nothing frames it."""
    text = resources.files(__package__).joinpath("dashboard_page.html").read_text(encoding="utf-8")
    hashes = {"script": [], "style": []}
    for kind, body in _INLINE.findall(text):
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        hashes[kind].append(f"'sha256-{digest}'")
    csp = (f"default-src 'none'; script-src {' '.join(hashes['script'])}; style-src {' '.join(hashes['style'])}; "
           "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    return text.encode(), csp


def message_page(status: int, title: str, text: str) -> HTMLResponse:
    """A plain page that says why (no script at all)."""
    body = (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            "<style>body{font:15px system-ui,sans-serif;margin:3em auto;max-width:40em;color:#222}</style></head>"
            f"<body><h1>{html.escape(title)}</h1><p id=\"message\">{html.escape(text)}</p></body></html>")
    return HTMLResponse(body, status_code=status, headers={
        **NO_STORE, "X-Frame-Options": "DENY",
        "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'"})


REFUSED_LINKS = {
    Outcome.USED: ("This link was already used",
                   f"A dashboard link opens the dashboard once, and this one was opened before. For a new one, "
                   f"{HOW_TO_GET_A_LINK}."),
    Outcome.EXPIRED: ("This link expired",
                      f"A dashboard link is valid for a minute after it was made. For a new one, {HOW_TO_GET_A_LINK}."),
    Outcome.UNKNOWN: ("This link is not valid here",
                      f"This node made no such link (or it restarted since, which ends every link and session). "
                      f"For a new one, {HOW_TO_GET_A_LINK}."),
}


# ---------------------------------------------------------------- routes
def add_link_route(app: FastAPI, service: MemberService, tenants: TenantService, identify, via: str) -> None:
    """`POST /v1/dashboard/link`: a one-time link for the caller `identify(request)` names."""

    @app.post(LINK_PATH)
    async def dashboard_link(request: Request) -> dict:
        """A one-time link (valid a minute) to this node's dashboard, for the caller."""
        who = await identify(request)
        service._authorized(who)
        try:
            link = tenants.dashboard.issue_link(Viewer(who, via))
        except TooManyLinks as e:
            raise ServiceError(429, f"refused: {e}") from None
        return {"path": f"{PAGE_PATH}?token={link.token}", "expires_in_s": link.ttl_s, "name": who.name,
                "admin": who.is_admin, "node": service.node_name, "cluster_id": service.cluster_id,
                "listen": service.config.LISTEN}


def add_page_routes(app: FastAPI, service: MemberService, tenants: TenantService) -> None:
    """The page and its JSON, for the holder of a session cookie."""
    workspaces = WorkspaceService(service)

    def viewer(request: Request) -> Viewer:
        secret = request.cookies.get(cookie_name(service))
        v = tenants.dashboard.session(secret)
        if v is None:
            raise ServiceError(401, f"no dashboard session (none, expired, or the node restarted): {HOW_TO_GET_A_LINK}")
        problem = still_allowed(service, v)
        if problem:
            tenants.dashboard.end(secret)
            raise ServiceError(401, problem)
        return v

    def answer(data) -> JSONResponse:
        return JSONResponse(data, headers=NO_STORE)

    @app.get(PAGE_PATH, response_class=HTMLResponse)
    async def dashboard_page(request: Request, token: str | None = None) -> Response:
        if token is not None:
            r = tenants.dashboard.redeem(token)
            if r.outcome is not Outcome.OPENED:
                return message_page(403, *REFUSED_LINKS[r.outcome])
            redirect = RedirectResponse(PAGE_PATH, status_code=303, headers=NO_STORE)
            redirect.set_cookie(cookie_name(service), r.secret, max_age=int(r.ttl_s), path=PAGE_PATH, httponly=True,
                                samesite="strict")
            return redirect
        try:
            viewer(request)
        except ServiceError as e:
            return message_page(401, "Open the dashboard with a link", f"{e}.")
        body, csp = page()
        return HTMLResponse(body, headers={**NO_STORE, "X-Frame-Options": "DENY", "Content-Security-Policy": csp})

    @app.get(f"{API_PATH}/me")
    async def dashboard_me(request: Request) -> Response:
        v = viewer(request)
        left = tenants.dashboard.expires_in_s(request.cookies.get(cookie_name(service)))
        return answer({"name": v.caller.name, "uid": v.caller.uid, "admin": v.caller.is_admin, "via": v.via,
                       "node": service.node_name, "cluster_id": service.cluster_id,
                       "session_expires_in_s": round(left, 1), "refresh_s": REFRESH_S})

    @app.get(f"{API_PATH}/nodes")
    async def dashboard_nodes(request: Request) -> Response:
        """As `GET /v1/nodes`."""
        return answer(await run_in_threadpool(service.nodes, viewer(request).caller))

    @app.get(f"{API_PATH}/jobs")
    async def dashboard_jobs(request: Request, active: bool = False) -> Response:
        """As `GET /v1/jobs?all=true&active=...`: everyone's jobs for an admin, the caller's own for a tenant."""
        who = viewer(request).caller
        return await in_turn(lambda: list_response(
            service.list_jobs(who, all_tenants=who.is_admin, include_final=not active), stdlib=True, headers=NO_STORE))

    @app.get(f"{API_PATH}/workspaces")
    async def dashboard_workspaces(request: Request) -> Response:
        """As `GET /v1/workspaces?all=true`: everyone's for an admin, the caller's own for a tenant."""
        who = viewer(request).caller
        return answer(await run_in_threadpool(workspaces.list, who, who.is_admin))

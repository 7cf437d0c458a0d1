"""Many clusters, one admin (docs/CLUSTERS.md): what another cluster's admin tools ask of
this one, signed with this cluster's secret (the admin of several clusters holds each
one's secret, as its members do): a summary for `mtgpu-admin clusters`, and a tenant
admitted here, or its clusters changed, by `mtgpu-admin tenant assign/unassign` run on
a member of another cluster. Its own admin asks the same summary over the local socket."""

from __future__ import annotations

import json

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

from ...state import commands as C
from .service import MemberService, ServiceError

ADMIN_TENANT_PATH = "/cluster/v1/admin/tenant"
ADMIN_SUMMARY_PATH = "/cluster/v1/admin/summary"


def summary(service: MemberService) -> dict:
    """This cluster at a glance: its id, scheduler, members up, GPUs, jobs and tenants."""
    machine = service.store.machine
    with service.store.lock:
        nodes = list(machine.nodes.values())
        queued = sum(1 for _ in machine.queued_jobs())
        running = sum(1 for _ in machine.running_jobs())
        tenants = sum(1 for t in machine.tenants.values() if service.cluster_id in t.clusters or not t.managed)
        scheduler = machine.scheduler
    standing = service.member.link.standing()
    from ..cluster.addresses import advertised
    return {"cluster_id": service.cluster_id, "answered_by": service.node_name, "scheduler": scheduler or None,
            "server": advertised(service.config.LISTEN),
            "in_touch": standing.in_touch, "problem": "" if standing.in_touch else standing.problem,
            "members": len(nodes), "members_up": sum(1 for n in nodes if not n.down),
            "gpus": sum(len(n.gpus) for n in nodes), "queued": queued, "running": running, "tenants": tenants,
            "state_format": C.STATE_FORMAT}


def admit(service: MemberService, body: dict) -> dict:
    """A tenant of the admin's other cluster, with its ids, keys, clusters and their servers."""
    try:
        args = {"name": str(body["name"]), "uid": int(body["uid"]), "gid": int(body["gid"]),
                "keys": [str(k) for k in body["keys"]], "clusters": [str(c) for c in body["clusters"]],
                "servers": {str(k): str(v) for k, v in dict(body.get("servers") or {}).items()}}
    except (KeyError, TypeError, ValueError) as e:
        raise ServiceError(422, f"a tenant admission needs name, uid, gid, keys and clusters: {e}") from None
    r = service.apply(C.TENANT_ADMIT, **args, at=service.clock())
    if not r["ok"]:
        raise ServiceError(409, f"cluster {service.cluster_id!r} refused tenant {args['name']!r}: {r['error']}")
    service.wake()  # its account, on every member of this cluster
    return {"cluster_id": service.cluster_id, "name": args["name"], "created": r.get("created", False),
            "clusters": args["clusters"]}


def add_admin_routes(app: FastAPI, service: MemberService, verified) -> None:
    """On the cluster's public API, among the member routes (`verified`: the signature check)."""

    @app.get(ADMIN_SUMMARY_PATH)
    async def admin_summary(request: Request) -> dict:
        await verified(request)
        return await run_in_threadpool(summary, service)

    @app.post(ADMIN_TENANT_PATH)
    async def admin_tenant(request: Request) -> dict:
        try:
            body = json.loads(await verified(request))
        except ValueError as e:
            raise ServiceError(400, f"a tenant admission's body must be JSON: {e}") from None
        if not isinstance(body, dict):
            raise ServiceError(422, "a tenant admission is a JSON object")
        return await run_in_threadpool(admit, service, body)

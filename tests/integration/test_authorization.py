"""The authorization matrix (issue 12): every API route has a rule, and every route is
refused when called by someone the rule excludes: another tenant, a non-admin, an
unsigned request, an unregistered key, a replayed request, a machine without the cluster
secret. The routes are enumerated from the apps themselves: a new route without a rule
fails `test_every_route_has_a_rule`.

Rules: `anyone` (health, who am I, the nodes' list), `public` (no identity: health, info,
join with a code), `tenant` (acts as the caller only), `own` (lists the caller's things
only), `owner` (one thing of the caller's: another tenant gets 404, as for nothing at
all), `admin` (root or the admin group), `cluster` (members, signed with the cluster secret),
`scraper` (no identity, but only when [METRICS] is enabled and only from the addresses it
allows: off by default, so 404; docs/METRICS.md, tests/integration/test_metrics.py), `session`
(the web dashboard: only with the session cookie a one-time link gave, else 401, signed or
not; docs/DASHBOARD.md, tests/integration/test_dashboard.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import httpx
import pytest
from fastapi.routing import APIRoute

from mtgpu.client.signing import generate_key_pair, load_private_key, sign_headers
from mtgpu.model import logstream
from mtgpu.server.api.routes import add_cluster_routes, local_app, public_app
from tests.support.images import busybox_image, podman_missing
from tests.support.node import running_node, wait_for
from tests.support.users import can_create_users, stop_node_and_remove_tenants

if can_create_users():
    pytest.skip(can_create_users(), allow_module_level=True)

UID_RANGE = (340000, 349999)
# One body for every POST: valid for each route's model, so that only the rule decides.
BODY = {"script": "#!/bin/sh\nsleep 600\n", "overrides": {}, "template": "plain", "image": "x:1", "name": "x",
        "reason": "", "clusters": [], "share": 1.0, "code": "x", "key": "x"}
LOG = logstream.LOG_STREAM_PATH
LOCAL_RULES = {
    ("GET", "/v1/health"): "anyone", ("GET", "/v1/whoami"): "anyone", ("GET", "/v1/nodes"): "anyone",
    ("POST", "/v1/jobs"): "tenant", ("GET", "/v1/jobs"): "own", ("GET", "/v1/jobs/{job_id}"): "owner",
    ("POST", "/v1/jobs/{job_id}/cancel"): "owner", ("GET", LOG): "owner",
    ("POST", "/v1/workspaces"): "tenant", ("GET", "/v1/workspaces"): "own",
    ("GET", "/v1/workspaces/{name}"): "owner", ("POST", "/v1/workspaces/{name}/save"): "owner",
    ("POST", "/v1/workspaces/{name}/{action}"): "owner", ("POST", "/v1/podman/env"): "tenant",
    ("POST", "/v1/nodes/{name}/drain"): "admin", ("POST", "/v1/nodes/{name}/resume"): "admin",
    ("POST", "/v1/nodes/{name}/remove"): "admin", ("POST", "/v1/retention"): "admin", ("GET", "/v1/backup"): "admin",
    ("POST", "/v1/tenants"): "admin", ("GET", "/v1/tenants"): "admin", ("POST", "/v1/tenants/{name}/remove"): "admin",
    ("POST", "/v1/tenants/{name}/assign"): "admin", ("POST", "/v1/tenants/{name}/share"): "admin",
    ("POST", "/v1/dashboard/link"): "tenant", ("GET", "/v1/usage"): "admin", ("GET", "/v1/usage/mine"): "own",
    ("POST", "/v1/jobs/{job_id}/attach"): "owner", ("GET", "/v1/gpus/here"): "anyone",
    ("GET", "/v1/admin/summary"): "admin",
}
# what moves the calling process (a peer on this machine's socket) has no network route
SOCKET_ONLY = {("POST", "/v1/jobs/{job_id}/attach")}
PUBLIC_RULES = {
    ("GET", "/v1/health"): "public", ("GET", "/v1/info"): "public", ("POST", "/v1/join"): "public",
    ("GET", "/v1/me"): "tenant", ("GET", "/v1/directlink"): "tenant",
    ("GET", "/v1/nodes"): "tenant", ("GET", "/metrics"): "scraper", ("POST", "/v1/dashboard/link"): "tenant",
    ("GET", "/dashboard"): "session", ("GET", "/dashboard/api/me"): "session", ("GET", "/dashboard/api/nodes"): "session",
    ("GET", "/dashboard/api/jobs"): "session", ("GET", "/dashboard/api/workspaces"): "session",
    **{k: v for k, v in LOCAL_RULES.items()
       if k[1].startswith(("/v1/jobs", "/v1/workspaces", "/v1/usage/mine")) and k not in SOCKET_ONLY},
}
CLUSTER_RULES = {
    ("POST", "/cluster/v1/report"): "cluster", ("POST", "/cluster/v1/role"): "cluster",
    ("GET", "/cluster/v1/raft"): "cluster", ("POST", "/cluster/v1/join"): "cluster",
    ("POST", "/cluster/v1/remove"): "cluster", ("GET", "/cluster/v1/pending"): "cluster",
    ("GET", "/cluster/v1/nodes"): "cluster", ("GET", "/cluster/v1/images/{digest}"): "cluster",
    ("GET", logstream.MEMBER_LOG_STREAM_PATH): "cluster",
    # another cluster's admin (docs/CLUSTERS.md): signed with this cluster's secret
    ("GET", "/cluster/v1/admin/summary"): "cluster", ("POST", "/cluster/v1/admin/tenant"): "cluster",
}


def routes(app) -> set[tuple[str, str]]:
    return {(m, r.path) for r in app.routes if isinstance(r, APIRoute) for m in r.methods}


def stub_service(signer=None):
    def served(*_a, **_k):
        return {"served": True}
    link = SimpleNamespace(is_cluster=True, signer=signer, handle_report=served, handle_role=served,
                           raft_info=served, handle_join=served, handle_remove=served)
    return SimpleNamespace(config=SimpleNamespace(ADMIN_GROUP="mtgpu-admins"), member=SimpleNamespace(link=link),
                           node_name="stub")


def test_every_route_has_a_rule():
    service = stub_service()
    local = routes(local_app(service, SimpleNamespace()))
    public = routes(public_app(service, SimpleNamespace()))
    assert local == set(LOCAL_RULES), f"routes without a rule: {local - set(LOCAL_RULES)}"
    assert public == set(PUBLIC_RULES) | set(CLUSTER_RULES), \
        f"routes without a rule: {public - set(PUBLIC_RULES) - set(CLUSTER_RULES)}"


def fill(path: str, job_id: int, ws: str) -> str:
    return path.format(job_id=job_id, name=ws if "workspaces" in path else "node-a", action="stop",
                       digest="sha256:" + "0" * 64)


def as_user(node, user, calls: list[tuple[str, str]]) -> list[int]:
    """HTTP statuses of these calls over the node's socket, made by a process of `user`."""
    code = ("import json, sys, httpx\n"
            "c = httpx.Client(transport=httpx.HTTPTransport(uds=sys.argv[1]), base_url='http://mtgpu', timeout=30)\n"
            "out = []\n"
            "for m, p in json.loads(sys.argv[2]):\n"
            "    out.append(c.request(m, p, **({'json': json.loads(sys.argv[3])} if m == 'POST' else {})).status_code)\n"
            "print(json.dumps(out))\n")
    r = subprocess.run([sys.executable, "-c", code, str(node.socket_path), json.dumps(calls), json.dumps(BODY)],
                       user=user.uid,
                       group=user.gid, extra_groups=[], capture_output=True, text=True, timeout=120, cwd="/",
                       env={**node.env_for(user.home)})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def anode(alice, bob):
    if podman_missing():
        pytest.skip(podman_missing())
    with busybox_image() as image, \
            running_node([], CLUSTER_ID="lab-authz", TENANT_UID_RANGE=list(UID_RANGE),
                         CONTAINERS={"enabled": True, "templates": {"plain": image}}) as node:
        wait_for("the image to be staged", lambda: image in (node.client().nodes()[0]["containers"] or {})
                 .get("staged", {}), timeout_s=120)
        jid = node.submit_json(alice, "--wrap", "sleep 600")["job_id"]
        r = node.run_cli("mtgpu.cli.container", alice, "create", "--template", "plain", "--name", "mine", "--json",
                         timeout_s=120)
        assert r.returncode == 0, r.stderr
        node.job_id, node.ws = jid, "mine"
        node.tenant_names = [f"tc{k}{os.getpid() % 1000}" for k in "ab"]
        try:
            yield node
        finally:
            stop_node_and_remove_tenants(node, node.tenant_names, UID_RANGE)


def test_on_the_socket_another_tenant_and_a_non_admin_are_refused(anode, alice, bob):
    owner = [(m, fill(p, anode.job_id, anode.ws)) for (m, p), rule in sorted(LOCAL_RULES.items()) if rule == "owner"]
    admin = [(m, fill(p, anode.job_id, anode.ws)) for (m, p), rule in sorted(LOCAL_RULES.items()) if rule == "admin"]
    assert set(as_user(anode, bob, owner)) == {404}, owner
    assert set(as_user(anode, alice, admin)) == {403}, admin
    # the lists are the caller's own, also when asking for everyone's
    listed = as_user(anode, bob, [("GET", "/v1/jobs?all=true"), ("GET", "/v1/workspaces?all=true")])
    assert listed == [200, 200]
    with anode.client() as c:  # root sees alice's things: the rules above are not a broken route
        assert c.job(anode.job_id)["state"] in ("queued", "running")
    r = anode.mt_job(bob, "list", "--json")
    assert r.returncode == 0 and anode.job_id not in [j["id"] for j in json.loads(r.stdout)]
    r = anode.run_cli("mtgpu.cli.container", bob, "list", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == []


def test_on_the_network_unsigned_unknown_replayed_and_another_tenants_requests_are_refused(anode, tmp_path):
    base = f"http://127.0.0.1:{anode.port}"
    tenants = {}
    tca, tcb = anode.tenant_names
    for name in (tca, tcb):
        r = anode.admin("tenant", "invite", name, "--json")
        assert r.returncode == 0, r.stderr
        key_path = tmp_path / name
        public = generate_key_pair(key_path)
        j = httpx.post(f"{base}/v1/join", json={"code": json.loads(r.stdout)["code"], "key": public}, timeout=30)
        assert j.status_code == 200, j.text
        tenants[name] = load_private_key(key_path)
    stranger = tmp_path / "stranger"
    generate_key_pair(stranger)

    def call(m: str, path: str, who: str | None, key=None, headers=None, payload=None):
        body = json.dumps(payload or BODY).encode() if m == "POST" else b""
        h = headers if headers is not None else (sign_headers(key or tenants[who], who, m, path, body) if who else {})
        return httpx.request(m, base + path, content=body, headers={"content-type": "application/json", **h},
                             timeout=30)

    jid = call("POST", "/v1/jobs", tca).json()["job_id"]
    ws = call("POST", "/v1/workspaces", tca, payload={"template": "plain"})
    assert ws.status_code == 200, ws.text
    ws_name = ws.json()["name"]
    guarded = [(m, fill(p, jid, ws_name)) for (m, p), rule in sorted(PUBLIC_RULES.items())
               if rule not in ("public", "scraper")]
    for m, path in sorted(k for k, rule in PUBLIC_RULES.items() if rule == "scraper"):
        # [METRICS] is off on this node (the default): nobody is served, signed or not
        assert call(m, path, None).status_code == 404, (m, path)
        assert call(m, path, tca).status_code == 404, (m, path)
    for m, path in guarded:
        assert call(m, path, None).status_code == 401, (m, path)
        assert call(m, path, "nobody", key=load_private_key(stranger)).status_code == 401, (m, path)
        assert call(m, path, tcb, key=load_private_key(stranger)).status_code == 401, (m, path)
    for m, p in sorted(k for k, rule in PUBLIC_RULES.items() if rule == "owner"):
        path = fill(p, jid, ws_name)
        assert call(m, path, tcb).status_code == 404, (m, path)
        if m == "GET":
            assert call(m, path, tca).status_code == 200, (m, path)  # the owner is served: the route works
    h = sign_headers(tenants[tca], tca, "GET", f"/v1/jobs/{jid}", b"")
    assert call("GET", f"/v1/jobs/{jid}", None, headers=h).status_code == 200
    again = call("GET", f"/v1/jobs/{jid}", None, headers=h)
    assert again.status_code == 401 and "replay" in again.text


def test_member_routes_refuse_unsigned_wrongly_signed_and_replayed_requests():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from mtgpu.server.api.service import ServiceError
    from mtgpu.server.api.routes import _error_response
    from mtgpu.server.cluster.link import Signer

    app = FastAPI()
    app.add_exception_handler(ServiceError, _error_response)
    good = Signer("s" * 48)
    add_cluster_routes(app, stub_service(good))
    assert routes(app) == set(CLUSTER_RULES)
    wrong = Signer("w" * 48)
    client = TestClient(app)
    for m, p in sorted(CLUSTER_RULES):
        path = fill(p, 1, "x")
        assert client.request(m, path).status_code == 401, (m, path)
        assert client.request(m, path, headers=wrong.headers(m, path, b"", "evil")).status_code == 401, (m, path)
    # a request signed with the secret passes the check once; the same request again is refused
    h = good.headers("GET", "/cluster/v1/raft", b"", "m1")
    assert good.verify("GET", "/cluster/v1/raft", b"", h) is None
    assert "replay" in good.verify("GET", "/cluster/v1/raft", b"", h)

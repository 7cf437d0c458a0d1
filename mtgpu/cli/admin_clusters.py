"""mtgpu-admin for an admin of several clusters (docs/CLUSTERS.md): `clusters` lists the
clusters this admin reaches and their health; `clusters add/remove` keep the book of
them (where each answers and the file with its cluster secret); `tenant assign NAME
--cluster ID ...` and `tenant unassign` give or take a tenant's use of the clusters in
the book, with the same name, ids and keys on each.

The book is a JSON file readable by root alone (/etc/mtgpu/clusters.json; the
environment variable MTGPU_CLUSTERS_BOOK names another). It holds paths to the secrets,
not the secrets: the admin of a cluster holds its secret already (its members do)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx

from ..client.local import LocalClient
from ..server.api.clusters import ADMIN_SUMMARY_PATH, ADMIN_TENANT_PATH
from ..server.cluster.signer import Signer, request_signed
from .common import Col, fail, out, print_json, print_table, request

DEFAULT_BOOK = Path("/etc/mtgpu/clusters.json")
TIMEOUT_S = 5.0


def book_path() -> Path:
    return Path(os.environ.get("MTGPU_CLUSTERS_BOOK") or DEFAULT_BOOK)


def load_book() -> dict[str, dict]:
    """{cluster id: {"server", "secret_file"}}; empty when there is no book yet."""
    path = book_path()
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        fail(f"the clusters book {path} cannot be read ({e}): fix or remove it (mtgpu-admin clusters add "
             "writes it again)", 2)
    if not isinstance(doc, dict) or not all(isinstance(v, dict) and "server" in v and "secret_file" in v
                                            for v in doc.values()):
        fail(f"the clusters book {path} is not a book of clusters ({{ID: {{server, secret_file}}}}): fix or "
             "remove it", 2)
    return doc


def save_book(book: dict[str, dict]) -> None:
    path = book_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(book, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


class RemoteRefused(Exception):
    """Another cluster did not do what was asked (unreachable, refused): says which and why."""


def _secret(cluster_id: str, entry: dict) -> str:
    path = Path(entry["secret_file"])
    try:
        secret = path.read_text().strip()
    except OSError as e:
        raise RemoteRefused(f"cluster {cluster_id}: its secret file {path} cannot be read ({e.strerror or e}); "
                            f"copy {cluster_id}'s cluster secret there (chmod 600)") from None
    if len(secret) < 32:
        raise RemoteRefused(f"cluster {cluster_id}: {path} does not hold a cluster secret (32+ characters)")
    return secret


def call(cluster_id: str, entry: dict, method: str, path: str, payload: dict | None = None) -> dict:
    """A request to another cluster's member routes, signed with its secret. A refusal for
    a clock that is elsewhere is signed again once in the cluster's time (its answer says it)."""
    signer = Signer(_secret(cluster_id, entry))
    body = json.dumps(payload).encode() if payload is not None else b""
    server = entry["server"]
    try:
        with httpx.Client(timeout=httpx.Timeout(TIMEOUT_S, connect=2.0)) as http:
            r, refused = request_signed(signer, lambda headers: http.request(method, f"http://{server}{path}",
                                                                             content=body, headers=headers),
                                        method, path, body, f"admin@{os.uname().nodename}", server)
            if refused is None:
                return r.json()
            if r.status_code == 401:
                refused += f" (is {entry['secret_file']} {cluster_id}'s cluster secret?)"
            raise RemoteRefused(f"cluster {cluster_id} ({server}) answered {r.status_code}: {refused[:400]}")
    except httpx.HTTPError as e:
        raise RemoteRefused(f"cluster {cluster_id} does not answer at {server} ({type(e).__name__}: {e}); check "
                            "that it runs and this machine reaches its LISTEN address") from None


def own_summary() -> dict:
    return request(LocalClient, lambda c: c.admin_summary())


# ---------------------------------------------------------------- commands


def clusters_list(json_out: bool) -> None:
    """This cluster and every cluster in the book, with their health now."""
    rows = [{"cluster_id": None, "book": "this", **own_summary(), "state": "ok"}]
    rows[0]["state"] = "ok" if rows[0]["in_touch"] else f"cut off: {rows[0]['problem']}"
    for cid, entry in sorted(load_book().items()):
        try:
            s = call(cid, entry, "GET", ADMIN_SUMMARY_PATH)
        except RemoteRefused as e:
            rows.append({"cluster_id": cid, "server": entry["server"], "state": f"unreachable: {e}", "book": "book"})
            continue
        state = "ok" if s.get("in_touch") else f"cut off: {s.get('problem')}"
        if s.get("cluster_id") != cid:
            state = f"wrong cluster: {entry['server']} is {s.get('cluster_id')!r}"
        rows.append({**s, "cluster_id": cid, "server": entry["server"], "state": state, "book": "book"})
    if json_out:
        print_json(rows)
        return

    def n(row, key):
        return str(row[key]) if key in row and row[key] is not None else "-"
    print_table([Col("CLUSTER"), Col("SERVER", drop=2), Col("MEMBERS", right=True), Col("GPUS", right=True),
                 Col("QUEUED", right=True), Col("RUNNING", right=True, drop=1), Col("TENANTS", right=True, drop=3),
                 Col("STATE", wrap=True)],
                [(r["cluster_id"], r.get("server", "-"),
                  f"{r['members_up']}/{r['members']}" if "members" in r else "-", n(r, "gpus"), n(r, "queued"),
                  n(r, "running"), n(r, "tenants"), r["state"]) for r in rows])


def clusters_add(cluster_id: str, server: str, secret_file: Path) -> None:
    entry = {"server": server, "secret_file": str(secret_file.absolute())}
    try:
        s = call(cluster_id, entry, "GET", ADMIN_SUMMARY_PATH)
    except RemoteRefused as e:
        fail(f"not added: {e}", 1)
    if s.get("cluster_id") != cluster_id:
        fail(f"not added: {server} serves cluster {s.get('cluster_id')!r}, not {cluster_id!r}: give the id "
             "that machine's CLUSTER_ID says", 2)
    if s.get("cluster_id") == own_summary()["cluster_id"]:
        fail(f"not added: {cluster_id} is this machine's own cluster (mtgpu-admin reaches it already)", 2)
    book = load_book()
    book[cluster_id] = entry
    save_book(book)
    out.print(f"cluster {cluster_id} added to {book_path()}: {s['members_up']}/{s['members']} members up, "
              f"{s['gpus']} GPUs", markup=False)


def clusters_remove(cluster_id: str) -> None:
    book = load_book()
    if cluster_id not in book:
        fail(f"no cluster {cluster_id!r} in {book_path()}; it holds: {', '.join(sorted(book)) or 'none'}", 2)
    del book[cluster_id]
    save_book(book)
    out.print(f"cluster {cluster_id} removed from {book_path()} (its tenants keep what they were given there)")


def reassign(name: str, clusters: list[str], was: str) -> None:
    """Give tenant `name` exactly `clusters` (of this one and the book's): admitted with the
    same ids and keys where it is new, and its list changed everywhere it is known, so a
    cluster taken away refuses it; the tenant's client learns where each answers."""
    own = own_summary()
    own_id = own["cluster_id"]
    tenants = {t["name"]: t for t in request(LocalClient, lambda c: c.tenants())}
    t = tenants.get(name)
    if t is None:
        fail(f"no tenant named {name!r} on {own_id}; invite them here first (mtgpu-admin tenant invite {name})", 2)
    book = load_book()
    unknown = [c for c in clusters if c != own_id and c not in book]
    if unknown:
        fail(f"{', '.join(unknown)}: not this cluster ({own_id}) and not in the clusters book {book_path()}; add "
             f"each with: mtgpu-admin clusters add ID --server HOST:PORT --secret-file FILE", 2)
    touched = [c for c in book if c in clusters or c in t["clusters"]]
    if touched and not t["managed"]:
        fail(f"{name} is a local user of this node (uid {t['uid']}), not an invited tenant: only an invited tenant "
             "is given the same account on other clusters (mtgpu-admin tenant invite)", 2)
    servers = {c: book[c]["server"] for c in clusters if c in book}
    if own_id in clusters:
        servers[own_id] = own["server"]
    problems = []
    for cid in touched:
        try:
            call(cid, book[cid], "POST", ADMIN_TENANT_PATH, {"name": name, "uid": t["uid"], "gid": t["gid"],
                                                             "keys": t["keys"], "clusters": clusters,
                                                             "servers": servers})
        except RemoteRefused as e:
            problems.append(str(e))
    request(LocalClient, lambda c: c.assign_tenant(name, clusters, servers if touched else None))
    out.print(f"tenant {name}: clusters {', '.join(clusters) or 'none'} ({was})", markup=False)
    if problems:
        fail("not every cluster took the change; run the command again once they answer: " + "; ".join(problems), 1)

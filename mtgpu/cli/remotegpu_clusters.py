"""`remotegpu-cli clusters`: the clusters this tenant may use, as its clusters say now
(docs/CLUSTERS.md). Each joined cluster is asked who the tenant is there: a cluster an
admin of several assigned the tenant to is added to the servers file (the same key and
account; its address from the cluster that listed it), one that took the tenant away
(it refuses it) is removed from it. The servers file is what every command, the
terminal app and the VS Code extension list, so they then show exactly those clusters."""

from __future__ import annotations

from ..client.errors import ClientError
from .common import Col, fail, print_json, print_table


def refresh(entries: list[dict], client_of) -> tuple[list[dict], list[dict]]:
    """(the new servers file's entries, one row per cluster: cluster_id, server, state)."""
    rows: list[dict] = []
    kept: list[dict] = []
    allowed: set[str] = set()
    servers: dict[str, str] = {}
    for e in entries:
        try:
            with client_of(e) as c:
                me = c.me()
        except ClientError as err:
            if err.status == 403:  # this cluster no longer takes the tenant: not one it may use
                rows.append({"cluster_id": e["cluster_id"], "server": e["server"], "state": f"removed: {err}"})
                continue
            kept.append(e)
            rows.append({"cluster_id": e["cluster_id"], "server": e["server"], "state": f"not answering: {err}"})
            continue
        kept.append(e)
        allowed.update(me.get("clusters") or [])
        servers.update({c: a for c, a in (me.get("servers") or {}).items() if c not in servers})
        rows.append({"cluster_id": e["cluster_id"], "server": e["server"], "state": "ok"})
    known = {e["cluster_id"] for e in kept} | {r["cluster_id"] for r in rows}
    for cid in sorted(allowed - known):
        address = servers.get(cid)
        if address is None:
            rows.append({"cluster_id": cid, "server": "-", "state": "assigned, but no cluster of yours says where "
                                                                     "it answers: ask your admin"})
            continue
        template = kept[0]
        entry = {"server": address, "tenant": template["tenant"], "key": template["key"], "cluster_id": cid}
        try:
            with client_of(entry) as c:
                me = c.me()
        except ClientError as err:
            rows.append({"cluster_id": cid, "server": address, "state": f"assigned, not answering: {err}"})
            continue
        if me.get("cluster_id") != cid:
            rows.append({"cluster_id": cid, "server": address,
                         "state": f"assigned, but {address} serves {me.get('cluster_id')!r}: ask your admin"})
            continue
        kept.append({**entry, "node": me["node"], "uid": me["uid"]})
        rows.append({"cluster_id": cid, "server": address, "state": "added"})
    return kept, rows


def clusters(entries: list[dict], save, json_out: bool, client_of) -> None:
    """`client_of(entry)`: a client of that entry's cluster (remotegpu-cli's: DirectLink where
    the server does not answer directly)."""
    if not entries:
        fail("no server joined yet: remotegpu-cli join CODE --server HOST:PORT", 2)
    kept, rows = refresh(entries, client_of)
    if kept != entries:
        save(kept)
    if json_out:
        print_json(rows)
        return
    print_table([Col("CLUSTER"), Col("SERVER", drop=1), Col("STATE", wrap=True)],
                [(r["cluster_id"], r["server"], r["state"]) for r in rows])

"""mtgpu-admin: nodes (list, drain, resume), jobs of every tenant, usage (accounting), the web dashboard, simulated GPU load."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Optional

import typer

from ..agent.telemetry.simulated import default_override_path, write_simulated_load
from ..client.local import LocalClient, find_socket
from ..model.tenant import SHARE_HELP, validate_share
from ..model.units import UnitError, parse_size
from .common import (Col, dropped_note, err, fail, give_link, one_line_summaries, out, print_json, print_jobs_table,
                     print_table, request, table_width, when, wrapped)
from . import admin_clusters
from .nodes_table import node_notes, nodes_table, nodes_text
from .usage import checked, print_report, since_option, until_option, wide_option

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
nodes_app = typer.Typer(add_completion=False, help="The cluster's nodes.", invoke_without_command=True)
app.add_typer(nodes_app, name="nodes")


@nodes_app.callback()
def nodes_list(ctx: typer.Context, json_out: bool = typer.Option(False, "--json"), wide: bool = wide_option()) -> None:
    """List nodes with role, state, GPUs and live use (`nodes drain NAME`, `nodes resume NAME`)."""
    if ctx.invoked_subcommand is not None:
        return
    nodes = request(LocalClient, lambda c: c.nodes())
    if json_out:
        print_json(nodes)
        return
    width = table_width(wide)
    if width is None:  # a pipe: nothing cut, one line a row
        out.file.write(nodes_text(nodes, None) + "\n")
    else:
        table, dropped = nodes_table(nodes, width)
        out.print(table, soft_wrap=False)
        if dropped:
            out.print(wrapped(dropped_note(dropped), width))
        for line in node_notes(nodes, width):
            out.print(line)
    for n in nodes:
        c = n.get("containers")
        if c is None:
            continue
        staged = ", ".join(sorted(c.get("staged") or {})) or "none"
        line = f"{n['name']}: containers on; images staged: {staged}"
        waiting = [i for i in c.get("images", []) if i not in (c.get("staged") or {}) and i not in (c.get("failed") or {})]
        if waiting:
            line += "; staging: " + ", ".join(waiting)
        for image, why in sorted((c.get("failed") or {}).items()):
            line += f"; {image} failed: {why}"
        if c.get("user_images"):
            line += "; tenants' own images allowed"
        out.print(line, markup=False)


@nodes_app.command("list")
def nodes_list_cmd(json_out: bool = typer.Option(False, "--json"), wide: bool = wide_option()) -> None:
    """Same as `mtgpu-admin nodes`."""
    ctx = typer.Context(typer.main.get_command(nodes_app))
    nodes_list(ctx, json_out, wide)


@nodes_app.command("drain")
def drain(name: str, reason: str = typer.Option("", "--reason")) -> None:
    """Stop new placements on NAME; its running jobs finish."""
    request(LocalClient, lambda c: c.drain(name, reason))
    out.print(f"node {name} drained")


@nodes_app.command("resume")
def resume(name: str) -> None:
    """Undo `drain`."""
    request(LocalClient, lambda c: c.resume(name))
    out.print(f"node {name} resumed")


@nodes_app.command("remove")
def remove(name: str) -> None:
    """Take member NAME out of the cluster (it must run no job: drain it first). Stop its server afterwards."""
    request(LocalClient, lambda c: c.remove_node(name))
    out.print(f"member {name} removed from the cluster")


tenant_app = typer.Typer(add_completion=False, help="Tenants: invite, list, remove, assign to clusters.")
app.add_typer(tenant_app, name="tenant")


@tenant_app.command("invite")
def tenant_invite(
    name: str,
    cluster: list[str] = typer.Option([], "--cluster", help="a cluster id the tenant may use (repeatable; default: this one)"),
    days: float = typer.Option(7.0, "--days", help="how long the code stays valid"),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Authorize a person: prints a one-time invite code for `remotegpu-cli join CODE --server HOST:PORT`."""
    r = request(LocalClient, lambda c: c.invite(name, list(cluster), days * 86400.0))
    if json_out:
        print_json(r)
    else:
        out.print(f"invite for {r['name']} (clusters: {', '.join(r['clusters'])}), valid until {when(r['expires_at'])}:")
        out.print(r["invitation"], markup=False)
        out.print(f"they run: remotegpu-cli join INVITATION (the line above; it names this node, and its relay when "
                  f"DirectLink is on). The bare code, for --server HOST:PORT: {r['code']}", markup=False)


@tenant_app.command("list")
def tenant_list(json_out: bool = typer.Option(False, "--json")) -> None:
    """Every tenant with uid/gid, clusters, fair-share weight and last activity."""
    rows = request(LocalClient, lambda c: c.tenants())
    if json_out:
        print_json(rows)
        return
    print_table(*tenant_table(rows), has_wide=False)


def tenant_table(rows: list[dict]) -> tuple[list[Col], list[tuple[str, ...]]]:
    """`tenant list`'s table; narrow, it drops GID, then KEYS, then KIND."""
    cols = [Col("TENANT"), Col("UID", right=True), Col("GID", drop=3, right=True), Col("KIND", drop=1),
            Col("CLUSTERS", wrap=True), Col("SHARE", right=True), Col("KEYS", drop=2, right=True), Col("LAST SEEN")]
    return cols, [(t["name"], str(t["uid"]), str(t["gid"]), "invited" if t["managed"] else "local",
                   ",".join(t["clusters"]) or "-", f"{t['share']:g}", str(len(t["keys"])), when(t["last_seen_at"]))
                  for t in rows]


@tenant_app.command("remove")
def tenant_remove(name: str) -> None:
    """Remove a tenant (its account and home go from every node; its ids are never reused)."""
    request(LocalClient, lambda c: c.remove_tenant(name))
    out.print(f"tenant {name} removed")


@tenant_app.command("assign")
def tenant_assign(
    name: str,
    cluster: list[str] = typer.Option([], "--cluster", help="cluster id the tenant may use (repeatable; replaces the list)"),
    share: Optional[str] = typer.Option(None, "--share", help=f"fair-share weight: {SHARE_HELP}"),
) -> None:
    """Set the clusters a tenant may use (--cluster) and its fair-share weight (--share).

    The share divides the tenant's recent GPU usage in the queue order (docs/SCHEDULING.md):
    two busy tenants of shares 2 and 1 get GPU time about 2:1. A local user (an OS account
    of this node) can be given a share before its first job."""
    if not cluster and share is None:
        fail("say what to assign: --cluster ID (repeatable) and/or --share N", 2)
    weight = None
    if share is not None:
        try:
            weight = float(share)
        except ValueError:
            weight = share
        why = validate_share(weight)
        if why:
            fail(f"--share {share}: {why}", 2)
    if weight is not None:
        r = request(LocalClient, lambda c: c.set_tenant_share(name, weight))
        out.print(f"tenant {name}: share {r['share']:g}")
    if cluster:
        if admin_clusters.load_book():  # an admin of several clusters: each of them is told
            admin_clusters.reassign(name, list(dict.fromkeys(cluster)), "assigned")
            return
        request(LocalClient, lambda c: c.assign_tenant(name, list(cluster)))
        out.print(f"tenant {name}: clusters {', '.join(cluster)}")


@tenant_app.command("unassign")
def tenant_unassign(
    name: str,
    cluster: list[str] = typer.Option(..., "--cluster", help="a cluster id the tenant may no longer use (repeatable)"),
) -> None:
    """Take clusters from a tenant: those clusters then refuse its requests (its account,
    ids and files stay, as after `assign`); the clusters of the book are told at once."""
    tenants = {t["name"]: t for t in request(LocalClient, lambda c: c.tenants())}
    if name not in tenants:
        fail(f"no tenant named {name!r}; `mtgpu-admin tenant list` shows them", 2)
    left = [c for c in tenants[name]["clusters"] if c not in cluster]
    if admin_clusters.load_book():
        admin_clusters.reassign(name, left, "unassigned " + ", ".join(cluster))
        return
    request(LocalClient, lambda c: c.assign_tenant(name, left))
    out.print(f"tenant {name}: clusters {', '.join(left) or 'none'}")


clusters_app = typer.Typer(add_completion=False, invoke_without_command=True,
                           help="The clusters this admin runs (docs/CLUSTERS.md).")
app.add_typer(clusters_app, name="clusters")


@clusters_app.callback()
def clusters_list(ctx: typer.Context, json_out: bool = typer.Option(False, "--json")) -> None:
    """This cluster and those in the book (docs/CLUSTERS.md): members up, GPUs, jobs, tenants, health."""
    if ctx.invoked_subcommand is None:
        admin_clusters.clusters_list(json_out)


@clusters_app.command("add")
def clusters_add(
    cluster_id: str = typer.Argument(..., help="the cluster's CLUSTER_ID"),
    server: str = typer.Option(..., "--server", help="HOST:PORT of one of its members (its LISTEN)"),
    secret_file: Path = typer.Option(..., "--secret-file", help="a file holding that cluster's secret (chmod 600)"),
) -> None:
    """Add another cluster this admin runs to the book (it must answer, signed with its secret)."""
    admin_clusters.clusters_add(cluster_id, server, secret_file)


@clusters_app.command("remove")
def clusters_remove(cluster_id: str) -> None:
    """Remove a cluster from the book (nothing changes on it)."""
    admin_clusters.clusters_remove(cluster_id)


def _as_of(text: str | None) -> float | None:
    """Unix seconds, an ISO date/time, or +N days from now."""
    if text is None:
        return None
    if text.startswith("+") and text.endswith("d"):
        return time.time() + float(text[1:-1]) * 86400.0
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        fail(f"--as-of {text!r}: give Unix seconds, an ISO date (2027-01-31T12:00) or +N d (e.g. +31d)", 2)


@app.command()
def retention(
    dry_run: bool = typer.Option(False, "--dry-run", help="only list what would go"),
    as_of: Optional[str] = typer.Option(None, "--as-of", help="evaluate at this time (Unix seconds, ISO date, +Nd)"),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Apply JOB_RETENTION_DAYS and TENANT_RETENTION_DAYS now (the scheduler also does hourly)."""
    r = request(LocalClient, lambda c: c.retention(dry_run=dry_run, as_of=_as_of(as_of)))
    if json_out:
        print_json(r)
    else:
        out.print(r["text"], markup=False)
        for p in r["problems"]:
            out.print(f"problem: {p}", markup=False)


@app.command()
def backup(file: Path = typer.Argument(..., help="where to write it (created 0600; an existing file is replaced "
                                                  "only once the new one is whole)")) -> None:
    """Write a consistent copy of this node's state (queue, jobs' records, tenants with their
    uid/gid and keys, usage) while it runs; `mtgpu-setup restore FILE` brings it back."""
    import os

    from ..state.backup import encode
    doc = request(LocalClient, lambda c: c.backup())
    data = encode(doc)
    target = file.expanduser().absolute()
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as e:
        fail(f"cannot write the backup to {target}: {e.strerror or e}; give a writable path")
    s = doc["summary"]
    out.print(f"backup of {doc['node']} ({doc['mode']}, mtgpu {doc['mtgpu_version']}) written to {target}: "
              f"{s['jobs']} jobs ({s['queued']} queued, {s['running']} running), {s['tenants']} tenants, "
              f"{len(data) / 1024:.0f} KiB", markup=False, soft_wrap=True)


@app.command()
def jobs(active: bool = typer.Option(False, "--active"), json_out: bool = typer.Option(False, "--json"),
         wide: bool = wide_option()) -> None:
    """Jobs of all tenants (root or the admin group)."""
    def all_jobs(c: LocalClient) -> list[dict]:
        if not c.whoami()["admin"]:
            fail("mtgpu-admin jobs needs root or the admin group (ADMIN_GROUP)", 1)
        return c.jobs(all_tenants=True, active_only=active)

    rows = request(LocalClient, all_jobs)
    if json_out:
        print_json(rows)
        return
    print_jobs_table(rows, tenant=True, wide=wide, has_wide=True)


@app.command()
def usage(
    since: Optional[str] = since_option(),
    until: Optional[str] = until_option(),
    by: str = typer.Option("tenant", "--by", help="group by tenant, model (GPU model), node or day"),
    json_out: bool = typer.Option(False, "--json"),
    wide: bool = wide_option(),
) -> None:
    """Finished jobs' usage of every tenant, like sreport: GPU-hours per GPU model, CPU and
    memory hours reserved, run and wait time, wait percentiles per GPU model (docs/ACCOUNTING.md).
    Root or the admin group; tenants see their own with `mt-job usage`."""
    checked(since, until, by, ("tenant", "model", "node", "day"))
    report = request(LocalClient, lambda c: c.usage(since, until, by))
    print_report(report, json_out, "usage of every tenant's finished jobs", wide)


def link_host(listen: str, host: str | None) -> str:
    """HOST:PORT for a link to LISTEN: `host` (the name or address a browser reaches the node
    by) or LISTEN's own host, with a wildcard (0.0.0.0, ::) read as this machine's loopback."""
    listen_host, _, port = listen.rpartition(":")
    listen_host = listen_host.strip("[]")
    if host is None:
        host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(listen_host, listen_host)
    host = host.strip("[]")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@app.command()
def dashboard(host: Optional[str] = typer.Option(None, "--host", help="the node's name or address in the link, as "
                                                 "your browser reaches LISTEN (default: LISTEN's host; 127.0.0.1 "
                                                 "for 0.0.0.0)"),
              print_url: bool = typer.Option(False, "--print-url", help="print only the link, one line on stdout"),
              no_browser: bool = typer.Option(False, "--no-browser", help="do not open a web browser")) -> None:
    """A one-time link (opened once, within a minute) to this node's web dashboard as an
    admin: every tenant's jobs and workspaces (docs/DASHBOARD.md). Root or the admin group."""
    def admin_link(c: LocalClient) -> dict:
        if not c.whoami()["admin"]:
            fail("mtgpu-admin dashboard needs root or the admin group (ADMIN_GROUP); tenants use "
                 "`remotegpu-cli dashboard`", 1)
        return c.dashboard_link()

    link = request(LocalClient, admin_link)
    url = f"http://{link_host(link['listen'], host)}{link['path']}"
    give_link(url, f"the dashboard of {link['cluster_id']} ({link['node']}) as admin {link['name']}, a one-time link "
                   f"(valid {link['expires_in_s']:.0f} s):\n{url}", print_url, not no_browser)


@app.command("simulate-load")
def simulate_load(
    index: int,
    used: Optional[str] = typer.Option(None, "--used", help="used VRAM, e.g. 12G"),
    util: Optional[float] = typer.Option(None, "--util", help="utilization in percent"),
    state_dir: Optional[str] = typer.Option(None, "--state-dir", help="the node's STATE_DIR (default: from the config)"),
) -> None:
    """Set the measured load of simulated GPU INDEX (GPU_BACKEND = "simulated"), as if another program used it."""
    try:
        used_bytes = parse_size(used) if used is not None else None
    except UnitError as e:
        fail(f"--used: {e}", 2)
    directory = Path(state_dir) if state_dir else Path(find_socket()).parent
    write_simulated_load(default_override_path(directory), index, used_vram_bytes=used_bytes, utilization_pct=util)
    out.print(f"simulated GPU {index}: used={used or '-'} util={util if util is not None else '-'}")


directlink_app = typer.Typer(add_completion=False, help="DirectLink (docs/DIRECTLINK.md).")
app.add_typer(directlink_app, name="directlink")


CONFIG_HELP = "default: $MTGPU_CONFIG, else /etc/mtgpu/mtgpu.toml"


@directlink_app.command("cluster-key")
def directlink_cluster_key(config: Optional[str] = typer.Option(None, "--config", help=CONFIG_HELP)) -> None:
    """Print this cluster's DirectLink key (public half) for a relay's operator:
    mtgpu-relay --cluster CLUSTER_ID=KEY. Read from the config's cluster secret; no server needed."""
    from ..config import ConfigError, load_config
    from ..directlink.identity import cluster_key, endpoint_id
    try:
        cfg = load_config(config)
    except ConfigError as e:
        err.print(f"the config cannot be used:\n{e}", markup=False)
        raise typer.Exit(2) from None
    if cfg.CLUSTER_MODE != "cluster":
        err.print("this node is standalone (CLUSTER_MODE): it has no cluster secret and no cluster key", markup=False)
        raise typer.Exit(2)
    path = cfg.secret_file_path
    try:
        secret = path.read_text().strip()
    except OSError as e:
        err.print(f"cannot read the cluster secret {path}: {e.strerror}; run this on a member, as root", markup=False)
        raise typer.Exit(2) from None
    print(f"{cfg.CLUSTER_ID}={endpoint_id(cluster_key(secret, cfg.CLUSTER_ID))}")


one_line_summaries(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

"""remotegpu-cli: a tenant's client from any computer. `join` redeems an invite code
with your key; the other commands talk to the servers you joined, signed with it.
With no command it opens the terminal app (servers, jobs, workspaces; `?` lists its keys).

Servers you joined are kept in ~/.config/remotegpu/servers.json; the key is
~/.config/remotegpu/id_ed25519 unless you give your own with --key.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from ..client.remote import RemoteClient
from ..client.signing import BadKey, generate_key_pair, load_private_key, public_line
from ..tui.rows import (JOB_COLUMNS, SERVER_COLUMNS, WORKSPACE_COLUMNS, ClusterSnapshot, job_items, job_rows,
                        server_rows, snapshot_json, workspace_items, workspace_rows)
from ..tui.source import Cluster, fetch_all, group_by_cluster
from .common import (Col, fail, fit_table, give_link, one_line_summaries, out, print_json, print_jobs_table,
                     print_table, print_warnings, render_table, request, table_width, wrapped)
from .joblog import FOLLOW, HEAD, LOGS_HELP, RANK, TAIL, print_log
from .usage import checked, print_report, since_option, until_option

app = typer.Typer(add_completion=False, no_args_is_help=False, help=__doc__)


@app.callback(invoke_without_command=True)
def _options(ctx: typer.Context,
             home: Optional[Path] = typer.Option(None, "--home", help="the folder of servers.json and the key "
                                                 "(default ~/.config/remotegpu, or $REMOTEGPU_HOME)"),
             refresh_s: float = typer.Option(1.5, "--refresh", min=0.2, max=60.0,
                                             help="the terminal app's refresh period in seconds")) -> None:
    """With no command: the keyboard-driven terminal app (docs/TUI.md; `?` lists its keys)."""
    if home is not None:
        os.environ["REMOTEGPU_HOME"] = str(home.absolute())
    if ctx.invoked_subcommand is None:
        entries = _servers()
        if not entries:
            fail("no server joined yet: remotegpu-cli join CODE --server HOST:PORT (remotegpu-cli --help lists "
                 "the commands)", 2)
        # textual is loaded for the app only, not for every scripted command
        from ..tui.app import run
        run(entries, connect=lambda e: _client(e, timeout_s=LIVE_TIMEOUT_S), refresh_s=refresh_s)


def config_dir() -> Path:
    base = os.environ.get("REMOTEGPU_HOME") or os.path.join(os.path.expanduser("~"), ".config", "remotegpu")
    return Path(base)


def _servers() -> list[dict]:
    path = config_dir() / "servers.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return []


def _save_servers(servers: list[dict]) -> None:
    d = config_dir()
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = d / "servers.json.tmp"
    tmp.write_text(json.dumps(servers, indent=2))
    os.replace(tmp, d / "servers.json")


def _server(name: Optional[str]) -> dict:
    servers = _servers()
    if not servers:
        fail("no server joined yet: remotegpu-cli join CODE --server HOST:PORT", 2)
    if name is None:
        return servers[0]
    for s in servers:
        if name in (s["server"], s.get("node"), s.get("cluster_id")):
            return s
    fail(f"no joined server {name!r}; joined: {', '.join(s['server'] for s in servers)}", 2)


LIVE_TIMEOUT_S = 5.0  # the app and `servers --live`: a server slower than this shows as not answering


def _client(entry: dict, timeout_s: float = 30.0) -> RemoteClient:
    """A client of the entry's server: straight to it when it answers, else through
    DirectLink to the same node (said on stderr, with the path: relayed or direct)."""
    info = entry.get("directlink") or {}
    if info.get("enabled"):
        from ..client import directlink as dl
        if not dl.reachable(entry["server"]):
            dl.check_usable(info, entry["server"])
            tunnel = dl.Tunnel(info, Path(entry["key"]), entry["node"])
            host, port = tunnel.start()
            tunnel.settle()  # the path in use: direct comes within a moment where the NATs allow it
            shown = tunnel.label
            print(f"remotegpu: {entry['server']} does not answer directly; through DirectLink to {entry['node']} "
                  f"({shown})", file=sys.stderr, flush=True)
            client = RemoteClient(f"{host}:{port}", entry["tenant"], Path(entry["key"]), timeout_s=timeout_s)
            client.tunnel = tunnel

            def close() -> None:
                if tunnel.label != shown:
                    print(f"remotegpu: the DirectLink path to {entry['node']} is now {tunnel.label}", file=sys.stderr,
                          flush=True)
                tunnel.close()
            client.on_close = close
            return client
    return RemoteClient(entry["server"], entry["tenant"], Path(entry["key"]), timeout_s=timeout_s)


def _connect(server: Optional[str]):
    """What opens the client for `--server` (the first server joined, by default)."""
    return lambda: _client(_server(server))


@app.command()
def join(
    code: str = typer.Argument(..., help="the invitation `mtgpu-admin tenant invite` printed (mtgpu-invite-...), "
                               "or its bare code with --server"),
    server: Optional[str] = typer.Option(None, "--server", help="HOST:PORT of a node (its LISTEN; default: the "
                                         "invitation's node)"),
    key: Optional[Path] = typer.Option(None, "--key", help="your ed25519 private key, or its .pub (default: make one)"),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Redeem an invitation: registers your public key; you get an account on every node.
    When its node does not answer directly (it is behind NAT), the invitation goes
    through the cluster's DirectLink relay, which it names."""
    from ..client import directlink as dl
    from ..client.errors import ClientError
    try:
        invitation = dl.parse_invitation(code)
    except ClientError as e:
        fail(str(e), 2)
    if invitation is not None:
        code, server = invitation["code"], server or invitation["server"]
    elif server is None:
        fail("a bare invite code needs --server HOST:PORT (a node's LISTEN); the whole invitation "
             "(mtgpu-invite-...) names its node itself", 2)
    try:
        if key is None:
            key = config_dir() / "id_ed25519"
            public = (Path(str(key) + ".pub").read_text().strip() if key.exists() else generate_key_pair(key))
        else:
            private = Path(str(key)[:-4]) if str(key).endswith(".pub") else key
            public = public_line(load_private_key(private), comment="remotegpu")
            key = private
    except (BadKey, OSError) as e:
        fail(str(e), 2)
    info = None
    if invitation is not None and invitation.get("directlink") and not dl.reachable(server):
        print(f"remotegpu: {server} does not answer directly; joining through DirectLink to {invitation['node']}",
              file=sys.stderr, flush=True)
        try:
            r, info = dl.join_through_relay(invitation, public, key)
        except ClientError as e:
            fail(str(e), 1)
    else:
        r = request(lambda: RemoteClient(server), lambda c: c.join(code, public))
    entry = {"server": server, "tenant": r["name"], "key": str(key.absolute()), "cluster_id": r["cluster_id"],
             "node": r["node"], "uid": r["uid"]}
    if info is not None:
        entry["directlink"] = info
    servers = [s for s in _servers() if s["server"] != server] + [entry]
    _save_servers(servers)
    if info is None:
        _refresh_directlink(entry, quiet=True)
    if json_out:
        print_json(r)
    else:
        if info is None and r.get("ssh_listen"):  # the node's own sshd, as it told us at join
            host, port = _ssh_host_port(r["ssh_listen"], server)
            how = f"ssh -i {key} {r['name']}@{host} -p {port}"
        else:  # through DirectLink (or an older node that does not say): the client finds the way
            how = f"remotegpu-cli ssh {r['node']}"
        out.print(f"joined {r['cluster_id']} as {r['name']} (uid {r['uid']}); ssh with: {how}", markup=False)


@app.command()
def servers(json_out: bool = typer.Option(False, "--json"),
            live: bool = typer.Option(False, "--live", help="ask every joined cluster for its nodes, GPUs, live "
                                      "use and your jobs there (the terminal app's servers view)"),
            wide: bool = typer.Option(False, "--wide", help="with --live: every column (full GPU models, UTIL% and "
                                      "VRAM per GPU) even on a narrow terminal; a pipe always gets them")) -> None:
    """The servers you joined (with --live: their nodes and GPUs now)."""
    if live:
        _servers_live(json_out, wide)
        return
    rows = _servers()
    if json_out:
        print_json(rows)
        return
    print_table([Col("SERVER"), Col("CLUSTER"), Col("TENANT"), Col("UID", drop=1, right=True)],
                [(s["server"], s["cluster_id"], s["tenant"], str(s["uid"])) for s in rows])


@app.command("clusters")
def clusters_cmd(json_out: bool = typer.Option(False, "--json")) -> None:
    """The clusters you may use, as they say now: one an admin gave you is added to your
    servers (and to the terminal app and VS Code), one taken from you is removed."""
    from .remotegpu_clusters import clusters
    clusters(_servers(), _save_servers, json_out, _client)


def _servers_live(json_out: bool, wide: bool = False) -> None:
    """The servers view for scripts: one fetch of every joined cluster; a cluster that does
    not answer is listed as unreachable, its error under the table (and the exit status is 1)."""
    snapshots = fetch_all(_clusters(LIVE_TIMEOUT_S))
    if json_out:
        print_json([snapshot_json(s) for s in snapshots])
    else:
        out.print(live_text(snapshots, table_width(wide)), soft_wrap=True)
    if any(s.error for s in snapshots):
        raise typer.Exit(1)


def live_text(snapshots: list[ClusterSnapshot], width: int | None) -> str:
    """`servers --live` at `width` (None: a pipe): one line a node (on 80 columns: GPU models
    without vendor, the mean UTIL and all GPUs' VRAM, or without those columns), and, under
    the table, why each cluster that did not answer did not (in the table: `unreachable`)."""
    failed = {s.cluster for s in snapshots if s.error is not None}
    rows = []
    for r in server_rows(snapshots):
        if r.ref.get("cluster") in failed:
            if "node" in r.ref:  # a node as it was (STATE: stale): no path now, the note says why
                def fix(cells): return cells[:8] + ("-",)
            else:  # the cluster's own row: its server is named in the note
                def fix(cells): return (cells[0], "-") + cells[2:8] + ("-",)
            r = replace(r, cells=fix(r.cells), **({"short": fix(r.short)} if getattr(r, "short", None) else {}))
        rows.append(r)
    notes = [f"{s.cluster} ({s.server}) did not answer: {s.error}" + (" (its nodes as they were)" if s.nodes else "")
             for s in snapshots if s.error is not None]
    return "\n".join([render_table(*view_table(SERVER_COLUMNS, rows, width), width)]
                     + [wrapped(n, width) for n in notes])


# The app's views as tables for 80 columns: shorter headers, and what a narrow terminal drops
# first (servers: the per-GPU VRAM, then UTIL; jobs: EXIT, then NODES; workspaces: IMAGE);
# PATH (an unreachable cluster's error there) and REASON wrap.
VIEW_COLS = {"VRAM GiB used/total": Col("VRAM GiB", drop=2), "UTIL %": Col("UTIL%", drop=1),
             "PATH": Col("PATH", wrap=True), "REASON": Col("REASON", wrap=True), "EXIT": Col("EXIT", drop=1),
             "NODES": Col("NODES", drop=2), "IMAGE": Col("IMAGE", drop=1), "ID": Col("ID", right=True)}


def view_table(columns: tuple[str, ...], rows, width: int | None) -> tuple[list[Col], list[tuple[str, ...]]]:
    """An app view's columns (VIEW_COLS) and its rows' cells for `width` (None: no limit),
    for print_table: the rows' narrow cells (the app's, where a row has them: GPU models
    without vendor, the mean UTIL and the VRAM of all GPUs) when the full ones do not fit."""
    cols = [VIEW_COLS.get(c, Col(c)) for c in columns]
    cells = [r.cells for r in rows]
    if width is not None and fit_table(cols, cells, width)[1]:
        cells = [getattr(r, "short", None) or r.cells for r in rows]
    return cols, cells


def _print_views(snapshots: list[ClusterSnapshot], json_out: bool, items, rows, columns: tuple[str, ...]) -> None:
    """The app's view of these snapshots as a table, or its JSON twin."""
    if json_out:
        print_json(items(snapshots))
        return
    print_table(*view_table(columns, rows(snapshots), table_width()), has_wide=False)


def _clusters(timeout_s: float = 30.0) -> list[Cluster]:
    """Every joined cluster (its servers are alternatives: the first that answers is asked)."""
    return [Cluster(name, es, lambda e: _client(e, timeout_s=timeout_s))
            for name, es in group_by_cluster(_servers()).items()]


def _every_cluster(part: str, json_out: bool, items, rows, columns: tuple[str, ...]) -> None:
    """`jobs` / `workspaces` without --server: one fetch of every joined cluster, listed
    together with their cluster (the app's view and its JSON); a cluster that did not
    answer is said on stderr with its error, and the exit status is 1."""
    clusters = _clusters()
    if not clusters:
        fail("no server joined yet: remotegpu-cli join CODE --server HOST:PORT", 2)
    snapshots = fetch_all(clusters, (part,))
    _print_views(snapshots, json_out, items, rows, columns)
    failed = [s for s in snapshots if s.error is not None]
    for s in failed:
        print(f"remotegpu: cluster {s.cluster} ({s.server}) did not list its {part}: {s.error}", file=sys.stderr)
    if failed:
        raise typer.Exit(1)


SERVER_HELP = "ask only this joined server (default: every joined cluster, with a CLUSTER column / key)"


@app.command()
def whoami(server: Optional[str] = typer.Option(None, "--server"), json_out: bool = typer.Option(False, "--json")) -> None:
    """Ask a server who you are (checks your key)."""
    r = request(_connect(server), lambda c: c.me())
    print_json(r) if json_out else out.print(f"{r['name']} (uid {r['uid']}) on {r['cluster_id']}", markup=False)


@app.command()
def jobs(server: Optional[str] = typer.Option(None, "--server", help=SERVER_HELP),
         json_out: bool = typer.Option(False, "--json")) -> None:
    """Your jobs on every joined cluster (workspaces are in `workspaces`), or, with
    --server, every job of yours on that server's cluster."""
    if server is None:
        _every_cluster("jobs", json_out, job_items, job_rows, JOB_COLUMNS)
        return
    rows = request(_connect(server), lambda c: c.jobs())
    if json_out:
        print_json(rows)
        return
    print_jobs_table(rows)


@app.command()
def submit(
    job_file: Path,
    server: Optional[str] = typer.Option(None, "--server"),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Submit a job file to a server's cluster (runs as your account there)."""
    try:
        script = sys.stdin.read() if str(job_file) == "-" else job_file.read_text()
    except OSError as e:
        fail(f"cannot read {job_file}: {e.strerror}", 2)
    r = request(_connect(server), lambda c: c.submit(script))
    print_warnings(r)
    print_json(r) if json_out else out.print(f"submitted job {r['job_id']}")


@app.command()
def cancel(job_id: int, server: Optional[str] = typer.Option(None, "--server")) -> None:
    """Cancel one of your jobs."""
    request(_connect(server), lambda c: c.cancel(job_id))
    out.print(f"cancelled {job_id}")


@app.command()
def usage(since: Optional[str] = since_option(), until: Optional[str] = until_option(),
          by: str = typer.Option("model", "--by", help="group by model (GPU model), day or node"),
          server: Optional[str] = typer.Option(None, "--server"), json_out: bool = typer.Option(False, "--json")) -> None:
    """Your finished jobs' usage on a cluster, as `mt-job usage` gives it on a node."""
    checked(since, until, by, ("model", "day", "node"))
    report = request(_connect(server), lambda c: c.usage(since, until, by))
    print_report(report, json_out, "usage of your finished jobs", has_wide=False)


@app.command(help=LOGS_HELP)
def logs(job_id: int, server: Optional[str] = typer.Option(None, "--server"), follow: bool = FOLLOW,
         tail: Optional[int] = TAIL, head: Optional[int] = HEAD, rank: int = RANK) -> None:
    print_log(_connect(server), job_id, follow, head, tail, rank)


@app.command()
def workspaces(server: Optional[str] = typer.Option(None, "--server", help=SERVER_HELP),
               json_out: bool = typer.Option(False, "--json")) -> None:
    """Your workspaces on every joined cluster, or on one server's cluster with --server
    (create them in the app, or on a node with mt-container)."""
    if server is None:
        _every_cluster("workspaces", json_out, workspace_items, workspace_rows, WORKSPACE_COLUMNS)
        return
    rows = request(_connect(server), lambda c: c.workspaces())
    if json_out:
        print_json(rows)
        return
    print_table([Col("NAME"), Col("STATE"), Col("NODE"), Col("PORTS", drop=1), Col("REASON", wrap=True)],
                [(ws["workspace"]["name"], ws["state"], ws["workspace"]["node"] or "-",
                  ",".join(str(p["port"]) for p in ws["workspace"]["ports"]) or "-", ws["reason"] or "")
                 for ws in rows], has_wide=False)


def ssh_target(entry: dict, address: str | None) -> tuple[str, int]:
    """(host, port) of the tenant sshd of the member at this API address (None: the joined server)."""
    address = address or entry["server"]
    return _ssh_host_port(request(lambda: RemoteClient(address), lambda c: c.info())["ssh_listen"], address)


def _ssh_host_port(listen: str, address: str) -> tuple[str, int]:
    """(host, port) of a node's SSH_LISTEN; a wildcard host is the host its API was reached at."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if host in ("0.0.0.0", "::", ""):
        host = address.rpartition(":")[0].strip("[]")
    return host, int(port)


def _ssh_base(entry: dict, host: str, port: int) -> list[str]:
    return ["ssh", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=accept-new",
            "-o", f"UserKnownHostsFile={config_dir() / 'known_hosts'}", "-i", entry["key"], "-p", str(port)]


def _ssh_route(entry: dict, node: str, address: str | None) -> tuple[list[str], str]:
    """(ssh and its options, host) for the tenant sshd of a member (its name, its API address):
    straight to it when it answers, else through DirectLink (`remotegpu-cli proxy`, host key pinned)."""
    info = entry.get("directlink") or {}
    address = address or entry["server"]
    if info.get("enabled") and any(n["name"] == node for n in info.get("nodes", [])):
        from ..client import directlink as dl
        from ..client import sshconfig
        if not dl.reachable(address):
            alias = sshconfig.host_alias(node, info["cluster_id"])
            home = os.environ.get("REMOTEGPU_HOME")
            proxy = sshconfig.proxy_command_argv() + (["--home", home] if home else []) + [
                "proxy", "--cluster", info["cluster_id"], node]
            known = config_dir() / "known_hosts.directlink"
            if not known.exists():
                known.write_text(sshconfig.known_hosts_text([{"cluster": info["cluster_id"], "nodes": info["nodes"]}]))
            return ["ssh", "-o", "IdentitiesOnly=yes", "-o", f"ProxyCommand={shlex.join(proxy)}",
                    "-o", f"HostKeyAlias={alias}", "-o", f"UserKnownHostsFile={known}",
                    "-o", "StrictHostKeyChecking=yes", "-i", entry["key"]], alias
    host, port = ssh_target(entry, address)
    return _ssh_base(entry, host, port), host


def _exec_ssh(argv: list[str]) -> None:
    """Become ssh with these arguments (the terminal, its exit status and signals are its)."""
    try:
        os.execvp("ssh", argv)
    except OSError as e:
        fail(f"could not run ssh: {e}", 1)


# Everything after the node (or workspace) is the remote command, as with ssh: `ssh NODE id -un`
# runs `id -un` there (options of this command go before NODE).
REMOTE_COMMAND = {"allow_interspersed_args": False, "ignore_unknown_options": True}


def _remote_command(command: Optional[list[str]]) -> list[str]:
    """The command as given, without a leading `--` (the way it was written before)."""
    command = list(command or [])
    return command[1:] if command[:1] == ["--"] else command
COMMAND_HELP = "run this instead of a terminal (everything after the name, options included, as ssh takes it)"


@app.command(context_settings=REMOTE_COMMAND)
def shell(workspace: str, command: Optional[list[str]] = typer.Argument(None, help=COMMAND_HELP),
          server: Optional[str] = typer.Option(None, "--server")) -> None:
    """A terminal inside a workspace (in tmux on its node), or a command run there: the
    shortcut for `ssh -o SetEnv=MTGPU_WORKSPACE=WS you@node`."""
    command = _remote_command(command)
    entry = _server(server)
    ws = request(lambda: _client(entry), lambda c: c.workspace(workspace))
    if ws["state"] != "running":
        fail(f"workspace {workspace} is {ws['state']}" + (f" ({ws['reason']})" if ws["reason"] else ""), 1)
    base, host = _ssh_route(entry, ws["workspace"]["node"], ws["workspace"]["node_address"])
    argv = base + ["-o", f"SetEnv=MTGPU_WORKSPACE={ws['workspace']['name']}"]
    argv += ["-t"] if not command else []
    argv += [f"{entry['tenant']}@{host}", *(command or [])]
    _exec_ssh(argv)


@app.command(context_settings=REMOTE_COMMAND)
def ssh(node: Optional[str] = typer.Argument(None, help="the node (default: the joined server's own)"),
        command: Optional[list[str]] = typer.Argument(None, help=COMMAND_HELP),
        server: Optional[str] = typer.Option(None, "--server")) -> None:
    """A terminal on a node (in tmux there), or a command run there, as you: straight to its
    tenant sshd when it answers, else through DirectLink."""
    command = _remote_command(command)
    entry = _server(server)
    nodes = request(lambda: _client(entry), lambda c: c.nodes())
    node = node or entry["node"]
    found = [n for n in nodes if n["name"] == node]
    if not found:
        fail(f"no node {node!r} in this cluster; its nodes: {', '.join(n['name'] for n in nodes)}", 2)
    base, host = _ssh_route(entry, node, found[0]["address"])
    argv = base + (["-t"] if not command else []) + [f"{entry['tenant']}@{host}", *(command or [])]
    _exec_ssh(argv)


@app.command()
def forward(
    workspace: str, port: int = typer.Argument(..., help="the workspace's (container) port"),
    local_port: Optional[int] = typer.Option(None, "--local-port", "-l", help="default: the same as PORT"),
    server: Optional[str] = typer.Option(None, "--server"),
    dry_run: bool = typer.Option(False, "--print", help="print the ssh command instead of running it"),
) -> None:
    """Bring a workspace's port to this computer: http://localhost:PORT reaches it, through
    an SSH local forward to the node's tenant sshd (the port is private to you there)."""
    entry = _server(server)
    ws = request(lambda: _client(entry), lambda c: c.workspace(workspace))
    if ws["state"] != "running":
        fail(f"workspace {workspace} is {ws['state']}" + (f" ({ws['reason']})" if ws["reason"] else ""), 1)
    found = [p for p in ws["workspace"]["ports"] if p["port"] == port]
    if not found or not found[0]["host_port"]:
        have = ", ".join(str(p["port"]) for p in ws["workspace"]["ports"]) or "none"
        fail(f"workspace {workspace} publishes no port {port} (its ports: {have}); create it with --port {port}", 2)
    base, host = _ssh_route(entry, ws["workspace"]["node"], ws["workspace"]["node_address"])
    local = local_port or port
    argv = base + ["-N", "-o", "ExitOnForwardFailure=yes",
                                               "-L", f"127.0.0.1:{local}:127.0.0.1:{found[0]['host_port']}",
                                               f"{entry['tenant']}@{host}"]
    if dry_run:
        out.print(" ".join(argv), markup=False)
        return
    url = (found[0]["url"] or "").replace(f"localhost:{found[0]['host_port']}", f"localhost:{local}")
    print(f"forwarding {url or f'http://localhost:{local}'} to workspace {workspace} port {port} (Ctrl-C ends it)",
          file=sys.stderr, flush=True)
    _exec_ssh(argv)


# ------------------------------------------------------------ DirectLink
def _refresh_directlink(entry: dict, quiet: bool = False) -> dict | None:
    """Ask the server for its DirectLink details (relays, a credential for our key, the
    nodes) and keep them in the entry; the stored ones when it cannot be reached."""
    from ..client.directlink import endpoint_id
    from ..client.errors import ClientError
    try:
        ident = endpoint_id(load_private_key(Path(entry["key"])))
        with _client(entry) as c:
            info = c.directlink(ident)
    except (ClientError, BadKey, OSError) as e:
        if not quiet:
            print(f"remotegpu: {entry['server']} cannot be asked now ({e}); using what was kept", file=sys.stderr)
        return entry.get("directlink")
    entry["directlink"] = info
    _save_servers([entry if s["server"] == entry["server"] else s for s in _servers()])
    return info


def _entry_of_cluster(cluster: Optional[str]) -> dict:
    servers = _servers()
    for s in servers:
        if cluster in (None, s["cluster_id"]) and s.get("directlink"):
            return s
    fail(f"no joined cluster {cluster or ''} with DirectLink details: run `remotegpu-cli ssh-config` where a node "
         "is reachable", 2)


@app.command()
def proxy(node: str = typer.Argument(..., help="the node (NODE or NODE.CLUSTER)"),
          cluster: Optional[str] = typer.Option(None, "--cluster", help="the cluster id (default: the first joined)"),
          service: str = typer.Option("ssh", "--service", help="ssh (the node's tenant sshd) or api"),
          quiet: bool = typer.Option(False, "--quiet", "-q", help="say nothing on stderr")) -> None:
    """Connect stdin/stdout to a node's sshd through DirectLink, for ssh's ProxyCommand
    (`remotegpu-cli ssh-config` writes it). Says on stderr whether it is relayed or direct."""
    import asyncio

    from ..client import directlink as dl
    from ..client.errors import ClientError
    entry = _entry_of_cluster(cluster)
    try:
        info = dl.check_usable(entry.get("directlink"), entry["server"])
        code = asyncio.run(dl.proxy(info, Path(entry["key"]), node, service, quiet))
    except ClientError as e:
        fail(str(e), 1)
    raise typer.Exit(code)


@app.command()
def tunnel(server: Optional[str] = typer.Option(None, "--server", help="the joined server (default: the first)")) -> None:
    """A loopback port that reaches the server's node API through DirectLink, for programs
    that sign their own requests (the VS Code extension, when the server does not answer
    directly). Prints one JSON line, {"address": "127.0.0.1:PORT", "node", "path"}, then
    keeps the tunnel until its standard input ends."""
    from ..client import directlink as dl
    from ..client.errors import ClientError
    entry = _server(server)
    try:
        info = dl.check_usable(entry.get("directlink"), entry["server"])
        t = dl.Tunnel(info, Path(entry["key"]), entry["node"])
        host, port = t.start()
    except ClientError as e:
        fail(str(e), 1)
    t.settle()
    print(json.dumps({"address": f"{host}:{port}", "node": entry["node"],
                      "path": "direct" if t.path == "direct" else "relayed"}), flush=True)
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        t.close()


@app.command()
def dashboard(server: Optional[str] = typer.Option(None, "--server", help="the joined server (default: the first)"),
              print_url: bool = typer.Option(False, "--print-url", help="print only the link, one line on stdout "
                                             "(for scripts)"),
              no_browser: bool = typer.Option(False, "--no-browser", help="do not open a web browser")) -> None:
    """The node's web dashboard in your browser: members, GPUs and their use now, your
    queue with the reasons, your workspaces (docs/DASHBOARD.md). The server gives a
    one-time link (opened once, within a minute). When the server does not answer
    directly, the link goes through DirectLink to a forward on 127.0.0.1, which this
    command keeps open until Ctrl-C."""
    entry = _server(server)

    def show(c: RemoteClient) -> None:
        link = c.dashboard_link()
        url = f"http://{c.server}{link['path']}"
        give_link(url, f"the dashboard of {link['cluster_id']} ({link['node']}) for {link['name']}, a one-time link "
                       f"(valid {link['expires_in_s']:.0f} s):\n{url}", print_url, not no_browser)
        if c.path == "direct":
            return
        print(f"remotegpu: the dashboard goes through DirectLink ({c.path}); keeping {c.server} open for the browser "
              "(Ctrl-C ends it)", file=sys.stderr, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass

    request(lambda: _client(entry), show)


@app.command("ssh-config")
def ssh_config(
    file: Path = typer.Option(Path.home() / ".ssh" / "config", "--file", help="the ssh config to write into"),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Write a Host NODE.CLUSTER for every node of every cluster you joined into your
    ssh config (one marked block, replaced on each run), going through DirectLink, with
    the nodes' host keys pinned in ~/.config/remotegpu/known_hosts.directlink (in --home
    when given): then plain `ssh`,
    `scp` and VS Code Remote-SSH reach the nodes from anywhere."""
    from ..client import sshconfig
    entries = []
    for entry in _servers():
        info = _refresh_directlink(entry)
        if not info or not info.get("enabled"):
            print(f"remotegpu: {entry['server']} ({entry['cluster_id']}) has no DirectLink relay: skipped",
                  file=sys.stderr)
            continue
        entries.append({"cluster": info["cluster_id"], "tenant": entry["tenant"], "key": entry["key"],
                        "nodes": info["nodes"]})
    home = os.environ.get("REMOTEGPU_HOME")
    try:
        sshconfig.write(file, config_dir() / "known_hosts.directlink", entries, home)
    except (OSError, ValueError) as e:
        fail(f"cannot write {file}: {e}", 1)
    hosts = [sshconfig.host_alias(n["name"], e["cluster"]) for e in entries for n in e["nodes"]]
    if json_out:
        print_json({"file": str(file), "hosts": hosts})
    else:
        out.print(f"{file}: " + (", ".join(hosts) or "no hosts") + (" (ssh HOST)" if hosts else ""), markup=False)


one_line_summaries(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

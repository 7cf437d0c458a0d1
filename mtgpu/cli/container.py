"""mt-container: workspaces, long-running containers you develop in (docs/WORKSPACES.md).

Create one from a template of the node (--template), an image (--image) or a project's devcontainer.json (--devcontainer); its resources are reserved by the scheduler as a job's are: placed now, queued with the reason, or refused at once when no node could ever hold it.

Then: list, show, ports, logs; shell (a terminal inside) and exec WS -- CMD; stop (its GPUs released, its container kept), start, rm; save WS NAME[:TAG] (an image any member can run).
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import List, Optional

import typer

from ..client.local import ClientError, LocalClient
from .common import Col, err, fail, one_line_summaries, out, print_fields, print_json, print_table, request
from .joblog import FOLLOW, TAIL, print_log
from .podman import tenant_podman
from .workspace_wait import WorkspaceEnded, WorkspaceNotUp, not_up_message, view, wait_until_up

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
SHELL = 'if [ -x /bin/bash ]; then exec /bin/bash -l; fi; exec /bin/sh -l'


def _client() -> LocalClient:
    return LocalClient()


def _resources(gpus, vram, cpus, mem, gpu_mode, server) -> dict[str, str]:
    given = {"gpus": gpus, "vram": vram, "cpus": cpus, "mem": mem, "gpu-mode": gpu_mode, "server": server}
    return {k: str(v) for k, v in given.items() if v is not None}


@app.command()
def create(
    template: Optional[str] = typer.Option(None, "--template", "-t", help="a template of the node (see the error "
                                                                          "without one for the list)"),
    image: Optional[str] = typer.Option(None, "--image", help="an image the cluster offers (or yours, where allowed)"),
    devcontainer: Optional[str] = typer.Option(None, "--devcontainer", help="a project folder or its "
                                                                            "devcontainer.json"),
    name: Optional[str] = typer.Option(None, "--name", help="default: from the template, image or project"),
    gpus: Optional[str] = typer.Option(None, "--gpus"), vram: Optional[str] = typer.Option(None, "--vram"),
    cpus: Optional[str] = typer.Option(None, "--cpus"), mem: Optional[str] = typer.Option(None, "--mem"),
    gpu_mode: Optional[str] = typer.Option(None, "--gpu-mode"),
    server: Optional[str] = typer.Option(None, "--server", help="on this member only"),
    port: List[int] = typer.Option([], "--port", "-p", help="a container port to publish (repeat for more)"),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="wait until it runs (or says why it cannot yet)"),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Create a workspace: its resources are reserved now (or it queues, saying why)."""
    body: dict = {"name": name, "template": template, "image": image, "ports": port,
                  "resources": _resources(gpus, vram, cpus, mem, gpu_mode, server)}
    if devcontainer is not None:
        from .devcontainer import read_devcontainer

        body["devcontainer"] = read_devcontainer(devcontainer)
    try:
        with _client() as c:
            r = c.create_workspace(body)
            if r.get("warning"):
                err.print(f"warning: {r['warning']}", markup=False)
            _finish(c, view(c, r["name"], r["job_id"]), wait, json_out)
    except ClientError as e:
        fail(e)


def _finish(c: LocalClient, ws: dict, wait: bool, json_out: bool) -> None:
    """create and start alike: wait (cli/workspace_wait.py) unless --no-wait, print the
    workspace; one that ended instead of running exits 1 with why, as does one whose
    container was not seen up in time (with what was seen last)."""
    try:
        if wait:
            ws = wait_until_up(c, ws)
    except WorkspaceEnded as e:
        if json_out:
            print_json(e.record)
        fail(not_up_message(c, e), 1)
    except WorkspaceNotUp as e:
        if json_out:
            print_json(e.record)
        fail(str(e), 1)
    if json_out:
        print_json(ws)
    else:
        _print_summary(ws)


def _print_summary(ws: dict) -> None:
    w = ws["workspace"]
    state = ws["state"] + (f" on {w['node']}" if ws["state"] == "running" and w["node"] else "")
    out.print(f"workspace {w['name']} (job {ws['id']}): {state}" + (f": {ws['reason']}" if ws["reason"] else ""),
              markup=False)
    for p in w["ports"]:
        if p["url"]:
            out.print(f"  port {p['port']}: {p['url']}", markup=False)


@app.command("list")
def list_(all_: bool = typer.Option(False, "--all", help="every tenant's (admins)"),
          json_out: bool = typer.Option(False, "--json")) -> None:
    """Your workspaces."""
    items = request(_client, lambda c: c.workspaces(all_tenants=all_))
    if json_out:
        print_json(items)
        return
    print_table(*workspace_table(items), has_wide=False)


def workspace_table(items: list[dict]) -> tuple[list[Col], list[tuple[str, ...]]]:
    """`mt-container list`'s table; narrow, it drops ID, then PORTS, then IMAGE; REASON wraps."""
    cols = [Col("NAME"), Col("ID", drop=3, right=True), Col("STATE"), Col("NODE"), Col("IMAGE", drop=1),
            Col("GPUS"), Col("PORTS", drop=2), Col("REASON", wrap=True)]
    rows = []
    for ws in items:
        w = ws["workspace"]
        ports = ",".join(f"{p['port']}->{p['host_port']}" if p["host_port"] else str(p["port"]) for p in w["ports"])
        gpus = ",".join(str(g["index"]) for g in ws["gpus"]) if ws["state"] == "running" else "-"
        rows.append((w["name"], str(ws["id"]), ws["state"], w["node"] or "-", w["image"] or "-", gpus or "-",
                     ports or "-", ws["reason"] or ""))
    return cols, rows


@app.command()
def show(name: str, json_out: bool = typer.Option(False, "--json")) -> None:
    """One workspace in full: where it runs, what it holds, why it waits or stopped."""
    ws = request(_client, lambda c: c.workspace(name))
    if json_out:
        print_json(ws)
        return
    w, spec = ws["workspace"], ws["spec"]
    rows = [("name", w["name"]), ("job", ws["id"]), ("state", ws["state"]), ("reason", ws["reason"] or "-"),
            ("source", w["source"]), ("image", w["image"]), ("node", w["node"] or "-"),
            ("container", w["container"] or "-"),
            ("gpus", ",".join(f"{g['node']}:{g['index']}" for g in ws["gpus"]) or "-"),
            ("cpus", spec["cpus"] or "-"), ("mem", spec["mem_bytes"] or "-"),
            ("command", shlex.join(w["command"]) if w["command"] else "(none: kept up idle)")]
    rows += [("port", f"{p['port']} -> {p['url'] or 'not published yet'}") for p in w["ports"]]
    print_fields(rows, ws.get("history"))


@app.command()
def ports(name: str, json_out: bool = typer.Option(False, "--json")) -> None:
    """Its published ports: on the node's loopback; from a laptop, `remotegpu-cli forward WS PORT`."""
    ws = request(_client, lambda c: c.workspace(name))
    if json_out:
        print_json(ws["workspace"]["ports"])
        return
    if not ws["workspace"]["ports"]:
        out.print(f"workspace {name} publishes no port (create it with --port N)", markup=False)
    for p in ws["workspace"]["ports"]:
        out.print(f"{p['port']}: {p['url'] or 'not published (the workspace is not running)'}", markup=False)


def _action(name: str, action: str, json_out: bool) -> None:
    r = request(_client, lambda c: c.workspace_action(name, action))
    if json_out:
        print_json(r)
    elif action == "rm":
        out.print(f"removed workspace {r['removed']}", markup=False)
    else:
        _print_summary(r)


@app.command()
def stop(name: str, json_out: bool = typer.Option(False, "--json")) -> None:
    """Stop it: its GPUs and reservation are released, its container (and what you installed) kept."""
    _action(name, "stop", json_out)


@app.command()
def start(name: str,
          wait: bool = typer.Option(True, "--wait/--no-wait", help="wait until it runs (or says why it cannot yet)"),
          json_out: bool = typer.Option(False, "--json")) -> None:
    """Start a stopped workspace again, on the member that keeps its container (waiting as create does)."""
    try:
        with _client() as c:
            _finish(c, c.workspace_action(name, "start"), wait, json_out)
    except ClientError as e:
        fail(e)


@app.command()
def rm(name: str, json_out: bool = typer.Option(False, "--json")) -> None:
    """Remove it: its reservation, its container and its layer."""
    _action(name, "rm", json_out)


@app.command()
def save(name: str, image: str = typer.Argument(..., metavar="NAME[:TAG]"),
         json_out: bool = typer.Option(False, "--json")) -> None:
    """Save the workspace (what you installed in it too) as an image your new workspaces and
    container jobs can use on any member: localhost/mtgpu-saved/YOU/NAME:TAG."""
    r = request(_client, lambda c: c.save_workspace(name, image))
    if json_out:
        print_json(r)
    else:
        out.print(f"saved workspace {name} as {r['image']} ({r['digest'][:19]})", markup=False)
        if not r.get("offered", True):
            out.print("the cluster could not record it yet: members can use it once this member's next "
                      "registration is committed (within seconds once a scheduler is reachable)", markup=False)


@app.command(help="Print the workspace's output (its command's, and its lifecycle commands').")
def logs(name: str, follow: bool = FOLLOW, tail: Optional[int] = TAIL) -> None:
    ws = request(_client, lambda c: c.workspace(name))
    print_log(_client, ws["id"], follow, None, tail, 0)


def _podman_exec(name: str, argv: list[str], tty: bool) -> None:
    """podman exec into the workspace, as the calling tenant, on this node."""
    if os.geteuid() == 0:
        fail("mt-container shell/exec run as the workspace's tenant; root uses podman itself", 2)
    try:
        with _client() as c:
            ws = c.workspace(name)
            here = c.health()["node"]
            w = ws["workspace"]
            if ws["state"] != "running" or not w["container"]:
                fail(f"workspace {name} is {ws['state']}" + (f" ({ws['reason']})" if ws["reason"] else "")
                     + f"; `mt-container start {name}` starts it", 1)
            if w["node"] != here:
                fail(f"workspace {name} runs on {w['node']}, not on {here}: run this there, or "
                     f"`ssh -o SetEnv=MTGPU_WORKSPACE={name} {ws['tenant']}@{w['node']}`", 1)
            got = c.podman_env(enter=w["container"])  # this process joins the workspace's cgroup: its GPUs only
    except ClientError as e:
        fail(e)
    if got.get("entered") is None:
        fail(f"workspace {name}: its container {w['container']} is not running here as yours; "
             f"`mt-container show {name}` says where it is", 1)
    podman, env = tenant_podman(got)
    flags = ["-i"] + (["-t"] if tty else [])
    term = ["-e", f"TERM={os.environ['TERM']}"] if tty and os.environ.get("TERM") else []
    os.execve(podman, [podman, "exec", *flags, *term, w["container"], *argv], env)


@app.command()
def shell(name: str) -> None:
    """A terminal inside the workspace (bash when the image has it, else sh)."""
    _podman_exec(name, ["/bin/sh", "-c", SHELL], sys.stdin.isatty())


@app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec_(ctx: typer.Context, name: str) -> None:
    """Run a command inside: mt-container exec WS -- CMD ARGS..."""
    argv = list(ctx.args)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        fail("give the command after --, e.g. mt-container exec WS -- nvidia-smi", 2)
    _podman_exec(name, argv, sys.stdin.isatty() and sys.stdout.isatty())


one_line_summaries(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()


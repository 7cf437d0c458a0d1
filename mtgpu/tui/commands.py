"""The `:` command line: its commands, parsed into (name, arguments) before the app acts,
so that what a command means is tested without a terminal."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

COMMANDS = {
    "servers": "show the servers view",
    "jobs": "show the jobs view",
    "workspaces": "show the workspaces view",
    "refresh": "ask every cluster now",
    "filter TEXT": "show only rows with every word of TEXT (empty: all)",
    "sort COLUMN [desc]": "order the view by a column (its heading, e.g. sort node)",
    "cancel ID [cluster=C]": "cancel one of your jobs",
    "logs ID [cluster=C]": "follow a job's log",
    "create template NAME [name=WS] [cluster=C]": "create a workspace from a template of the node",
    "create image REF [name=WS] [gpus=N] [ports=P,Q] [cluster=C]": "create a workspace from an image",
    "create devcontainer PATH [name=WS] [node=N] [cluster=C]":
        "create one from a devcontainer.json in your home on a node (read and built there, as you; "
        "you watch it, then Enter comes back)",
    "start|stop|rm WS [cluster=C]": "start, stop or remove a workspace",
    "quit": "leave the app",
}


class CommandError(ValueError):
    """A command line that means nothing: the message says what would."""


@dataclass(frozen=True)
class Command:
    name: str
    args: tuple[str, ...] = ()
    options: dict[str, str] = field(default_factory=dict)


def parse_command(line: str) -> Command:
    """`cancel 12 cluster=lab` -> Command('cancel', ('12',), {'cluster': 'lab'})."""
    try:
        words = shlex.split(line)
    except ValueError as e:
        raise CommandError(f"cannot read {line!r}: {e}") from None
    if not words:
        raise CommandError("type a command (? lists them)")
    name, rest = words[0].lower(), words[1:]
    if name == "filter":  # its words are the text, '=' and all
        return Command(name, tuple(rest))
    args = tuple(w for w in rest if "=" not in w)
    options = dict(w.split("=", 1) for w in rest if "=" in w)
    known = {k.split()[0] for k in COMMANDS} | {"start", "stop", "rm", "q", "help"}
    if name not in known and name != "start|stop|rm":
        raise CommandError(f"no command {name!r}; the commands are: " +
                           ", ".join(sorted(known - {"q", "start|stop|rm"})))
    need = {"cancel": 1, "logs": 1, "start": 1, "stop": 1, "rm": 1, "create": 2, "sort": 1}
    if len(args) < need.get(name, 0):
        usage = [k for k in COMMANDS if k.split()[0] == name or name in k.split()[0].split("|")]
        raise CommandError(f"{name} needs more: {usage[0] if usage else name}")
    most = {"cancel": 1, "logs": 1, "start": 1, "stop": 1, "rm": 1, "create": 2, "sort": 2}.get(name, 0)
    if len(args) > most:
        raise CommandError(f"{name} takes {most or 'no'} argument{'s' if most != 1 else ''}, not "
                           f"{' '.join(args)!r} (quote a path with spaces)")
    if name == "sort" and len(args) == 2 and args[1].lower() != "desc":
        raise CommandError(f"sort COLUMN [desc]: {args[1]!r} is not desc")
    if name in ("cancel", "logs") and not args[0].isdigit():
        raise CommandError(f"{name} takes a job id (a number), not {args[0]!r}")
    if name == "create" and args[0] not in ("template", "image", "devcontainer"):
        raise CommandError(f"create from 'template NAME', 'image REF' or 'devcontainer PATH', not {args[0]!r}")
    allowed = _OPTIONS.get(f"{name} {args[0]}" if name == "create" else name, ())
    unknown = [k for k in options if k not in allowed]
    if unknown:
        raise CommandError(f"{name}{' ' + args[0] if name == 'create' else ''} takes no {unknown[0]}=" +
                           (f"; it takes {', '.join(k + '=' for k in allowed)}" if allowed else ""))
    return Command("quit" if name == "q" else name, args, options)


RESOURCES = ("gpus", "vram", "cpus", "mem", "gpu-mode")
_OPTIONS = {
    "cancel": ("cluster",), "logs": ("cluster",), "start": ("cluster",), "stop": ("cluster",), "rm": ("cluster",),
    "create template": ("name", "cluster", "ports", *RESOURCES), "create image": ("name", "cluster", "ports", *RESOURCES),
    "create devcontainer": ("name", "node", "cluster"),
}


def devcontainer_command(cmd: Command) -> str:
    """What `create devcontainer PATH` runs on the node, as the tenant (one shell line for ssh)."""
    path = cmd.args[1]
    if path == "~" or path.startswith("~/"):  # the command runs in your home there
        path = path[2:] or "."
    argv = ["mt-container", "create", "--devcontainer", path]
    if "name" in cmd.options:
        argv += ["--name", cmd.options["name"]]
    return shlex.join(argv)


def workspace_body(cmd: Command) -> dict:
    """The `POST /v1/workspaces` body of a `create` command."""
    kind, what = cmd.args[0], cmd.args[1]
    body: dict = {kind: what}
    if "name" in cmd.options:
        body["name"] = cmd.options["name"]
    resources = {k: v for k, v in cmd.options.items() if k in RESOURCES}
    if resources:
        body["resources"] = resources
    if "ports" in cmd.options:
        try:
            body["ports"] = [int(p) for p in cmd.options["ports"].split(",") if p]
        except ValueError:
            raise CommandError(f"ports= takes numbers separated by commas, not {cmd.options['ports']!r}") from None
    return body

"""`mtgpu-setup status`: the service's state, the node's health, its role and the versions."""

from __future__ import annotations

import shlex
import subprocess
import textwrap
from pathlib import Path

from ..config import ConfigError, load_config
from .environment import probe_venv
from .install import check_root
from .layout import Layout
from .manifest import read_manifest
from .node import role_of, try_health
from .service import Platform, Runner, ServiceChoice, choose_service, make_service
from .wsl_drives import WindowsDrives

# exit statuses, as an LSB init script's status action has them
RUNNING, NOT_ANSWERING, NOT_RUNNING = 0, 1, 3


def gather_status(root: Path, config: Path | None = None, venv: Path | None = None, service: str = "auto",
                  platform: Platform | None = None, run: Runner = subprocess.run,
                  windows_drives: WindowsDrives | None = None) -> dict:
    """One document: installed, service (kind, state, pid, autostart), node (answers, role,
    version, ...), environment, config, and on a WSL2 host `windows_drives` (whether the
    Windows drives are open to tenants). `exit` is the status the command ends with."""
    root = check_root(root)
    platform = platform or Platform.probe()
    m = read_manifest(Layout.make(root).manifest)
    layout = Layout.make(root, config or (m.config if m else None), venv or (m.venv if m else None))
    if m is not None:
        choice = ServiceChoice(m.service, m.boot_hook, "")
    else:
        choice = choose_service(platform, service, layout.prefixed)
    svc = make_service(choice, layout, run)
    installed = svc.definition.exists()
    pid = svc.running_pid() if installed else None
    doc: dict = {
        "installed": installed,
        # what installs it, with the flags this status was given (an image under --root stays there)
        "install_command": install_command(root, config),
        "manifest": str(layout.manifest) if m is not None else None,
        "service": {"kind": choice.kind, "definition": str(svc.definition), "boot_hook": choice.boot_hook,
                    "state": "running" if pid else ("stopped" if installed else "not installed"), "pid": pid,
                    "autostart": bool(installed and svc.autostart_enabled())},
        "config": {"path": str(layout.config), "valid": False, "problem": None},
        "node": {"answers": False, "error": None},
        "environment": {"venv": str(layout.venv), "version": None},
    }
    if windows_drives is None and platform.wsl:
        windows_drives = WindowsDrives(layout.wsl_conf, live=not layout.prefixed)
    if windows_drives is not None:
        doc["windows_drives"] = windows_drives.status()
    info = probe_venv(layout.venv, run)
    if info is not None:
        doc["environment"]["version"] = info.version
    try:
        cfg = load_config(layout.config)
    except ConfigError as e:
        doc["config"]["problem"] = str(e)
        doc["exit"] = NOT_RUNNING if not pid else NOT_ANSWERING
        return doc
    doc["config"].update(valid=True, state_dir=str(cfg.STATE_DIR), socket=str(cfg.socket_path))
    health, why = try_health(cfg.socket_path)
    if health is None:
        doc["node"]["error"] = why
    else:
        raft = health.get("raft") or {}
        doc["node"] = {"answers": True, "error": None, "name": health.get("node"), "pid": health.get("pid"),
                       "role": role_of(health), "voter": raft.get("voter"), "cluster_id": health.get("cluster_id"),
                       "scheduler": health.get("scheduler"), "version": health.get("version"),
                       "standing": health.get("standing")}
    doc["exit"] = RUNNING if pid and health else (NOT_ANSWERING if pid else NOT_RUNNING)
    return doc


def install_command(root: Path, config: Path | None = None) -> str:
    """`mtgpu-setup install --yes` with the --root and --config of the install asked about."""
    words = ["mtgpu-setup", "install", "--yes"]
    if str(root) != "/":
        words += ["--root", str(root)]
    if config is not None:
        words += ["--config", str(config)]
    return shlex.join(words)


def status_lines(doc: dict) -> list[str]:
    s, n, e, c = doc["service"], doc["node"], doc["environment"], doc["config"]
    if not doc["installed"]:
        lines = [f"service:  not installed ({s['definition']} is missing); "
                 f"`{doc.get('install_command') or 'mtgpu-setup install --yes'}` installs it"]
    else:
        state = f"running (pid {s['pid']})" if s["pid"] else "stopped"
        lines = [f"service:  {s['kind']} {s['definition']}: {state}; autostart "
                 f"{'on' if s['autostart'] else 'off'} ({s['boot_hook']})"]
    if n["answers"]:
        lines.append(f"node:     {n['name']} answers (pid {n['pid']}) on {c.get('socket')}")
        lines.append(f"role:     {n['role']}" + (f" of the cluster {n['cluster_id']}" if n.get("cluster_id") else ""))
        lines += standing_lines(n.get("standing"))
        lines.append(f"version:  {n['version']} (environment {e['venv']}: {e['version'] or 'no mtgpu'})")
    elif n["error"]:
        lines.append(f"node:     does not answer ({n['error']})")
    else:
        lines.append("node:     not asked (the config cannot be read, so its socket is not known)")
    if not n["answers"]:
        lines.append(f"version:  environment {e['venv']}: {e['version'] or 'no mtgpu'}")
    lines.append(f"config:   {c['path']}" + ("" if c["valid"] else f": {c['problem']}"))
    return lines + windows_drives_lines(doc.get("windows_drives"))


def windows_drives_lines(w: dict | None) -> list[str]:
    """A WSL2 host's Windows drives: open to tenants or not, now and from WSL's next start."""
    if w is None:
        return []
    lines = []
    if w["open"]:
        lines.append(f"windows:  drives OPEN to every tenant: {', '.join(w['open'])}; `mtgpu-setup install --yes` "
                     "hides them (docs/INSTALL.md, WSL2 hosts)")
    elif w["drives"]:
        lines.append(f"windows:  drives hidden from tenants (owner-only): "
                     f"{', '.join(d['target'] for d in w['drives'])}")
    else:
        lines.append("windows:  no Windows drives are mounted" if w["live"] else
                     "windows:  the drives mounted on this machine are not asked about under --root")
    lines.append(f"          {w['wsl_conf']}: " + ("owner-only [automount] options, from WSL's next start"
                                                   if w["wsl_conf_hides"] else
                                                   "its [automount] options leave the drives open at WSL's next start"))
    return lines


def standing_lines(standing: dict | None, width: int = 80) -> list[str]:
    """The node's health: `up`, or `degraded` with since when it is cut off from its cluster,
    what still works there and what does not (server/cluster/standing.py); none from a node
    too old to say."""
    if not standing:
        return []
    if standing.get("in_touch", True):
        return [f"health:   {standing.get('health', 'up')}"]
    indent = " " * 10

    def wrap(text: str, first: str, rest: str = indent) -> list[str]:
        return textwrap.wrap(text, width=width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False)

    lines = wrap(f"{standing.get('health', 'degraded')}: {standing.get('problem')}", "health:   ")
    for title, key in (("works:", "works"), ("fails:", "fails")):
        for i, item in enumerate(standing.get(key) or ()):
            lines += wrap(item, (title if i == 0 else "").ljust(10) + "- ", indent + "  ")
    return lines

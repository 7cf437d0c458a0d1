"""`remotegpu-cli ssh-config`: one marker-delimited block in ~/.ssh/config with a Host
per node (NODE.CLUSTER) whose ProxyCommand is `remotegpu-cli proxy`, and the nodes'
host keys in a known_hosts file of our own. Running it again replaces the block and
rewrites our known_hosts, so nothing is ever duplicated; the rest of the user's
config is kept byte for byte."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

BEGIN = "# >>> remotegpu: written by `remotegpu-cli ssh-config`; edits inside are replaced >>>"
END = "# <<< remotegpu <<<"


def proxy_command_argv() -> list[str]:
    """How ssh starts this client: the absolute path of remotegpu-cli, or this Python
    running the module when the script is not installed on PATH."""
    found = shutil.which("remotegpu-cli")
    if found:
        return [os.path.abspath(found)]
    return [os.path.abspath(sys.executable), "-m", "mtgpu.cli.remotegpu"]


def host_alias(node: str, cluster: str) -> str:
    return f"{node}.{cluster}"


def render_block(entries: list[dict], known_hosts: Path, home: str | None) -> str:
    """entries: {"cluster", "tenant", "key", "nodes": [{"name", ...}]}."""
    base = proxy_command_argv()
    lines = [BEGIN]
    for e in entries:
        for n in e["nodes"]:
            alias = host_alias(n["name"], e["cluster"])
            argv = base + (["--home", home] if home else []) + ["proxy", "--cluster", e["cluster"], n["name"]]
            lines += [f"Host {alias}",
                      f"    HostName {alias}",
                      f"    User {e['tenant']}",
                      f"    IdentityFile {_quote(e['key'])}",
                      "    IdentitiesOnly yes",
                      f"    ProxyCommand {' '.join(shlex.quote(a) for a in argv)}",
                      f"    UserKnownHostsFile {_quote(str(known_hosts))}",
                      f"    HostKeyAlias {alias}",
                      "    StrictHostKeyChecking yes",
                      "    ServerAliveInterval 15"]
    lines.append(END)
    return "\n".join(lines) + "\n"


def _quote(path: str) -> str:
    return f'"{path}"' if " " in path else path


def replace_block(text: str, block: str) -> str:
    """`text` with our block replaced (or appended once); everything else kept as it was."""
    start = text.find(BEGIN)
    if start >= 0:
        end = text.find(END, start)
        if end < 0:
            raise ValueError(f"the ssh config has the line {BEGIN!r} but not {END!r}: remove the broken block by hand")
        end += len(END)
        if text[end:end + 1] == "\n":
            end += 1
        return text[:start] + block + text[end:]
    # Our block goes first: ssh takes the first value it finds for each option, and a
    # `Host *` further down must not override our hosts' settings.
    return block + ("\n" + text if text else "")


def known_hosts_text(entries: list[dict]) -> str:
    out = []
    for e in entries:
        for n in e["nodes"]:
            if n.get("ssh_host_key"):
                out.append(f"{host_alias(n['name'], e['cluster'])} {n['ssh_host_key']}")
    return "\n".join(out) + ("\n" if out else "")


def write(config_path: Path, known_hosts: Path, entries: list[dict], home: str | None) -> str:
    """Write both files (0600, atomically); returns the block written."""
    block = render_block(entries, known_hosts, home)
    try:
        text = config_path.read_text()
    except FileNotFoundError:
        text = ""
    new = replace_block(text, block)
    for path, content in ((config_path, new), (known_hosts, known_hosts_text(entries))):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(path.name + ".remotegpu-tmp")
        tmp.write_text(content)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    return block

"""The generated sshd_config of a node's tenant sshd (pure: text in, text out).

The distribution's OpenSSH serves tenants on `SSH_LISTEN` with this file only; it
never includes `/etc/ssh/sshd_config`, so the admin's own sshd and its settings
are neither read nor touched. See docs/SSH.md for why each line is there.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass

PERSISTENT_TERMINAL_MODES = ("on", "optional", "off")

# Variables a client may send (`SendEnv`/`SetEnv`); MTGPU_TERMINAL opts a single
# terminal in or out of tmux; MTGPU_WORKSPACE lands the login in a workspace, MTGPU_JOB in
# one of the tenant's running jobs (its GPUs).
ACCEPTED_ENV = ("LANG", "LC_*", "MTGPU_TERMINAL", "MTGPU_WORKSPACE", "MTGPU_JOB")

_GROUP_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}\$?$")


class SshConfigError(ValueError):
    """A value that cannot go into the tenant sshd's config (names the value and the fix)."""


@dataclass(frozen=True)
class AuthorizedKeysCommand:
    """Keys served by a program instead of files (`AuthorizedKeysCommand`).

    `command` is an absolute path plus sshd's %-tokens (e.g. `/usr/lib/mtgpu/keys %u`);
    `run_as` is the unprivileged account sshd runs it as.
    """

    command: str
    run_as: str = "nobody"


def parse_listen(listen: str) -> tuple[str, int]:
    """`"0.0.0.0:2222"` / `"[::1]:2222"` -> (host, port); the error names the value."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise SshConfigError(f"SSH_LISTEN {listen!r} is not HOST:PORT (e.g. '0.0.0.0:2222')")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise SshConfigError(f"SSH_LISTEN {listen!r}: port {port} is outside 1-65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def _listen_address(host: str, port: int) -> str:
    try:
        is_v6 = ipaddress.ip_address(host).version == 6
    except ValueError:
        is_v6 = False  # a host name
    return f"[{host}]:{port}" if is_v6 else f"{host}:{port}"


def _require_absolute(what: str, path: str) -> str:
    if not path.startswith("/"):
        raise SshConfigError(f"{what} {path!r} must be an absolute path (sshd re-executes itself "
                             "and resolves relative paths against /)")
    if any(c.isspace() or c in "\"'" for c in path):
        raise SshConfigError(f"{what} {path!r} must not contain spaces or quotes")
    return path


def render_sshd_config(
    listen_host: str,
    listen_port: int,
    host_key_paths: list[str],
    pid_file: str,
    authorized_keys_command_or_file: str | AuthorizedKeysCommand,
    tenant_group: str,
    login_wrapper: str,
    persistent_terminals: str,
    set_env: dict[str, str] | None = None,
) -> str:
    """The full sshd_config text for the tenant sshd.

    `authorized_keys_command_or_file` is either an `AuthorizedKeysFile` pattern
    (absolute, root-managed, e.g. `/var/lib/mtgpu/ssh/authorized_keys/%u`) or an
    `AuthorizedKeysCommand`. `login_wrapper` is the absolute path of the installed
    login wrapper; the terminal mode is baked into its command line.
    """
    if persistent_terminals not in PERSISTENT_TERMINAL_MODES:
        raise SshConfigError(f"PERSISTENT_TERMINALS {persistent_terminals!r} is not one of "
                             f"{', '.join(PERSISTENT_TERMINAL_MODES)}")
    if not _GROUP_RE.match(tenant_group):
        raise SshConfigError(f"tenant group {tenant_group!r} is not a valid group name")
    if not listen_host or any(c.isspace() for c in listen_host):
        raise SshConfigError(f"listen host {listen_host!r} is empty or contains spaces")
    if not 1 <= listen_port <= 65535:
        raise SshConfigError(f"listen port {listen_port} is outside 1-65535")
    if not host_key_paths:
        raise SshConfigError("at least one host key path is needed")
    for key in host_key_paths:
        _require_absolute("host key", key)
    _require_absolute("PidFile", pid_file)
    _require_absolute("login wrapper", login_wrapper)

    if isinstance(authorized_keys_command_or_file, AuthorizedKeysCommand):
        akc = authorized_keys_command_or_file
        _require_absolute("AuthorizedKeysCommand", akc.command.split()[0] if akc.command.split() else "")
        keys_lines = [
            "AuthorizedKeysFile none",
            f"AuthorizedKeysCommand {akc.command}",
            f"AuthorizedKeysCommandUser {akc.run_as}",
        ]
    else:
        keys_file = _require_absolute("AuthorizedKeysFile", authorized_keys_command_or_file)
        if "%u" not in keys_file and "%U" not in keys_file:
            raise SshConfigError(f"AuthorizedKeysFile {keys_file!r} must name the user (%u), "
                                 "one root-managed file per tenant")
        keys_lines = [f"AuthorizedKeysFile {keys_file}"]

    pairs = []
    for k, v in sorted((set_env or {}).items()):
        if not re.match(r"^[A-Z_][A-Z0-9_]*$", k) or any(c.isspace() or c == '"' for c in v):
            raise SshConfigError(f"SetEnv {k}={v!r}: names are upper-case words, values have no spaces or quotes")
        pairs.append(f"{k}={v}")
    # One line: sshd takes the first SetEnv it reads and ignores any later one.
    env_lines = [f"SetEnv {' '.join(pairs)}"] if pairs else []
    force_command = " ".join(shlex.quote(a) for a in (login_wrapper, "--terminals", persistent_terminals))
    lines = [
        "# Generated by mtgpu (mtgpu/ssh/config.py): the tenant sshd. Do not edit; it is",
        "# rewritten at start. The system sshd (/etc/ssh/sshd_config) is not involved.",
        f"ListenAddress {_listen_address(listen_host, listen_port)}",
        *[f"HostKey {k}" for k in host_key_paths],
        f"PidFile {pid_file}",
        "",
        "# Keys only: no passwords, no keyboard-interactive, no host-based, no root.",
        "AuthenticationMethods publickey",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "HostbasedAuthentication no",
        "PermitEmptyPasswords no",
        "PermitRootLogin no",
        f"AllowGroups {tenant_group}",
        "# Tenant accounts carry a '*' password (not locked '!'); without PAM sshd",
        "# checks the shadow entry itself.",
        "UsePAM no",
        "StrictModes yes",
        "# Keys live in root-managed files, so a tenant cannot add a key behind the admin's back.",
        *keys_lines,
        "AuthorizedPrincipalsFile none",
        "PermitUserEnvironment no",
        "",
        "# Forwarding: TCP yes (VS Code Remote-SSH needs local forwarding), X11 and tunnels no.",
        "X11Forwarding no",
        "AllowTcpForwarding yes",
        "GatewayPorts no",
        "PermitTunnel no",
        "AllowAgentForwarding yes",
        "PermitTTY yes",
        f"AcceptEnv {' '.join(ACCEPTED_ENV)}",
        "# Where this node's mt-job finds its server.",
        *env_lines,
        "",
        "# Notice dead clients so their tmux clients detach and the session waits for a reconnect.",
        "ClientAliveInterval 30",
        "ClientAliveCountMax 4",
        "LoginGraceTime 30",
        "MaxAuthTries 6",
        "UseDNS no",
        "PrintMotd no",
        "LogLevel VERBOSE",
        "",
        "# sftp runs through the login wrapper too (ForceCommand applies to subsystems:",
        "# the wrapper sees SSH_ORIGINAL_COMMAND=internal-sftp and starts sftp-server).",
        "Subsystem sftp internal-sftp",
        "# Every login goes through the wrapper: commands run directly, interactive",
        "# terminals land in tmux according to PERSISTENT_TERMINALS.",
        f"ForceCommand {force_command}",
        "",
    ]
    return "\n".join(lines)

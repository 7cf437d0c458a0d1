"""The service that keeps mtgpu-server running, and how it starts at boot.

Where systemd is PID 1 (/run/systemd/system exists): a unit, enabled and started with
systemctl. Elsewhere: an LSB init script /etc/init.d/mtgpu with a pidfile, started at
boot by update-rc.d's links (Debian), plain /etc/rc?.d links (no update-rc.d, or an
install under --root), or on WSL2 without systemd by the distribution's boot command in
/etc/wsl.conf. Either way a stop or a restart signals the server alone: jobs and
workspaces run under their own supervisors (agent/runners/shim.py, in sessions of their
own) that outlive the server, which re-attaches them when it starts again.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from .layout import RUNLEVELS_START, RUNLEVELS_STOP, SERVICE_NAME, Layout
from .plan import SetupRefused, StepFailed

Runner = Callable[..., subprocess.CompletedProcess]
SERVICE_CHOICES = ("auto", "systemd", "init.d")
STOP_TIMEOUT_S = 30
WANTS_LINK = "multi-user.target.wants link"  # the boot hook of a unit written under --root
START_TIMEOUT_S = 90  # the init script's start waits this long for the node to answer


# ---------------------------------------------------------------- what this machine runs


@dataclass(frozen=True)
class Platform:
    """What decides the service path, read from the running machine (not from --root)."""

    systemd_running: bool  # systemd is PID 1
    wsl: bool  # the kernel is WSL2's
    pid1: str  # PID 1's command name
    has_update_rc_d: bool

    @classmethod
    def probe(cls) -> "Platform":
        def read(path: str) -> str:
            try:
                return Path(path).read_text().strip()
            except OSError:
                return ""

        return cls(systemd_running=Path("/run/systemd/system").is_dir(),
                   wsl="microsoft" in read("/proc/sys/kernel/osrelease").lower(),
                   pid1=read("/proc/1/comm") or "unknown",
                   has_update_rc_d=shutil.which("update-rc.d") is not None)


@dataclass(frozen=True)
class ServiceChoice:
    kind: str  # "systemd" or "init.d"
    boot_hook: str  # "systemctl enable", "update-rc.d", "rc links" or "wsl.conf"
    why: str  # one line for the admin: which path and why
    caveat: str = ""  # what the admin must know (nothing here runs the boot links)


def choose_service(platform: Platform, requested: str, prefixed: bool) -> ServiceChoice:
    """The service path for `requested` ("auto", "systemd" or "init.d"); pure."""
    if requested not in SERVICE_CHOICES:
        raise SetupRefused(f"--service {requested!r}: give one of {', '.join(SERVICE_CHOICES)}")
    if requested == "systemd":
        if prefixed:  # an image: its systemd starts the unit at boot; nothing runs it here
            return ServiceChoice("systemd", WANTS_LINK, "--service systemd under --root: the systemd unit and its "
                                 "multi-user.target.wants link (what `systemctl --root DIR enable` makes), for a "
                                 "system under --root whose systemd starts it at boot; not started here")
        if not platform.systemd_running:
            raise SetupRefused(f"--service systemd: systemd is not running here (PID 1 is {platform.pid1!r}, no "
                               "/run/systemd/system); leave --service out (or give init.d) for the init script, "
                               "or add --root DIR to write the unit (and enable it) into an image without starting it")
    if requested in ("auto", "systemd") and platform.systemd_running and not prefixed:
        return ServiceChoice("systemd", "systemctl enable", "systemd is PID 1: a systemd unit")
    if requested == "auto" and platform.systemd_running:
        why = "an install under --root: the init script (systemctl acts on the running system only)"
    elif requested == "init.d":
        why = "--service init.d: the init script"
    else:
        why = f"systemd is not PID 1 here (PID 1 is {platform.pid1!r}): the init script"
    if platform.wsl:
        return ServiceChoice("init.d", "wsl.conf", why + "; WSL2 without systemd runs no boot scripts, so the "
                             "distribution's [boot] command in /etc/wsl.conf starts it")
    if prefixed:
        return ServiceChoice("init.d", "rc links", why + ", started at boot by /etc/rc?.d links made here "
                             "(update-rc.d acts on / only)")
    caveat = ""
    if platform.pid1 not in ("init", "systemd", "openrc-init", "runit"):
        caveat = (f"PID 1 here is {platform.pid1!r}, which runs no boot scripts: the boot links are in place for a "
                  f"machine that boots with an init, but here start mtgpu from whatever starts this machine's "
                  f"services (/etc/init.d/{SERVICE_NAME} start)")
    if platform.has_update_rc_d:
        return ServiceChoice("init.d", "update-rc.d", why + ", started at boot through update-rc.d", caveat)
    return ServiceChoice("init.d", "rc links", why + ", started at boot by /etc/rc?.d links", caveat)


# ---------------------------------------------------------------- the service definitions

_PLAIN_PATH = re.compile(r"^/[A-Za-z0-9._/+@:=,-]*$")


def check_service_path(what: str, path: Path) -> None:
    """A path that goes into a unit or a script: absolute, no spaces or quotes (both
    formats would need their own escaping, and a mistake there starts the wrong file)."""
    if not _PLAIN_PATH.match(str(path)):
        raise SetupRefused(f"{what} {str(path)!r}: the service files need an absolute path of letters, digits and "
                           "._/+@:=,- only; choose a path without spaces or quotes")


def systemd_unit(server: Path, config: Path) -> str:
    return f"""# mtgpu node, written by `mtgpu-setup install` (docs/INSTALL.md); `mtgpu-setup uninstall` removes it.
[Unit]
Description=mtgpu node (multi-tenant GPU cluster member)
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
ExecStart={server} --config {config}
Restart=on-failure
RestartSec=2
# Status 2 is a refused start (a bad config, a port in use, a cluster that refuses this
# member): the message is in the journal, and retrying would not help.
RestartPreventExitStatus=2
# Stop and restart signal mtgpu-server alone: jobs and workspaces run under their own
# supervisors, which outlive the server and are re-attached when it starts again.
KillMode=process
TimeoutStopSec={STOP_TIMEOUT_S}
LimitNOFILE=65536

[Install]
WantedBy=multi-user.target
"""


def init_script(server: Path, config: Path, pidfile: Path, log_file: Path) -> str:
    q = shlex.quote
    return f"""#!/bin/sh
### BEGIN INIT INFO
# Provides:          {SERVICE_NAME}
# Required-Start:    $network $remote_fs $syslog
# Required-Stop:     $network $remote_fs $syslog
# Default-Start:     {' '.join(RUNLEVELS_START)}
# Default-Stop:      {' '.join(RUNLEVELS_STOP)}
# Short-Description: mtgpu node (multi-tenant GPU cluster member)
# Description:       Runs mtgpu-server. Written by mtgpu-setup install (docs/INSTALL.md);
#                    mtgpu-setup uninstall removes it.
### END INIT INFO
#
# stop and restart signal mtgpu-server alone (the pid in PIDFILE): jobs and workspaces
# run under their own supervisors, in sessions of their own, which outlive the server
# and are re-attached when it starts again.

DAEMON={q(str(server))}
CONFIG={q(str(config))}
PIDFILE={q(str(pidfile))}
LOGFILE={q(str(log_file))}
STOP_TIMEOUT={STOP_TIMEOUT_S}
# start and restart return once the node answers on its socket, or after this many seconds
START_TIMEOUT=${{MTGPU_START_TIMEOUT:-{START_TIMEOUT_S}}}
PYTHON=$(dirname "$DAEMON")/python

# The pid in PIDFILE is the server's only while it runs DAEMON with CONFIG (a stale
# pidfile's pid may belong to another process by now; a zombie has no command line).
running_pid() {{
    [ -r "$PIDFILE" ] || return 1
    read -r pid < "$PIDFILE" || return 1
    case "$pid" in ''|*[!0-9]*) return 1 ;; esac
    tr '\\0' '\\n' < "/proc/$pid/cmdline" 2>/dev/null | grep -qxF -- "$DAEMON" || return 1
    tr '\\0' '\\n' < "/proc/$pid/cmdline" 2>/dev/null | grep -qxF -- "$CONFIG" || return 1
    echo "$pid"
}}

# Whether the process still runs: it exists and is no zombie. (Its command line is not
# asked: while env, setsid and the interpreter exec one another it is empty for a moment.)
is_alive() {{
    state=$(sed -e 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
    [ -n "$state" ] && [ "$state" != Z ]
}}

do_start() {{
    if pid=$(running_pid); then
        echo "mtgpu is already running (pid $pid)"
        return 0
    fi
    if [ ! -x "$DAEMON" ]; then
        echo "mtgpu: $DAEMON is missing; run mtgpu-setup install" >&2
        return 5
    fi
    mkdir -p "$(dirname "$LOGFILE")" "$(dirname "$PIDFILE")"
    cd / || return 1
    # A clean environment, as a service manager gives; a session of its own, so no
    # terminal's hangup or Ctrl-C reaches it. setsid does not fork here (a background
    # job of a script is no process group leader), so $! is the server's pid.
    env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 HOME=/root \\
        setsid "$DAEMON" --config "$CONFIG" </dev/null >>"$LOGFILE" 2>&1 &
    pid=$!
    echo "$pid" > "$PIDFILE"
    i=0
    while [ "$i" -lt 100 ]; do
        if running_pid >/dev/null; then
            # the node answers once it has read its state and opened its socket: wait for that
            # (bounded), so that status right after says it answers
            "$PYTHON" -I -m mtgpu.setup.answer "$CONFIG" "$pid" "$START_TIMEOUT"
            case $? in
                0) echo "mtgpu started (pid $pid, log $LOGFILE)"; return 0 ;;
                1) break ;;  # it ended before it answered
                *) echo "mtgpu started (pid $pid, log $LOGFILE), not answering yet"; return 0 ;;
            esac
        fi
        is_alive "$pid" || break
        sleep 0.1
        i=$((i + 1))
    done
    rm -f "$PIDFILE"
    echo "mtgpu did not start; the end of $LOGFILE:" >&2
    tail -n 20 "$LOGFILE" >&2
    return 1
}}

do_stop() {{
    if ! pid=$(running_pid); then
        rm -f "$PIDFILE"
        echo "mtgpu is not running"
        return 0
    fi
    kill -TERM "$pid"
    i=0
    while running_pid >/dev/null; do
        if [ "$i" -ge $((STOP_TIMEOUT * 10)) ]; then
            echo "mtgpu did not stop within ${{STOP_TIMEOUT}}s: killing pid $pid" >&2
            kill -KILL "$pid"
            break
        fi
        sleep 0.1
        i=$((i + 1))
    done
    rm -f "$PIDFILE"
    echo "mtgpu stopped (pid $pid); its jobs and workspaces keep running"
}}

do_status() {{
    if pid=$(running_pid); then
        echo "mtgpu is running (pid $pid)"
        return 0
    fi
    if [ -e "$PIDFILE" ]; then
        echo "mtgpu is not running (stale $PIDFILE)"
        return 1
    fi
    echo "mtgpu is not running"
    return 3
}}

case "$1" in
    start) do_start ;;
    stop) do_stop ;;
    restart|force-reload) do_stop && do_start ;;
    status) do_status ;;
    *) echo "usage: $0 {{start|stop|restart|force-reload|status}}" >&2; exit 2 ;;
esac
"""


def _write(path: Path, text: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _run_checked(run: Runner, cmd: list[str], timeout_s: float = 120) -> str:
    try:
        r = run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise StepFailed(f"`{' '.join(cmd)}`: {cmd[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise StepFailed(f"`{' '.join(cmd)}` did not finish within {timeout_s:g}s") from None
    if r.returncode != 0:
        raise StepFailed(f"`{' '.join(cmd)}` exited with {r.returncode}: {(r.stderr or r.stdout).strip()[-800:]}")
    return (r.stdout or "").strip()


# ---------------------------------------------------------------- boot hooks (init.d)


class BootHook(Protocol):
    name: str

    def enabled(self) -> bool: ...
    def enable(self) -> str: ...
    def disable(self) -> str: ...


class RcLinks:
    """S20mtgpu in rc2-5.d and K01mtgpu in rc0,1,6.d, each -> ../init.d/mtgpu."""

    name = "rc links"

    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    def _links(self) -> list[Path]:
        return ([self.layout.rc_dir(lv) / f"S20{SERVICE_NAME}" for lv in RUNLEVELS_START]
                + [self.layout.rc_dir(lv) / f"K01{SERVICE_NAME}" for lv in RUNLEVELS_STOP])

    def enabled(self) -> bool:
        target = f"../init.d/{SERVICE_NAME}"
        return all(p.is_symlink() and os.readlink(p) == target for p in self._links())

    def enable(self) -> str:
        for p in self._links():
            p.parent.mkdir(parents=True, exist_ok=True)
            p.unlink(missing_ok=True)
            p.symlink_to(f"../init.d/{SERVICE_NAME}")
        return f"linked from {self.layout.under('/etc')}/rc{{{','.join(RUNLEVELS_START + RUNLEVELS_STOP)}}}.d"

    def disable(self) -> str:
        removed = 0
        for p in self._links():
            if p.is_symlink():
                p.unlink()
                removed += 1
        return f"removed {removed} /etc/rc?.d links"


class UpdateRcD:
    """Debian's update-rc.d (it orders the links from the script's LSB header)."""

    name = "update-rc.d"

    def __init__(self, layout: Layout, run: Runner) -> None:
        self.layout = layout
        self.run = run

    def enabled(self) -> bool:
        return any(next(self.layout.rc_dir(lv).glob(f"S??{SERVICE_NAME}"), None) is not None for lv in RUNLEVELS_START)

    def enable(self) -> str:
        _run_checked(self.run, ["update-rc.d", SERVICE_NAME, "defaults"])
        return f"update-rc.d {SERVICE_NAME} defaults"

    def disable(self) -> str:
        _run_checked(self.run, ["update-rc.d", "-f", SERVICE_NAME, "remove"])
        return f"update-rc.d -f {SERVICE_NAME} remove"


def wsl_conf_with_boot(text: str, command: str) -> str:
    """wsl.conf with `command` in its [boot] command (added after one already there)."""
    lines = text.splitlines()
    section = None
    for i, line in enumerate(lines):
        s = line.strip()
        if s.startswith("[") and s.endswith("]"):
            if section == "boot":
                lines.insert(i, f"command = {command}")
                return "\n".join(lines) + "\n"
            section = s[1:-1].strip().lower()
        elif section == "boot" and re.match(r"^\s*command\s*=", line):
            current = line.split("=", 1)[1].strip()
            if command in [c.strip() for c in current.split(";")]:
                return text
            lines[i] = f"command = {current}; {command}" if current else f"command = {command}"
            return "\n".join(lines) + "\n"
    if section == "boot":
        lines.append(f"command = {command}")
    else:
        if lines and lines[-1].strip():
            lines.append("")
        lines += ["[boot]", f"command = {command}"]
    return "\n".join(lines) + "\n"


def wsl_conf_without_boot(text: str, command: str) -> str:
    """wsl.conf with `command` taken out of its [boot] command (the rest kept)."""
    lines, out, section = text.splitlines(), [], None
    for line in lines:
        s = line.strip()
        if s.startswith("[") and s.endswith("]"):
            section = s[1:-1].strip().lower()
        elif section == "boot" and re.match(r"^\s*command\s*=", line):
            parts = [c.strip() for c in line.split("=", 1)[1].split(";")]
            rest = [c for c in parts if c and c != command]
            if not rest:
                continue
            line = f"command = {'; '.join(rest)}"
        out.append(line)
    return "\n".join(out) + "\n" if out else ""


def wsl_command(layout: Layout) -> str:
    return f"{layout.init_script} start"


class WslBoot:
    """WSL2 without systemd: the distribution's [boot] command (run as root when it starts)."""

    name = "wsl.conf"

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.command = wsl_command(layout)

    def enabled(self) -> bool:
        text = _text(self.layout.wsl_conf) or ""
        return wsl_conf_with_boot(text, self.command) == text and bool(text)

    def enable(self) -> str:
        text = _text(self.layout.wsl_conf) or ""
        _write(self.layout.wsl_conf, wsl_conf_with_boot(text, self.command), 0o644)
        return f"[boot] command in {self.layout.wsl_conf} runs `{self.command}` when WSL starts this distribution"

    def disable(self) -> str:
        text = _text(self.layout.wsl_conf)
        if text is None:
            return f"{self.layout.wsl_conf} is gone"
        _write(self.layout.wsl_conf, wsl_conf_without_boot(text, self.command), 0o644)
        return f"took `{self.command}` out of {self.layout.wsl_conf}"


# ---------------------------------------------------------------- the two service kinds


class Service(Protocol):
    kind: str
    definition: Path

    def definition_text(self) -> str: ...
    def install_definition(self) -> None: ...
    def remove_definition(self) -> None: ...
    def autostart_enabled(self) -> bool: ...
    def enable_autostart(self) -> str: ...
    def disable_autostart(self) -> str: ...
    def running_pid(self) -> int | None: ...
    def start(self) -> str: ...
    def stop(self) -> str: ...
    def restart(self) -> str: ...
    def log_tail(self) -> str: ...


class InitdService:
    kind = "init.d"

    def __init__(self, layout: Layout, hook: BootHook, run: Runner = subprocess.run) -> None:
        self.layout = layout
        self.hook = hook
        self.run = run
        self.definition = layout.init_script

    def definition_text(self) -> str:
        return init_script(self.layout.server, self.layout.config, self.layout.pidfile, self.layout.log_file)

    def install_definition(self) -> None:
        _write(self.definition, self.definition_text(), 0o755)

    def remove_definition(self) -> None:
        self.definition.unlink(missing_ok=True)

    def autostart_enabled(self) -> bool:
        return self.hook.enabled()

    def enable_autostart(self) -> str:
        return self.hook.enable()

    def disable_autostart(self) -> str:
        return self.hook.disable()

    def _script(self, action: str, timeout_s: float = STOP_TIMEOUT_S + START_TIMEOUT_S + 30) -> subprocess.CompletedProcess:
        return self.run(["/bin/sh", str(self.definition), action], capture_output=True, text=True,
                        timeout=timeout_s, stdin=subprocess.DEVNULL)

    def running_pid(self) -> int | None:
        """The server's pid when the script's status says it runs (one rule: the script's)."""
        if not self.definition.exists():
            return None
        try:
            if self._script("status", 30).returncode != 0:
                return None
        except (OSError, subprocess.TimeoutExpired):
            return None
        try:
            return int(self.layout.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None

    def _act(self, action: str) -> str:
        if not self.definition.exists():
            raise StepFailed(f"{self.definition} is missing; run mtgpu-setup install")
        try:
            r = self._script(action)
        except subprocess.TimeoutExpired:
            raise StepFailed(f"`{self.definition} {action}` did not finish") from None
        if r.returncode != 0:
            raise StepFailed(f"`{self.definition} {action}` exited with {r.returncode}: "
                             f"{(r.stderr or r.stdout).strip()[-1500:]}")
        return (r.stdout or "").strip().splitlines()[-1] if (r.stdout or "").strip() else action

    def start(self) -> str:
        return self._act("start")

    def stop(self) -> str:
        return self._act("stop")

    def restart(self) -> str:
        return self._act("restart")

    def log_tail(self) -> str:
        text = _text(self.layout.log_file) or ""
        return f"the end of {self.layout.log_file}:\n" + "\n".join(text.splitlines()[-30:])


class SystemdService:
    kind = "systemd"
    unit_name = f"{SERVICE_NAME}.service"

    def __init__(self, layout: Layout, run: Runner = subprocess.run) -> None:
        self.layout = layout
        self.run = run
        self.definition = layout.unit

    def _systemctl(self, *args: str) -> str:
        return _run_checked(self.run, ["systemctl", *args])

    def definition_text(self) -> str:
        return systemd_unit(self.layout.server, self.layout.config)

    def install_definition(self) -> None:
        _write(self.definition, self.definition_text(), 0o644)
        self._systemctl("daemon-reload")

    def remove_definition(self) -> None:
        self.definition.unlink(missing_ok=True)
        self._systemctl("daemon-reload")
        self.run(["systemctl", "reset-failed", self.unit_name], capture_output=True, text=True)

    def _quiet(self, *args: str) -> bool:
        try:
            return self.run(["systemctl", *args], capture_output=True, text=True, timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def autostart_enabled(self) -> bool:
        return self._quiet("is-enabled", "--quiet", self.unit_name)

    def enable_autostart(self) -> str:
        self._systemctl("enable", self.unit_name)
        return f"systemctl enable {self.unit_name}"

    def disable_autostart(self) -> str:
        if self.definition.exists():
            self._systemctl("disable", self.unit_name)
        return f"systemctl disable {self.unit_name}"

    def running_pid(self) -> int | None:
        if not self._quiet("is-active", "--quiet", self.unit_name):
            return None
        try:
            pid = int(self._systemctl("show", "-p", "MainPID", "--value", self.unit_name))
        except (StepFailed, ValueError):
            return None
        return pid or None

    def start(self) -> str:
        self._systemctl("start", self.unit_name)
        return f"systemctl start {self.unit_name}"

    def stop(self) -> str:
        self._systemctl("stop", self.unit_name)
        return f"systemctl stop {self.unit_name} (KillMode=process: its jobs and workspaces keep running)"

    def restart(self) -> str:
        self._systemctl("restart", self.unit_name)
        return f"systemctl restart {self.unit_name}"

    def log_tail(self) -> str:
        r = self.run(["journalctl", "-u", self.unit_name, "-n", "30", "--no-pager"], capture_output=True, text=True)
        return "journalctl -u mtgpu.service:\n" + (r.stdout or r.stderr or "").strip()


class SystemdImageService(SystemdService):
    """The unit written under --root for an image (no systemctl: the wants link is made as
    `systemctl --root DIR enable` makes it). It cannot be started here: `startable` is False
    and running_pid is None, so install writes and enables it and says it was not started."""

    startable = False

    @property
    def wants_link(self) -> Path:
        return self.layout.under(f"/etc/systemd/system/multi-user.target.wants/{self.unit_name}")

    def _target(self) -> str:
        return f"/etc/systemd/system/{self.unit_name}"  # as the image's systemd sees it

    def install_definition(self) -> None:
        _write(self.definition, self.definition_text(), 0o644)

    def remove_definition(self) -> None:
        self.definition.unlink(missing_ok=True)

    def autostart_enabled(self) -> bool:
        return self.wants_link.is_symlink() and os.readlink(self.wants_link) == self._target()

    def enable_autostart(self) -> str:
        self.wants_link.parent.mkdir(parents=True, exist_ok=True)
        self.wants_link.unlink(missing_ok=True)
        self.wants_link.symlink_to(self._target())
        return f"linked {self.wants_link} -> {self._target()}"

    def disable_autostart(self) -> str:
        self.wants_link.unlink(missing_ok=True)
        return f"removed {self.wants_link}"

    def running_pid(self) -> int | None:
        return None

    def _not_here(self) -> str:
        raise StepFailed(f"{self.definition} is a unit for the system under --root: its systemd starts it, "
                         "this machine's cannot")

    start = stop = restart = _not_here

    def log_tail(self) -> str:
        return ""


def make_service(choice: ServiceChoice, layout: Layout, run: Runner = subprocess.run) -> Service:
    if choice.kind == "systemd":
        return SystemdImageService(layout, run) if choice.boot_hook == WANTS_LINK else SystemdService(layout, run)
    hook: BootHook
    if choice.boot_hook == "wsl.conf":
        hook = WslBoot(layout)
    elif choice.boot_hook == "update-rc.d":
        hook = UpdateRcD(layout, run)
    else:
        hook = RcLinks(layout)
    return InitdService(layout, hook, run)


"""The node's tenant sshd: files under STATE_DIR/ssh and the process that serves them.

    sshd = TenantSshd(Path("/var/lib/mtgpu"), "0.0.0.0:2222", "mtgpu-tenants", "on")
    sshd.prepare()                      # host key, dirs, wrapper, sshd_config
    sshd.set_authorized_keys("alice", ["ssh-ed25519 AAAA... alice@laptop"])
    sshd.start(); ...; sshd.reload(); ...; sshd.stop()

It runs the distribution's /usr/sbin/sshd with a generated config of its own
(its own host key, PidFile and log). The admin's system sshd is never touched.
Everything here needs root; layout and modes are documented in docs/SSH.md.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from mtgpu.agent import procs
import mtgpu
from mtgpu.ssh import wrapper as wrapper_module
from mtgpu.ssh.config import (
    PERSISTENT_TERMINAL_MODES,
    SshConfigError,
    parse_listen,
    render_sshd_config,
)

SSHD_PATH = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")
WRAPPER_PYTHON_CANDIDATES = ("/usr/bin/python3", "/usr/local/bin/python3")
_USER_RE = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}\$?$")
KEY_TYPES = frozenset({
    "ssh-ed25519", "ssh-rsa", "ssh-dss",
    "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com",
})


class SshdError(RuntimeError):
    """The tenant sshd could not be set up, started or stopped (says what and how to fix)."""


def check_installed(persistent_terminals: str = "on") -> str | None:
    """None when this machine can run the tenant sshd, else what is missing and which package has it."""
    missing: list[tuple[str, str]] = []  # (what, distribution package)
    if not os.access(SSHD_PATH, os.X_OK):
        missing.append((SSHD_PATH, "openssh-server"))
    if shutil.which("ssh-keygen", path="/usr/bin:/bin:/usr/local/bin") is None:
        missing.append(("ssh-keygen", "openssh-client"))
    if persistent_terminals != "off" and not any(os.access(p, os.X_OK) for p in wrapper_module.TMUX_CANDIDATES):
        missing.append(("tmux (or set PERSISTENT_TERMINALS = \"off\")", "tmux"))
    if _wrapper_python() is None:
        missing.append(("a python3 that tenants may run, for the login wrapper", "python3"))
    if not missing:
        return None
    return ("the tenant sshd needs " + "; ".join(what for what, _ in missing)
            + ": install with `apt-get install " + " ".join(pkg for _, pkg in missing) + "`")


def _wrapper_python() -> str | None:
    """An interpreter every tenant may execute (not a venv or pyenv under /root)."""
    for path in WRAPPER_PYTHON_CANDIDATES:
        if os.access(path, os.X_OK) and os.stat(path).st_mode & stat.S_IXOTH:
            return path
    return None


def validate_public_key(line: str) -> str:
    """A plain `TYPE BASE64 [comment]` key line, else SshdError naming the problem.

    Options (`command=`, `from=`, `environment=`, ...) are refused: keys come from
    tenants, and the file's lines are the only thing the tenant sshd trusts.
    """
    text = line.strip()
    if "\n" in text or "\r" in text or "\0" in text:
        raise SshdError("a public key must be one line")
    parts = text.split(None, 2)
    if len(parts) < 2 or parts[0] not in KEY_TYPES:
        raise SshdError(f"not an OpenSSH public key (expected 'ssh-ed25519 AAAA... comment'): {text[:60]!r}")
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except ValueError:
        raise SshdError(f"public key {parts[1][:20]}... is not valid base64") from None
    type_len = int.from_bytes(blob[:4], "big") if len(blob) >= 4 else -1
    if type_len <= 0 or blob[4:4 + type_len].decode("ascii", "replace") != parts[0]:
        raise SshdError(f"public key data does not match its type {parts[0]!r}")
    return text


class TenantSshd:
    """The tenant sshd of one node, with its files under `state_dir/ssh`."""

    def __init__(self, state_dir: Path, listen: str, tenant_group: str, persistent_terminals: str,
                 *, sshd_path: str = SSHD_PATH):
        if persistent_terminals not in PERSISTENT_TERMINAL_MODES:
            raise SshConfigError(f"PERSISTENT_TERMINALS {persistent_terminals!r} is not one of "
                                 f"{', '.join(PERSISTENT_TERMINAL_MODES)}")
        self.state_dir = Path(state_dir).absolute()
        self.listen_host, self.listen_port = parse_listen(listen)
        self.tenant_group = tenant_group
        self.persistent_terminals = persistent_terminals
        self.sshd_path = sshd_path
        self.dir = self.state_dir / "ssh"
        self.config_path = self.dir / "sshd_config"
        self.host_key_path = self.dir / "ssh_host_ed25519_key"
        self.pid_path = self.dir / "sshd.pid"
        self.log_path = self.dir / "sshd.log"
        self.wrapper_path = self.dir / "mtgpu-login"
        self.keys_dir = self.dir / "authorized_keys"
        self._proc: subprocess.Popen | None = None

    # ----- files -------------------------------------------------------------

    def prepare(self) -> None:
        """Create dirs, host key, login wrapper and sshd_config (idempotent; keeps the host key)."""
        why = check_installed(self.persistent_terminals)
        if why:
            raise SshdError(why)
        if os.geteuid() != 0:
            raise SshdError("the tenant sshd must be prepared and started as root")
        if not self.state_dir.exists():
            self.state_dir.mkdir(parents=True, mode=0o755)
        for d in (self.dir, self.keys_dir):
            d.mkdir(mode=0o755, exist_ok=True)
            os.chown(d, 0, 0)
            os.chmod(d, 0o755)
        self._check_path_is_root_controlled(self.keys_dir)
        PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
        os.chmod(PRIVSEP_DIR, 0o755)
        if not self.host_key_path.exists():
            r = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "mtgpu-tenant-sshd",
                                "-f", str(self.host_key_path)], capture_output=True, text=True)
            if r.returncode != 0:
                raise SshdError(f"ssh-keygen could not create {self.host_key_path}: {r.stderr.strip()}")
        os.chmod(self.host_key_path, 0o600)
        self._install_wrapper()
        self.write_config()

    def _check_path_is_root_controlled(self, path: Path) -> None:
        """StrictModes walks the keys file's directories up to /: each must be root-owned,
        not group/world-writable, and searchable by tenants (sshd reads the file as them)."""
        for d in [path, *path.parents]:
            st = d.stat()
            if st.st_uid != 0 or st.st_mode & 0o022:
                raise SshdError(f"{d} must be owned by root and not group/world-writable (sshd's StrictModes "
                                f"refuses keys below it); put STATE_DIR elsewhere or chmod go-w {d}")
            if not st.st_mode & stat.S_IXOTH:
                raise SshdError(f"{d} must be searchable by tenants (sshd reads their keys as them): "
                                f"chmod o+x {d}")

    def _install_wrapper(self) -> None:
        python = _wrapper_python()
        source = Path(wrapper_module.__file__).read_text()
        text = f"#!{python} -IS\n# Installed by mtgpu from mtgpu/ssh/wrapper.py; do not edit.\n" + source
        _atomic_write(self.wrapper_path, text, 0o755)

    def write_config(self) -> None:
        wrapper = str(self.wrapper_path)
        text = render_sshd_config(
            self.listen_host, self.listen_port, [str(self.host_key_path)], str(self.pid_path),
            str(self.keys_dir / "%u"), self.tenant_group, wrapper, self.persistent_terminals,
            set_env=self._session_env())
        _atomic_write(self.config_path, text, 0o644)

    def _session_env(self) -> dict[str, str]:
        """What every session gets: this node's socket, and how to run mt-container for
        a login into a workspace (the server's own Python and package)."""
        env = {"MTGPU_SOCKET": str(self.state_dir / "mtgpu.sock"), "MTGPU_PYTHON": sys.executable}
        root = str(Path(mtgpu.__file__).resolve().parent.parent)
        if not any(c.isspace() or c == '"' for c in root):
            env["MTGPU_PKG_ROOT"] = root
        return env

    def set_authorized_keys(self, user: str, keys: list[str]) -> None:
        """Replace `user`'s keys (atomic; root-owned 0644: the tenant can read, not change them)."""
        if not _USER_RE.match(user):
            raise SshdError(f"user name {user!r} is not a valid account name")
        lines = [validate_public_key(k) for k in keys]
        self.keys_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        _atomic_write(self.keys_dir / user, "".join(line + "\n" for line in lines), 0o644)

    def set_persistent_terminals(self, mode: str) -> None:
        """Change PERSISTENT_TERMINALS; new logins see it at once (running sessions keep theirs)."""
        if mode not in PERSISTENT_TERMINAL_MODES:
            raise SshConfigError(f"PERSISTENT_TERMINALS {mode!r} is not one of {', '.join(PERSISTENT_TERMINAL_MODES)}")
        self.persistent_terminals = mode
        self.write_config()
        if self.pid() is not None:
            self.reload()

    # ----- process -----------------------------------------------------------

    def pid(self) -> int | None:
        """The running sshd's PID from its PidFile, None when it is not running."""
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None
        # sshd rewrites its title ("sshd: /usr/sbin/sshd -D -f CONFIG ... [listener] ..."),
        # which keeps the config path.
        argv = procs.cmdline(pid)
        if argv is None:
            return None
        if str(self.config_path) not in " ".join(argv):
            return None  # a stale PidFile whose PID now belongs to another process
        if self._proc is not None and self._proc.pid == pid and self._proc.poll() is not None:
            return None  # our child exited (a zombie answers kill 0)
        return pid

    def start(self, timeout_s: float = 10.0, place: Callable[[int], object] | None = None) -> int:
        """Check the config (`sshd -t`), start sshd in the foreground as our child, wait until it listens.
        `place(pid)`: called at once, before sshd can take a connection (e.g. to move it into a cgroup
        of its own, where its sessions are then born)."""
        if self.pid() is not None:
            raise SshdError(f"the tenant sshd already runs (PID {self.pid()}, {self.pid_path})")
        check = subprocess.run([self.sshd_path, "-t", "-f", str(self.config_path)], capture_output=True, text=True)
        if check.returncode != 0:
            raise SshdError(f"sshd refuses {self.config_path}: {check.stderr.strip()}")
        offset = self._log_size()
        # -D: stay in the foreground so that we own the process and see it exit.
        self._proc = subprocess.Popen(
            [self.sshd_path, "-D", "-f", str(self.config_path), "-E", str(self.log_path)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        try:
            if place is not None:
                place(self._proc.pid)
            self._wait_listening(offset, timeout_s)
        except BaseException:
            self._kill_child()
            raise
        return self._proc.pid

    def reload(self, timeout_s: float = 10.0) -> None:
        """SIGHUP: sshd re-executes itself with the rewritten config; wait until it listens again."""
        pid = self.pid()
        if pid is None:
            raise SshdError("the tenant sshd is not running; nothing to reload")
        check = subprocess.run([self.sshd_path, "-t", "-f", str(self.config_path)], capture_output=True, text=True)
        if check.returncode != 0:
            raise SshdError(f"not reloading: sshd refuses {self.config_path}: {check.stderr.strip()}")
        offset = self._log_size()
        os.kill(pid, signal.SIGHUP)
        self._wait_listening(offset, timeout_s)

    def stop(self, timeout_s: float = 10.0, *, end_sessions: bool = False) -> None:
        """Stop the listener (by PID from the PidFile). Open sessions stay up, as with the
        system sshd, unless `end_sessions` (their per-connection sshd processes are ended too)."""
        pid = self.pid()
        if pid is None and self._proc is not None and self._proc.poll() is None:
            pid = self._proc.pid
        if pid is not None:
            sessions = procs.children_of(pid) if end_sessions else []
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            self._wait_gone(pid, timeout_s)
            for child in sessions:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGTERM)
            for child in sessions:
                self._wait_gone(child, timeout_s)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=1)
            self._proc = None
        with contextlib.suppress(FileNotFoundError):
            self.pid_path.unlink()

    def _wait_gone(self, pid: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.pid == pid:
                if self._proc.poll() is not None:
                    return
            elif not procs.alive(pid):
                return
            time.sleep(0.02)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def _kill_child(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=5)
        self._proc = None

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def log_tail(self, max_bytes: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return ""
        return data[-max_bytes:].decode("utf-8", "replace")

    def _wait_listening(self, log_offset: int, timeout_s: float) -> None:
        """Until sshd logs 'Server listening on' after `log_offset` (it does once bound)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with open(self.log_path, "rb") as f:
                    f.seek(log_offset)
                    new = f.read().decode("utf-8", "replace")
            except FileNotFoundError:
                new = ""
            if "Server listening on" in new:
                return
            if self._proc is not None and self._proc.poll() is not None:
                raise SshdError(f"the tenant sshd exited with status {self._proc.returncode}: {new.strip()[-2000:]}")
            if time.monotonic() > deadline:
                raise SshdError(f"the tenant sshd did not listen on {self.listen_host}:{self.listen_port} "
                                f"within {timeout_s:.0f} s; its log ({self.log_path}) says: {new.strip()[-2000:]}")
            time.sleep(0.02)


def _atomic_write(path: Path, text: str, mode: int) -> None:
    """Write via a temp file in the same dir + rename, root-owned with `mode`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.chown(tmp, 0, 0)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise

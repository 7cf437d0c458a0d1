"""The tenant sshd with real parts: the distribution's sshd on a loopback port, real
tmux, real Linux users in a temporary tenant group, asyncssh and the ssh/scp binaries
as clients. Everything started here is stopped by PID at the end, also on failure."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from mtgpu.ssh import TenantSshd, check_installed
from tests.support.node import free_port
from tests.support.users import _retry_locked, can_create_users, temp_user

asyncssh = pytest.importorskip("asyncssh")

_why_not = can_create_users() or check_installed("on") or (
    None if shutil.which("ssh") and shutil.which("scp") else "the ssh client is not installed (openssh-client)")
if _why_not:
    pytest.skip(_why_not, allow_module_level=True)

GROUP_GID_RANGE = (260_000, 269_999)
ANSI_RE = re.compile(r"\x1b\[[0-9;?>=]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78cDEHM]|\r")
MARK_COMMAND = "echo MARK[${TMUX:-none}]"
MARK_RE = re.compile(r"MARK\[(none|/[^\]]*)\]")  # the output, never the echoed command line


@dataclass
class SshEnv:
    sshd: TenantSshd
    port: int
    group: str
    tenant: object  # tests.support.users.TempUser
    outsider: object
    key: object  # asyncssh private key, authorized for tenant and outsider
    key_path: Path
    state_dir: Path


def _check(cmd: list[str]) -> None:
    r = _retry_locked(cmd)
    assert r.returncode == 0, f"{' '.join(cmd)} failed: {r.stderr}"


@pytest.fixture(scope="module")
def env():
    with contextlib.ExitStack() as stack:
        group = f"mtgt{os.urandom(3).hex()}"
        _check(["groupadd", "-K", f"GID_MIN={GROUP_GID_RANGE[0]}", "-K", f"GID_MAX={GROUP_GID_RANGE[1]}", group])
        stack.callback(_retry_locked, ["groupdel", group])
        # Not under /tmp: sshd's StrictModes refuses keys below a world-writable directory.
        state_dir = Path(tempfile.mkdtemp(prefix="mtgpu-ssh-test-", dir="/var/lib"))
        os.chmod(state_dir, 0o755)
        stack.callback(shutil.rmtree, state_dir, True)
        tenant = stack.enter_context(temp_user("mtst"))
        outsider = stack.enter_context(temp_user("mtso"))
        _check(["usermod", "-p", "*", "-aG", group, tenant.name])  # '*': no password, not locked
        _check(["usermod", "-p", "*", outsider.name])
        key = asyncssh.generate_private_key("ssh-ed25519")
        key_path = state_dir / "client_key"
        key.write_private_key(str(key_path))
        os.chmod(key_path, 0o600)
        port = free_port()
        sshd = TenantSshd(state_dir, f"127.0.0.1:{port}", group, "on")
        sshd.prepare()
        pub = key.export_public_key().decode()
        sshd.set_authorized_keys(tenant.name, [pub])
        sshd.set_authorized_keys(outsider.name, [pub])
        stack.callback(sshd.stop, end_sessions=True)  # runs before the users are removed
        sshd.start()
        try:
            yield SshEnv(sshd, port, group, tenant, outsider, key, key_path, state_dir)
        except BaseException:
            print("tenant sshd log:\n" + sshd.log_tail())
            raise


def _as_tenant(env: SshEnv, args: list[str]) -> subprocess.CompletedProcess:
    t = env.tenant
    return subprocess.run(args, user=t.uid, group=t.gid, env={"HOME": t.home, "PATH": "/usr/bin:/bin"},
                          cwd=t.home, capture_output=True, text=True, timeout=10)


@pytest.fixture
def fresh(env):
    """Each test starts with no tmux server, no ~/.mtgpu choices and mode `on`."""
    def clean():
        _as_tenant(env, ["tmux", "kill-server"])
        shutil.rmtree(Path(env.tenant.home) / ".mtgpu", ignore_errors=True)
    clean()
    if env.sshd.persistent_terminals != "on":
        env.sshd.set_persistent_terminals("on")
    yield env
    clean()


def run(coro, timeout_s: float = 60):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


async def connect(env: SshEnv, user: str | None = None, key=None, **kwargs):
    kwargs.setdefault("client_keys", [key or env.key])
    return await asyncssh.connect("127.0.0.1", env.port, username=user or env.tenant.name,
                                  known_hosts=None, agent_path=None, connect_timeout=10, **kwargs)


async def until(check, what: str, timeout_s: float = 10.0, interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {last!r})")


class Terminal:
    """An interactive session: everything it prints is collected, escape codes stripped."""

    def __init__(self, proc):
        self.proc = proc
        self.raw = ""
        self._pump = asyncio.ensure_future(self._read())

    @classmethod
    async def open(cls, conn, **kwargs):
        kwargs.setdefault("term_type", "xterm")
        kwargs.setdefault("term_size", (100, 30))
        return cls(await conn.create_process(**kwargs))

    async def _read(self):
        while True:
            data = await self.proc.stdout.read(4096)
            if not data:
                return
            self.raw += data

    @property
    def text(self) -> str:
        return ANSI_RE.sub("", self.raw)

    def type(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")

    async def wait_for(self, pattern: str, what: str, timeout_s: float = 10.0) -> re.Match:
        async def seen():
            return re.search(pattern, self.text, re.M)
        try:
            return await until(seen, what, timeout_s)
        except AssertionError as e:
            raise AssertionError(f"{e}; the terminal showed:\n{self.text[-2000:]}") from None


async def tmux_pane(ctl) -> str:
    r = await ctl.run("tmux capture-pane -p -t main -S -100", check=False)
    return r.stdout if r.exit_status == 0 else ""


async def login_kind(env: SshEnv, sends: dict[str, str] | None = None) -> str:
    """'tmux' or 'plain': where an interactive login of the tenant lands (`sends`: SendEnv)."""
    async with await connect(env) as conn:
        term = await Terminal.open(conn, env=sends or {})
        term.type(MARK_COMMAND)
        m = await term.wait_for(MARK_RE.pattern, "the shell to answer")
        conn.close()
    return "plain" if m.group(1) == "none" else "tmux"


async def tmux_sessions(env: SshEnv) -> list[str]:
    async with await connect(env) as ctl:
        r = await ctl.run("tmux list-sessions -F '#{session_name}'", check=False)
        return r.stdout.split() if r.exit_status == 0 else []


def ssh_cmd(env: SshEnv, *extra: str, user: str | None = None) -> list[str]:
    return ["ssh", "-p", str(env.port), "-i", str(env.key_path), "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
            "-o", "IdentitiesOnly=yes", *extra, f"{user or env.tenant.name}@127.0.0.1"]


# ----- persistent terminals ----------------------------------------------------

def test_login_lands_in_tmux_and_a_reconnect_shows_what_was_printed_while_away(fresh):
    env = fresh

    async def scenario():
        ctl = await connect(env)  # commands only: never inside tmux
        first = await connect(env)
        term = await Terminal.open(first)
        await until(lambda: _has_session(ctl), "tmux session main to exist")
        term.type('echo "in-tmux:[$TMUX]"; for i in 1 2 3 4 5 6; do echo tick-$i; sleep 0.3; done; echo ticking-done')
        await until(lambda: _pane_has(ctl, r"^tick-1$"), "the loop to start printing in tmux")
        first.abort()  # the connection drops, as with a lost network
        await until(lambda: _no_clients(ctl), "tmux to notice that its client is gone")

        # Printed while nobody is attached: the loop's rest, and a line sent now.
        r = await ctl.run("tmux send-keys -t main 'echo while-away-$((6*7))' Enter", check=False)
        assert r.exit_status == 0, r.stderr
        pane = await until(lambda: _pane_has(ctl, r"^while-away-42$"), "the line typed while away")
        await until(lambda: _pane_has(ctl, r"^ticking-done$"), "the loop to finish while away")
        assert re.search(r"^in-tmux:\[/tmp/tmux-\d+/default,\d+,\d+\]$", pane, re.M), pane

        second = await connect(env)
        again = await Terminal.open(second)
        await again.wait_for(r"while-away-42", "the redraw on reconnect to show the line typed while away")
        await again.wait_for(r"ticking-done", "the redraw to show the loop's last line")
        sessions = await ctl.run("tmux list-sessions -F '#{session_name}:#{session_attached}'", check=True)
        assert sessions.stdout.split() == ["main:1"], "reattached to the same session, not a new one"
        second.close()
        ctl.close()

    run(scenario())


async def _has_session(ctl) -> bool:
    return (await ctl.run("tmux has-session -t main", check=False)).exit_status == 0


async def _pane_has(ctl, pattern: str) -> str | None:
    pane = await tmux_pane(ctl)
    return pane if re.search(pattern, pane, re.M) else None


async def _no_clients(ctl) -> bool:
    r = await ctl.run("tmux list-clients -t main", check=False)
    return r.exit_status == 0 and r.stdout.strip() == ""


# ----- commands, scp, sftp -----------------------------------------------------

def test_a_command_runs_directly_not_in_tmux_and_its_exit_status_propagates(fresh):
    env = fresh
    r = subprocess.run(ssh_cmd(env) + ['echo "tmux=[$TMUX] user=$(id -un)"; exit 7'],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 7, r.stderr
    assert r.stdout.strip() == f"tmux=[] user={env.tenant.name}"

    async def with_a_terminal():  # `ssh -t host cmd`: a tty, and still no tmux
        async with await connect(env) as conn:
            res = await conn.run('echo "tmux=[$TMUX] tty=$(tty)"', term_type="xterm", check=False)
            return res
    res = run(with_a_terminal())
    assert res.exit_status == 0
    assert "tmux=[] tty=/dev/pts/" in res.stdout
    assert run(tmux_sessions(env)) == [], "a command must not start a tmux session"


def test_scp_and_sftp_copy_files_as_the_tenant(fresh, tmp_path):
    env = fresh
    src = tmp_path / "up.txt"
    src.write_text("payload over scp\n")
    base = ssh_cmd(env)[1:-1]
    base[base.index("-p")] = "-P"
    dest = f"{env.tenant.name}@127.0.0.1"
    for name, extra in (("scp-sftp-mode.txt", []), ("scp-legacy-mode.txt", ["-O"])):
        r = subprocess.run(["scp", *extra, *base, str(src), f"{dest}:{name}"], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0, f"scp {extra}: {r.stderr}"
        copied = Path(env.tenant.home) / name
        assert copied.read_text() == "payload over scp\n"
        assert copied.stat().st_uid == env.tenant.uid

    async def sftp_roundtrip():
        async with await connect(env) as conn:
            async with conn.start_sftp_client() as sftp:
                await sftp.put(str(src), "via-sftp.txt")
                await sftp.get("via-sftp.txt", str(tmp_path / "back.txt"))
                return await sftp.listdir(".")
    names = run(sftp_roundtrip())
    assert "via-sftp.txt" in names
    assert (tmp_path / "back.txt").read_text() == "payload over scp\n"
    assert (Path(env.tenant.home) / "via-sftp.txt").stat().st_uid == env.tenant.uid
    r = subprocess.run(["sftp", "-b", "-", *base, dest], input="ls\n", capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "via-sftp.txt" in r.stdout, r.stderr


def test_without_a_terminal_a_login_is_a_plain_shell(fresh):
    env = fresh

    async def scenario():
        async with await connect(env) as conn:
            return await conn.run(input=MARK_COMMAND + "\nexit 3\n", check=False)
    res = run(scenario())
    assert "MARK[none]" in res.stdout and res.exit_status == 3
    assert run(tmux_sessions(env)) == []


# ----- PERSISTENT_TERMINALS and the tenant's choice -----------------------------

def test_mode_on_opts_out_for_one_terminal_with_setenv(fresh):
    env = fresh
    # The documented command line: ssh -o SetEnv=MTGPU_TERMINAL=plain host
    r = subprocess.run(ssh_cmd(env, "-tt", "-o", "SetEnv=MTGPU_TERMINAL=plain"),
                       input=MARK_COMMAND + "; exit\n", capture_output=True, text=True, timeout=30)
    assert MARK_RE.search(r.stdout).group(1) == "none", r.stdout
    assert run(tmux_sessions(env)) == []
    assert run(login_kind(env)) == "tmux", "the next terminal, without the opt-out, is in tmux again"


def test_mode_on_opts_out_for_all_terminals_with_a_file(fresh):
    env = fresh
    _as_tenant(env, ["mkdir", "-p", f"{env.tenant.home}/.mtgpu"])
    _as_tenant(env, ["touch", f"{env.tenant.home}/.mtgpu/no-tmux"])
    assert run(login_kind(env)) == "plain"
    assert run(login_kind(env, sends={"MTGPU_TERMINAL": "tmux"})) == "tmux", "per-terminal choice wins"


def test_mode_optional_is_plain_unless_the_tenant_opts_in(fresh):
    env = fresh
    env.sshd.set_persistent_terminals("optional")
    assert run(login_kind(env)) == "plain"
    assert run(tmux_sessions(env)) == []
    assert run(login_kind(env, sends={"MTGPU_TERMINAL": "tmux"})) == "tmux"
    assert run(tmux_sessions(env)) == ["main"]
    _as_tenant(env, ["tmux", "kill-server"])
    _as_tenant(env, ["mkdir", "-p", f"{env.tenant.home}/.mtgpu"])
    _as_tenant(env, ["touch", f"{env.tenant.home}/.mtgpu/tmux"])
    assert run(login_kind(env)) == "tmux"


def test_mode_off_never_uses_tmux(fresh):
    env = fresh
    env.sshd.set_persistent_terminals("off")
    assert run(login_kind(env, sends={"MTGPU_TERMINAL": "tmux"})) == "plain"
    assert run(tmux_sessions(env)) == []


# ----- who gets in ----------------------------------------------------------------

def _refused(env: SshEnv, **kwargs) -> bool:
    async def attempt():
        try:
            conn = await connect(env, **kwargs)
        except asyncssh.PermissionDenied:
            return True
        conn.close()
        return False
    return run(attempt())


def test_password_login_is_refused_even_with_the_right_password(fresh):
    env = fresh
    r = subprocess.run(["chpasswd"], input=f"{env.tenant.name}:Correct-Horse-42\n", capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    try:
        assert _refused(env, client_keys=None, password="Correct-Horse-42")
        r = subprocess.run(ssh_cmd(env, "-o", "PreferredAuthentications=password,keyboard-interactive",
                                   "-o", "PubkeyAuthentication=no") + ["true"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 255 and "Permission denied" in r.stderr
    finally:
        _check(["usermod", "-p", "*", env.tenant.name])


def test_root_login_is_refused_even_with_a_valid_key_in_the_tenant_group(fresh):
    env = fresh
    env.sshd.set_authorized_keys("root", [env.key.export_public_key().decode()])
    _check(["gpasswd", "-a", "root", env.group])  # so that only PermitRootLogin stands in the way
    try:
        assert _refused(env, user="root")
    finally:
        _check(["gpasswd", "-d", "root", env.group])
        (env.sshd.keys_dir / "root").unlink()


def test_a_user_outside_the_tenant_group_is_refused(fresh):
    assert _refused(fresh, user=fresh.outsider.name)


def test_an_unknown_key_is_refused(fresh):
    assert _refused(fresh, key=asyncssh.generate_private_key("ssh-ed25519"))


def test_a_tenant_cannot_change_its_own_authorized_keys(fresh):
    env = fresh
    keys_file = env.sshd.keys_dir / env.tenant.name
    r = subprocess.run(ssh_cmd(env) + [f"echo ssh-ed25519 AAAA >> {keys_file}"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode != 0
    st = keys_file.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o644)


def test_local_port_forwarding_works_for_editors_like_vs_code(fresh):
    env = fresh

    async def scenario():
        async def echo(reader, writer):
            writer.write(b"echo:" + await reader.readline())
            await writer.drain()
            writer.close()
        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        target_port = server.sockets[0].getsockname()[1]
        try:
            async with await connect(env) as conn:
                reader, writer = await conn.open_connection("127.0.0.1", target_port)
                writer.write(b"through the tunnel\n")
                return await reader.readline()
        finally:
            server.close()
    assert run(scenario()) == b"echo:through the tunnel\n"

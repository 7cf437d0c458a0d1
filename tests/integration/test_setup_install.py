"""`mtgpu-setup install`, `status` and `uninstall` for real, on the path this machine takes
(systemd is not PID 1 here: the init script and its boot links), every path under a
folder given with --root, the existing environment /opt/mtgpu/venv given with --venv
(so nothing is pip-installed). A real node is installed, started, asked, restarted
under a running job, and removed."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from mtgpu.client.local import LocalClient
from mtgpu.setup.environment import missing_packages, package_list
from tests.support.node import REPO_ROOT, free_port, kill_leftover_runs, wait_for
from tests.support.users import account_db, can_create_users, temp_user

if can_create_users():
    pytest.skip(can_create_users(), allow_module_level=True)

# the environment these tests run in (scripts/test.sh: $MTGPU_VENV, else /opt/mtgpu/venv), so that the
# install links the code under test and not whatever another environment holds
VENV = Path(sys.prefix)
if not (VENV / "bin" / "mtgpu-server").exists():
    pytest.skip(f"{VENV} (the environment the install is given) has no mtgpu-server", allow_module_level=True)
if Path("/run/systemd/system").is_dir():
    pytest.skip("systemd is PID 1 here: these tests drive the init-script path", allow_module_level=True)

UID_RANGE = (420_000, 429_999)
# All present on the project's machines: the packages step then only checks. Were one
# missing, the test would not install it into this machine: it leaves packages alone.
PACKAGE_FLAGS = [] if not missing_packages(package_list(("node",))) else ["--no-packages"]
PR_SET_CHILD_SUBREAPER = 36


def setup_cli(*args: str, input: str | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
           "LANG": "C.UTF-8", "COLUMNS": "200", "PYTHONPATH": REPO_ROOT}
    return subprocess.run([sys.executable, "-m", "mtgpu.cli.setup", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, input=input, timeout=timeout_s)


class Machine:
    """One --root folder to install into, and what the test started there."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port(2)  # LISTEN, and +1 for Raft in cluster mode
        self.ssh_port = free_port()
        self.server_pids: set[int] = set()

    @property
    def config(self) -> Path:
        return self.root / "etc/mtgpu/mtgpu.toml"

    @property
    def state_dir(self) -> Path:
        return self.root / "var/lib/mtgpu"

    @property
    def socket(self) -> Path:
        return self.state_dir / "mtgpu.sock"

    @property
    def script(self) -> Path:
        return self.root / "etc/init.d/mtgpu"

    def install_args(self, *extra: str, name: str = "inst-a") -> list[str]:
        return ["install", "--yes", "--root", str(self.root), "--venv", str(VENV), *PACKAGE_FLAGS,
                "--listen", f"127.0.0.1:{self.port}", "--ssh-listen", f"127.0.0.1:{self.ssh_port}",
                "--gpu-backend", "simulated", "--node-name", name,
                "--set", f"TENANT_UID_RANGE=[{UID_RANGE[0]}, {UID_RANGE[1]}]", "--wait-timeout", "60", *extra]

    def install(self, *extra: str, name: str = "inst-a", ok: bool = True) -> subprocess.CompletedProcess:
        r = setup_cli(*self.install_args(*extra, name=name))
        if ok:
            assert r.returncode == 0, f"install failed ({r.returncode}):\n{r.stdout}\n{r.stderr}\n{self.log()}"
        self.remember_server()
        return r

    def remember_server(self) -> int | None:
        pid = self.server_pid()
        if pid is not None:
            self.server_pids.add(pid)
        return pid

    def server_pid(self) -> int | None:
        try:
            pid = int((self.root / "run/mtgpu.pid").read_text().strip())
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        return pid if str(self.config).encode() in argv else None

    def health(self) -> dict:
        with LocalClient(str(self.socket), timeout_s=3) as c:
            return c.health()

    def log(self) -> str:
        p = self.root / "var/log/mtgpu/server.log"
        return p.read_text(errors="replace")[-3000:] if p.exists() else "(no server log)"

    def status(self) -> dict:
        r = setup_cli("status", "--json", "--root", str(self.root))
        doc = json.loads(r.stdout)
        assert r.returncode == doc["exit"]
        return doc

    def cleanup(self) -> None:
        """Stop what the test started, also when it failed: the server by its pid, the
        jobs by their run records; then reap them (this process is their subreaper)."""
        with contextlib.suppress(Exception):
            setup_cli("uninstall", "--yes", "--force", "--root", str(self.root), timeout_s=60)
        pid = self.server_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        runs = [self.state_dir / "runs", self.state_dir / "agent"]
        kill_leftover_runs(self.state_dir)
        reap = set(self.server_pids)
        for record in [p for d in runs if d.is_dir() for p in d.rglob("*.json")]:
            with contextlib.suppress(Exception):
                doc = json.loads(record.read_text())
                reap |= {doc[k] for k in ("pid", "shim_pid", "child_pid") if isinstance(doc.get(k), int)}
        deadline = time.monotonic() + 5
        for pid in reap:
            while time.monotonic() < deadline:
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    break  # not ours (reaped already, or reparented elsewhere)
                if done:
                    break
                time.sleep(0.05)


@contextlib.contextmanager
def machine() -> Iterator[Machine]:
    # World-traversable (tenants reach the socket and their logs), unlike pytest's tmp_path.
    root = Path(tempfile.mkdtemp(prefix="mtgpu-setup-it-"))
    os.chmod(root, 0o755)
    libc = ctypes.CDLL(None, use_errno=True)
    # The daemon the init script starts is orphaned on purpose; PID 1 here does not reap, so
    # this process takes the orphans it made and reaps them at the end.
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    m = Machine(root)
    try:
        yield m
    finally:
        try:
            m.cleanup()
        finally:
            libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
            shutil.rmtree(root, ignore_errors=True)


def submit_as(user, sock: Path, script: str) -> int:
    env = {"MTGPU_SOCKET": str(sock), "PATH": "/usr/bin:/bin", "HOME": user.home, "LANG": "C.UTF-8",
           "PYTHONPATH": REPO_ROOT}
    r = subprocess.run([sys.executable, "-m", "mtgpu.cli.job", "submit", "--json", "-"], input=script, env=env,
                       user=user.uid, group=user.gid, extra_groups=[], cwd=user.home, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, f"submit failed ({r.returncode}): {r.stderr}"
    return json.loads(r.stdout)["job_id"]


def job_state(m: Machine, job_id: int) -> dict:
    with LocalClient(str(m.socket), timeout_s=5) as c:
        return c.job(job_id)


def alive(pid: int) -> bool:
    try:
        return bool(Path(f"/proc/{pid}/cmdline").read_bytes())  # a zombie has none
    except OSError:
        return False


# ---------------------------------------------------------------- the whole life of an install


def test_install_starts_a_node_a_rerun_changes_nothing_a_job_survives_a_restart_and_uninstall_keeps_state():
    with machine() as m, temp_user("mti", uid_range=UID_RANGE) as tenant:
        r = m.install()
        assert "systemd is not PID 1 here" in r.stdout and "the init script" in r.stdout
        assert "the node answers" in r.stdout and "role standalone" in r.stdout
        pid = m.server_pid()
        assert pid is not None and m.health()["pid"] == pid
        assert (m.root / "etc/rc2.d/S20mtgpu").is_symlink() and (m.root / "usr/local/bin/mt-job").is_symlink()
        written = m.config.read_bytes()
        assert b'NODE_NAME = "inst-a"' in written and b"TENANT_UID_RANGE = [420000, 429999]" in written

        again = m.install()
        assert again.stdout.rstrip().endswith("nothing changed: every step was already done"), again.stdout
        assert m.server_pid() == pid and m.health()["pid"] == pid, "a re-run must not restart the node"

        doc = m.status()
        assert doc["exit"] == 0 and doc["service"]["state"] == "running" and doc["service"]["pid"] == pid
        assert doc["service"]["kind"] == "init.d" and doc["service"]["autostart"] is True
        assert doc["node"]["role"] == "standalone" and doc["node"]["version"] == "0.1.0"
        assert doc["environment"]["version"] == "0.1.0"

        # The README's first command ends with the demo job on the installed node: its
        # simulated GPUs are the default ones --gpu-backend simulated gives.
        assert b'SIMULATED_GPUS = [{ "model" = "NVIDIA GeForce RTX 4090"' in written
        r = setup_cli("demo", "--installed", "--config", str(m.config), "--user", tenant.name)
        assert r.returncode == 0 and "The demo job completed." in r.stdout, r.stdout + r.stderr
        assert "hello from job" in r.stdout and f"running as {tenant.name}" in r.stdout, r.stdout

        # A job keeps running while the service restarts, and finishes once.
        flag, marks = Path(tenant.home) / "go", Path(tenant.home) / "marks"
        job_id = submit_as(tenant, m.socket, f"#!/bin/bash\n#MTGPU cpus=1\necho $$ >> {marks}\n"
                                             f"while [ ! -e {flag} ]; do sleep 0.05; done\necho finished\n")
        wait_for("the job to run", lambda: job_state(m, job_id)["state"] == "running" and marks.exists()
                 and marks.read_text().strip(), timeout_s=30)
        job_pid = int(marks.read_text().split()[0])
        r = setup_cli("uninstall", "--yes", "--root", str(m.root))
        assert r.returncode == 2 and f"1 job(s) or workspace(s) run on this node ({job_id})" in r.stderr
        assert "--force" in r.stderr and m.script.exists() and m.server_pid() == pid, "a refusal changes nothing"
        r = subprocess.run(["/bin/sh", str(m.script), "restart"], capture_output=True, text=True, timeout=200)
        assert r.returncode == 0, r.stderr
        new_pid = m.remember_server()
        assert new_pid is not None and new_pid != pid
        assert alive(job_pid), "the restart killed the job"
        # restart returns once the node answers: asked at once, it does (it returned before the node
        # had opened its socket, and status right after said "does not answer")
        assert m.health()["pid"] == new_pid
        doc = m.status()
        assert doc["exit"] == 0 and doc["node"]["answers"], doc
        assert f"mtgpu answers on {m.socket}" in r.stdout, r.stdout + r.stderr
        assert job_state(m, job_id)["state"] == "running"
        flag.touch()
        job = wait_for("the job to finish", lambda: (j := job_state(m, job_id))["state"] in
                       ("completed", "failed", "lost", "cancelled") and j, timeout_s=30)
        assert job["state"] == "completed" and job["exit_code"] == 0, job
        assert marks.read_text().split() == [str(job_pid)], "the job ran more than once"
        assert "finished" in Path(job["log_path"]).read_text()
        assert m.status()["service"]["pid"] == new_pid

        r = setup_cli("uninstall", "--yes", "--root", str(m.root))
        assert r.returncode == 0, r.stdout + r.stderr
        wait_for("the server to exit", lambda: not alive(new_pid), timeout_s=30)
        assert not m.script.exists() and not (m.root / "etc/rc2.d/S20mtgpu").is_symlink()
        assert not (m.root / "etc/mtgpu/install.json").exists()
        # the environment was not the install's: it stays, and so do the links to its commands
        assert os.readlink(m.root / "usr/local/bin/mt-job") == str(VENV / "bin/mt-job")
        assert m.config.read_bytes() == written and (m.state_dir / "state").is_dir()
        assert "kept: STATE_DIR" in r.stdout and (VENV / "bin/mtgpu-server").exists()
        assert m.status()["exit"] == 3
        r = setup_cli("status", "--root", str(m.root))  # the advice keeps --root (an image stays in its folder)
        assert f"`mtgpu-setup install --yes --root {m.root}` installs it" in r.stdout, r.stdout

        # Installed again: the existing config is validated and kept, flags that differ are said.
        r = m.install(name="inst-b")
        assert "NODE_NAME: the flags say \"inst-b\"" in r.stderr and "existing config is kept" in r.stderr
        assert m.config.read_bytes() == written and m.health()["node"] == "inst-a"
        assert job_state(m, job_id)["state"] == "completed", "the journal in STATE_DIR was kept"

        r = setup_cli("uninstall", "--yes", "--purge", "--root", str(m.root))
        assert r.returncode == 0, r.stdout + r.stderr
        assert not m.state_dir.exists() and not m.config.exists() and not (m.root / "var/log/mtgpu").exists()
        assert not m.script.exists() and (VENV / "bin/mtgpu-server").exists()
        assert "nothing changed: every step was already done" in setup_cli("uninstall", "--yes", "--root", str(m.root)).stdout


def test_the_first_member_of_a_cluster_gets_a_new_secret_and_leads():
    with machine() as m:
        r = m.install("--cluster-id", "lab-setup", "--service", "init.d", "--state-dir", str(m.state_dir),
                      "--tenant-home-root", str(m.root / "home/mtgpu"))
        secret = m.state_dir / "cluster.secret"
        assert f"created {secret} (mode 0600)" in r.stdout
        assert (os.stat(secret).st_mode & 0o777) == 0o600 and len(secret.read_text().strip()) >= 32
        doc = wait_for("the member to lead", lambda: (d := m.status())["node"].get("role") == "leader" and d,
                       timeout_s=30)
        assert doc["node"]["cluster_id"] == "lab-setup"
        # A service definition changed by hand is put back, and the server restarted with it.
        before = m.server_pid()
        m.script.write_text(m.script.read_text() + "# edited by hand\n")
        r = m.install("--cluster-id", "lab-setup")
        assert "init script" in r.stdout and "rewritten; the server was stopped" in r.stdout, r.stdout
        assert "# edited by hand" not in m.script.read_text()
        after = m.server_pid()
        assert after is not None and after != before and m.health()["pid"] == after
        r = setup_cli("uninstall", "--yes", "--purge", "--root", str(m.root))
        assert r.returncode == 0 and not secret.exists(), r.stdout + r.stderr


# ---------------------------------------------------------------- refusals change nothing


def test_a_joiner_without_the_secret_is_refused_with_the_fix_and_nothing_is_written():
    with machine() as m:
        peer = f"127.0.0.1:{free_port()}"
        r = setup_cli(*m.install_args("--cluster-id", "lab-setup", "--peers", peer))
        assert r.returncode == 2, r.stdout + r.stderr
        assert "has no cluster secret" in r.stderr and "--secret-file" in r.stderr and "--first" in r.stderr
        assert str(m.state_dir / "cluster.secret") in r.stderr
        assert list(m.root.iterdir()) == [], "a refused install must change nothing"
        short = m.root.parent / f"{m.root.name}.short-secret"
        short.write_text("too short")
        try:
            r = setup_cli(*m.install_args("--cluster-id", "lab-setup", "--peers", peer, "--secret-file", str(short)))
        finally:
            short.unlink()
        assert r.returncode == 2 and "holds 9 characters" in r.stderr


def test_an_environment_tenants_cannot_run_is_refused_naming_the_folder_and_nothing_is_written():
    with machine() as m:
        home = m.root.parent / f"{m.root.name}.roothome"  # like /root: 0700, where pyenv puts its pythons
        home.mkdir(mode=0o700)
        try:
            venv = home / "venv"
            subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
            args = m.install_args()
            args[args.index("--venv") + 1] = str(venv)
            r = setup_cli(*args)
        finally:
            shutil.rmtree(home, ignore_errors=True)
        assert r.returncode == 2, r.stdout + r.stderr
        assert f"interpreter {venv}/bin/python" in r.stderr and f"{home} stops them (mode 0700" in r.stderr
        assert "bad interpreter: Permission denied" in r.stderr and f"chmod o+x {home}" in r.stderr
        assert list(m.root.iterdir()) == [], "a refused install must change nothing"


def test_a_systemd_unit_is_written_and_enabled_under_root_for_an_image_without_starting_it():
    """systemd is not PID 1 here: --service systemd alone is refused, with --root it writes the unit."""
    with machine() as m:
        unit = m.root / "etc/systemd/system/mtgpu.service"
        wants = m.root / "etc/systemd/system/multi-user.target.wants/mtgpu.service"
        r = m.install("--service", "systemd")
        assert "not started here" in r.stdout and "start the service" not in r.stdout, r.stdout
        assert f"ExecStart={VENV}/bin/mtgpu-server --config {m.config}" in unit.read_text()
        assert os.readlink(wants) == "/etc/systemd/system/mtgpu.service"
        assert m.server_pid() is None and not m.socket.exists() and not m.script.exists()
        doc = m.status()
        assert doc["service"]["kind"] == "systemd" and doc["service"]["autostart"] is True, doc
        assert doc["service"]["state"] == "stopped" and doc["exit"] == 3
        again = m.install("--service", "systemd")
        assert again.stdout.rstrip().endswith("nothing changed: every step was already done"), again.stdout
        r = setup_cli("uninstall", "--yes", "--root", str(m.root))
        assert r.returncode == 0, r.stdout + r.stderr
        assert not unit.exists() and not wants.is_symlink()


def test_an_invalid_existing_config_is_refused_naming_the_key_and_kept():
    with machine() as m:
        m.config.parent.mkdir(parents=True)
        m.config.write_text('GPU_BACKEND = "cuda"\nSTATE_DIR = "/var/lib/mtgpu"\n')
        r = setup_cli(*m.install_args())
        assert r.returncode == 2, r.stdout + r.stderr
        assert 'GPU_BACKEND = "cuda"' in r.stderr and '"simulated"' in r.stderr  # the key, the value, what is allowed
        assert "kept as it is" in r.stderr and "fix the key" in r.stderr
        assert m.config.read_text() == 'GPU_BACKEND = "cuda"\nSTATE_DIR = "/var/lib/mtgpu"\n'
        assert not m.script.exists() and not (m.root / "etc/mtgpu/install.json").exists()


def test_without_yes_each_change_is_asked_and_a_no_changes_nothing():
    with machine() as m:
        args = [a for a in m.install_args() if a != "--yes"]
        r = setup_cli(*args, input="n\n")
        assert r.returncode == 1, r.stdout + r.stderr
        assert "you said no" in r.stdout and "?" in r.stdout
        assert not (m.root / "etc").exists() and m.server_pid() is None


def test_bad_flags_are_refused_naming_the_flag_and_the_fix():
    with machine() as m:
        r = setup_cli(*m.install_args("--set", "LISTN=1"))
        assert r.returncode == 2 and "'LISTN' is not a config key" in r.stderr
        r = setup_cli(*m.install_args("--service", "upstart"))
        assert r.returncode == 2 and "--service 'upstart'" in r.stderr
        r = setup_cli("install", "--yes", "--root", str(m.root / "missing"))
        assert r.returncode == 2 and "is not a folder" in r.stderr
        r = setup_cli(*m.install_args("--config", "etc/mtgpu.toml"))
        assert r.returncode == 2 and "--config 'etc/mtgpu.toml': give an absolute path" in r.stderr
        r = setup_cli(*m.install_args("--peers", "127.0.0.1:7070"))
        assert r.returncode == 2 and "--peers needs --cluster-id" in r.stderr
        r = setup_cli(*m.install_args("--listen", "nowhere"))  # the last --listen wins
        assert r.returncode == 2 and 'LISTEN = "nowhere": must be host:port' in r.stderr
        assert list(m.root.iterdir()) == []


def test_purge_removes_the_tenants_accounts_and_homes_and_nothing_else():
    with machine() as m:
        accounts = account_db(m.root / "accounts")
        homes = m.root / "home/mtgpu"
        homes.mkdir(parents=True)
        m.state_dir.mkdir(parents=True)
        uid = UID_RANGE[0] + 9000 + os.getpid() % 900
        for name, home, user_id in (("mtptenant", homes / "mtptenant", uid), ("mtpother", m.root / "elsewhere", uid + 1)):
            for cmd in (["groupadd", "--prefix", str(accounts), "-g", str(user_id), name],
                        ["useradd", "--prefix", str(accounts), "-u", str(user_id), "-g", str(user_id), "-d", str(home),
                         "-M", name]):
                r = subprocess.run(cmd, capture_output=True, text=True)
                assert r.returncode == 0, r.stderr
        (homes / "mtptenant").mkdir()
        m.config.parent.mkdir(parents=True)
        m.config.write_text(f'STATE_DIR = "{m.state_dir}"\nTENANT_HOME_ROOT = "{homes}"\nACCOUNTS_ROOT = "{accounts}"\n'
                            f"TENANT_UID_RANGE = [{UID_RANGE[0]}, {UID_RANGE[1]}]\n")
        r = setup_cli("uninstall", "--yes", "--purge", "--root", str(m.root))
        assert r.returncode == 0, r.stdout + r.stderr
        passwd = (accounts / "etc/passwd").read_text()
        assert "mtptenant:" not in passwd and "mtpother:" in passwd  # a home outside TENANT_HOME_ROOT: not ours
        assert not homes.exists() and not m.state_dir.exists() and not m.config.exists()

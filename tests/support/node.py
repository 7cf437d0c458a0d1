"""A real `mtgpu-server` process for integration tests, and CLIs run as real users.

    with running_node(gpus=[{"model": "rtx4090", "vram": "24G", "count": 2}]) as node:
        r = node.mt_job(user, "submit", "--json", "--wrap", "nvidia-smi")

STATE_DIR lives under a world-traversable folder in /tmp (tenants reach the socket and
their logs). On exit the node's jobs are cancelled, the server is stopped by its PID,
and the folder is removed, also when the test failed.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from mtgpu.agent.procs import alive
from mtgpu.client.local import ClientError, LocalClient

PYTHON = sys.executable
# The CLIs a test runs as a tenant import this checkout (not an older installed copy).
REPO_ROOT = str(Path(__file__).resolve().parents[2])


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports handed out by free_port, to any process of the suite on this machine: a file per
# port holding the pid of the process that took it. The suite runs several pytest processes
# side by side (scripts/test.sh) and each picks ports at random: a port picked by one and
# not yet bound (a server still starting on a busy machine) was free to the other's pick. A
# loaded run once gave a one-member cluster's Raft port to another test's relay: that
# member never led. A port stays taken while its process lives; a dead one's are free again.
PORTS_TAKEN_DIR = Path(tempfile.gettempdir()) / "mtgpu-test-ports"


def _taken(port: int) -> bool:
    try:
        pid = int((PORTS_TAKEN_DIR / str(port)).read_text() or "0")
    except (FileNotFoundError, ValueError):
        return False
    return alive(pid)


def free_port(count: int = 1) -> int:
    """A free port p (and p+1 .. p+count-1) on 127.0.0.1, below the kernel's ephemeral
    range: a server that restarts must get its port back, and an ephemeral port can be
    taken meanwhile as the source port of any outgoing connection on the machine. Never
    one that a live process of the suite took before (PORTS_TAKEN_DIR)."""
    import fcntl

    hi = _ephemeral_start() - count
    lo = max(1024, hi - 20000)
    PORTS_TAKEN_DIR.mkdir(mode=0o755, exist_ok=True)
    with open(PORTS_TAKEN_DIR / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one picker at a time, across the suite's processes
        for _ in range(400):
            p = lo + secrets.randbelow(hi - lo)
            ports = range(p, p + count)
            if any(_taken(q) for q in ports):
                continue
            try:
                for q in ports:
                    with socket.socket() as s:
                        s.bind(("127.0.0.1", q))
            except OSError:
                continue
            for q in ports:
                (PORTS_TAKEN_DIR / str(q)).write_text(str(os.getpid()))
            return p
    raise RuntimeError(f"no {count} free port(s) in {lo}-{hi + count}")


def wait_for(what: str, check: Callable[[], object], timeout_s: float = 20.0, interval_s: float = 0.05):
    """Poll `check` until it returns something truthy; fail saying what was awaited. A check
    that takes long (it starts a command: a Python start is ~0.3 s of CPU) is followed by
    a pause as long as it took, at most 1 s: polls that start processes back to back kept
    a core busy while the suite's other parts waited for it."""
    deadline = time.monotonic() + timeout_s
    last_error = None
    while time.monotonic() < deadline:
        began = time.monotonic()
        try:
            value = check()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - reported if the deadline passes
            last_error = e
        time.sleep(max(interval_s, min(1.0, time.monotonic() - began)))
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}" + (f" (last error: {last_error})" if last_error else ""))


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def write_config(path: Path, settings: dict, gpus: list[dict]) -> None:
    """Top-level keys, then each dict-valued key as a [TABLE], then [[SIMULATED_GPUS]]."""
    lines = [f"{k} = {toml_value(v)}" for k, v in settings.items() if not isinstance(v, dict)]
    for table, values in settings.items():
        if isinstance(values, dict):
            lines.append(f"\n[{table}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
    for g in gpus:
        lines.append("\n[[SIMULATED_GPUS]]")
        lines += [f"{k} = {toml_value(v)}" for k, v in g.items()]
    path.write_text("\n".join(lines) + "\n")


@dataclass
class Node:
    base: Path
    config_path: Path
    state_dir: Path
    socket_path: Path
    port: int
    proc: subprocess.Popen | None = None
    log_files: list[Path] = field(default_factory=list)
    prefix: list[str] = field(default_factory=list)  # e.g. nsenter into a network namespace (netlab.py)

    # ------------------------------------------------------------ process
    def start(self, timeout_s: float = 30.0, wait: bool = True) -> None:
        log_path = self.base / f"server-{len(self.log_files)}.log"
        self.log_files.append(log_path)
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen([*self.prefix, PYTHON, "-m", "mtgpu.cli.server", "--config", str(self.config_path)],
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        if wait:
            self.wait_up(timeout_s)

    def wait_up(self, timeout_s: float = 120.0) -> None:
        def up():
            if self.proc.poll() is not None:
                raise AssertionError(f"mtgpu-server exited with {self.proc.returncode}:\n{self.server_log()}")
            with LocalClient(str(self.socket_path), timeout_s=2) as c:
                return c.health()["ok"]

        wait_for("the server's socket to answer", up, timeout_s)

    def server_log(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-4000:] for p in self.log_files if p.exists())

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def terminate(self) -> None:
        terminate_all([self])

    # ------------------------------------------------------------ clients
    def client(self) -> LocalClient:
        return LocalClient(str(self.socket_path))

    def env_for(self, home: str = "/") -> dict[str, str]:
        return {"MTGPU_SOCKET": str(self.socket_path), "PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
                "COLUMNS": "200", "PYTHONPATH": REPO_ROOT}

    def run_cli(self, module: str, user, *args: str, input: str | None = None, timeout_s: float = 60) -> subprocess.CompletedProcess:
        kw = {}
        if user is not None:
            kw = {"user": user.uid, "group": user.gid, "extra_groups": [], "cwd": user.home}
        return subprocess.run([PYTHON, "-m", module, *args], env=self.env_for(user.home if user else "/root"),
                              capture_output=True, text=True, input=input, timeout=timeout_s, **kw)

    def mt_job(self, user, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run_cli("mtgpu.cli.job", user, *args, **kw)

    def admin(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run_cli("mtgpu.cli.admin", None, *args, **kw)

    def submit_json(self, user, *args: str, script: str | None = None) -> dict:
        if script is not None:
            r = self.mt_job(user, "submit", "--json", *args, "-", input=script)
        else:
            r = self.mt_job(user, "submit", "--json", *args)
        assert r.returncode == 0, f"submit failed ({r.returncode}): {r.stderr}\n{self.server_log()}"
        return json.loads(r.stdout)

    def job(self, job_id: int) -> dict:
        with self.client() as c:
            return c.job(job_id)

    def workspace_of(self, tenant: str, name: str) -> dict | None:
        """A tenant's workspace as `mt-container show --json` gives it (the newest of that
        name), read as root on the socket: a poll that costs no process start (a CLI's
        Python start is 0.3 s of CPU; polls of it were a large share of the suite's)."""
        with self.client() as c:
            mine = [w for w in c.workspaces(all_tenants=True)
                    if w.get("tenant") == tenant and w["workspace"]["name"] == name]
        return max(mine, key=lambda w: w["id"]) if mine else None

    def wait_state(self, job_id: int, states: set[str] | str, timeout_s: float = 30.0) -> dict:
        states = {states} if isinstance(states, str) else states
        seen: list[dict] = []

        def reached():
            seen[:] = [self.job(job_id)]
            return seen[0]["state"] in states and seen[0]
        try:
            return wait_for(f"job {job_id} to reach {sorted(states)}", reached, timeout_s)
        except AssertionError as e:  # say where it stood and what the member said
            last = seen[0] if seen else {}
            raise AssertionError(f"{e}; it was {last.get('state')!r} ({last.get('reason')!r}), node "
                                 f"{last.get('node')!r}, history {str(last.get('history'))[-1500:]}; this "
                                 f"member's log: {self.server_log()[-3000:]}") from None

    def cancel_everything(self) -> None:
        with contextlib.suppress(ClientError, OSError), self.client() as c:
            for j in c.jobs(all_tenants=True, active_only=True):
                with contextlib.suppress(ClientError):
                    c.cancel(j["id"])


def kill_leftover_runs(state_dir: Path) -> None:
    """Last resort: kill job processes this node started (found by its run records), by PID."""
    records = list((state_dir / "runs").glob("*/started.json")) + list((state_dir / "agent").glob("*.json"))
    for record in records:
        with contextlib.suppress(Exception):
            data = json.loads(record.read_text())
            for key in ("pid", "shim_pid", "child_pid"):
                pid = data.get(key)
                if isinstance(pid, int) and pid > 1:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pid, signal.SIGKILL)
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)


def remove_container_leftovers(state_dir: Path, node_name: str) -> None:
    """What a node made outside its folder: the tenants' runtime folders, its CDI spec and
    its simulated GPUs' device nodes, its cgroups (a killed server leaves them)."""
    from mtgpu.agent.podman.cdi import CDI_DIR, remove_sim_nodes, spec_name
    from mtgpu.agent.podman.ports import chain_name, remove_chain
    from mtgpu.agent.podman.tenant import PodmanHost

    host = PodmanHost(state_dir)
    if host.runtime_root.is_dir():
        for d in host.runtime_root.iterdir():  # the tenants' processes are gone by now (user fixtures)
            with contextlib.suppress(OSError):
                subprocess.run(["umount", "-R", "-l", str(d)], capture_output=True, timeout=30)
        shutil.rmtree(host.runtime_root, ignore_errors=True)
    name = spec_name(node_name, host.key)
    for p in CDI_DIR.glob(f"mtgpu-{name}*"):
        p.unlink(missing_ok=True)
    remove_sim_nodes(name)
    remove_chain(chain_name(host.key))  # workspace ports' firewall chain
    # its jobs' parent and services cgroups, which a killed server (or a shim that outlived
    # it) leaves behind; only empty ones go
    from mtgpu.agent.runners.cgroups import CgroupManager, parent_for
    with contextlib.suppress(OSError, ValueError):
        CgroupManager(parent_for(node_name, state_dir)).release()


@contextlib.contextmanager
def running_node(gpus: list[dict] | None = None, name: str = "node-a", start: bool = True,
                 parent_dir: str | None = None, **settings) -> Iterator[Node]:
    """`parent_dir`: where the node's folder goes (default /tmp; the tenant sshd needs a
    root-controlled path such as /var/lib, since sshd's StrictModes refuses /tmp)."""
    base = Path(tempfile.mkdtemp(prefix="mtgpu-it-", dir=parent_dir))
    os.chmod(base, 0o755)
    state_dir = base / "state"
    port = free_port()
    config = {
        "NODE_NAME": name,
        "LISTEN": f"127.0.0.1:{port}",
        "STATE_DIR": str(state_dir),
        "GPU_BACKEND": "simulated",
        "TENANT_HOME_ROOT": str(base / "homes"),
        **settings,
    }
    config_path = base / "mtgpu.toml"
    write_config(config_path, config, gpus or [])
    node = Node(base, config_path, state_dir, state_dir / "mtgpu.sock", port)
    try:
        if start:
            node.start()
        yield node
    finally:
        if node.proc is not None and node.proc.poll() is None:
            node.cancel_everything()
        node.terminate()
        kill_leftover_runs(state_dir)
        remove_container_leftovers(state_dir, name)
        shutil.rmtree(base, ignore_errors=True)


def terminate_all(nodes: list["Node"]) -> None:
    """SIGTERM every node's server at once, then wait for each (SIGKILL after 10 s): a
    cluster stops in the time of its slowest member, not of all of them in a row."""
    running = [n.proc for n in nodes if n.proc is not None and n.proc.poll() is None]
    for proc in running:
        proc.send_signal(signal.SIGTERM)
    for proc in running:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

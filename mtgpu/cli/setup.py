"""mtgpu-setup: set a node up. `demo` runs a standalone node with simulated GPUs under a
local folder and shows a tenant's job finishing; `secret` prints a new cluster secret."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import typer

from ..client.local import ClientError, LocalClient

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)

DEMO_USER = "mtgpu-demo"

DEMO_JOB = """#!/bin/bash
#MTGPU gpus=1 gpu-mode=shared vram=8G cpus=1 mem=1G name=hello-gpu
echo "hello from job $MTGPU_JOB_ID on node $MTGPU_NODE"
echo "running as $(id -un) (uid $(id -u)), in $(pwd)"
echo "my GPUs: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
for i in 1 2 3; do echo "step $i"; sleep 0.3; done
"""


def demo_config(directory: Path, port: int) -> str:
    return f"""# A standalone node with two simulated GPUs, made by `mtgpu-setup demo`.
CLUSTER_MODE = "standalone"
NODE_NAME = "demo-node"
LISTEN = "127.0.0.1:{port}"
STATE_DIR = "{directory / 'state'}"
TENANT_HOME_ROOT = "{directory / 'homes'}"
GPU_BACKEND = "simulated"

[[SIMULATED_GPUS]]
model = "NVIDIA GeForce RTX 4090"
vendor = "nvidia"
vram = "24GiB"
count = 2
"""


def _ensure_demo_user(home_root: Path) -> tuple[int, int, str]:
    try:
        pw = pwd.getpwnam(DEMO_USER)
    except KeyError:
        home_root.mkdir(parents=True, exist_ok=True)
        os.chmod(home_root, 0o755)
        subprocess.run(["useradd", "-m", "-d", str(home_root / DEMO_USER), "-s", "/bin/bash", DEMO_USER],
                       check=True, capture_output=True)
        pw = pwd.getpwnam(DEMO_USER)
    return pw.pw_uid, pw.pw_gid, pw.pw_dir


@app.command()
def demo(
    directory: Path = typer.Option(Path("demo-state"), "--dir", help="where the demo node keeps its config and state"),
    port: int = typer.Option(7070, "--port", help="the node's LISTEN port on 127.0.0.1"),
    keep_running: bool = typer.Option(False, "--keep-running", help="leave the node running afterwards"),
) -> None:
    """Start a standalone node with simulated GPUs and run a demo job as an unprivileged tenant."""
    if os.geteuid() != 0:
        typer.echo("mtgpu-setup demo starts a node (it runs jobs as other users): run it as root", err=True)
        raise SystemExit(2)
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o755)
    config = directory / "mtgpu.toml"
    config.write_text(demo_config(directory, port))
    uid, gid, home = _ensure_demo_user(directory / "homes")
    log = open(directory / "server.log", "ab")
    server = subprocess.Popen([sys.executable, "-m", "mtgpu.cli.server", "--config", str(config)],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    sock = directory / "state" / "mtgpu.sock"
    typer.echo(f"started mtgpu-server (pid {server.pid}) with config {config}")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with LocalClient(str(sock), timeout_s=2) as c:
                    c.health()
                break
            except ClientError:
                if server.poll() is not None or time.monotonic() > deadline:
                    typer.echo((directory / "server.log").read_text()[-3000:], err=True)
                    raise SystemExit(1)
                time.sleep(0.1)
        job_file = Path(home) / "hello.sh"
        job_file.write_text(DEMO_JOB)
        os.chown(job_file, uid, gid)
        env = {"MTGPU_SOCKET": str(sock), "PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "COLUMNS": "120"}
        typer.echo(f"\n$ cat {job_file}\n{DEMO_JOB}")
        typer.echo(f"$ mt-job submit --wait hello.sh    # as the tenant {DEMO_USER} (uid {uid})")
        r = subprocess.run([sys.executable, "-m", "mtgpu.cli.job", "submit", "--wait", "hello.sh"], user=uid, group=gid,
                           extra_groups=[], cwd=home, env=env)
        typer.echo(f"\n$ mt-job list    # as {DEMO_USER}")
        subprocess.run([sys.executable, "-m", "mtgpu.cli.job", "list"], user=uid, group=gid, extra_groups=[], cwd=home, env=env)
        typer.echo("\n$ mtgpu-admin nodes")
        subprocess.run([sys.executable, "-m", "mtgpu.cli.admin", "nodes"], env={**env, "HOME": "/root"})
        if r.returncode != 0:
            typer.echo(f"the demo job did not complete (status {r.returncode})", err=True)
            raise SystemExit(1)
        typer.echo("\nThe demo job completed.")
        if keep_running:
            typer.echo(f"The node keeps running (pid {server.pid}). Try: MTGPU_SOCKET={sock} mt-job list; "
                       f"stop it with: kill {server.pid}")
    finally:
        if not keep_running:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
            typer.echo("the demo node was stopped (--keep-running leaves it up)")


@app.command()
def secret(json_out: bool = typer.Option(False, "--json")) -> None:
    """Print a new cluster secret (for CLUSTER_SECRET_FILE)."""
    value = secrets.token_urlsafe(48)
    typer.echo(json.dumps({"secret": value}) if json_out else value)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

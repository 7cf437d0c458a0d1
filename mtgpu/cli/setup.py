"""mtgpu-setup: set a node up. `install --yes` installs this machine as a node (packages,
environment, config, service, autostart; docs/INSTALL.md), `upgrade --from PATH` moves it to
another version (jobs run on), `status` says how it is,
`uninstall [--purge]` removes it; `restore FILE` brings a backup back; `demo` runs a standalone node with simulated GPUs under
a local folder and shows a tenant's job finishing; `secret` prints a new cluster secret."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import signal
import subprocess
import sys
import time
from typing import Optional
from pathlib import Path

import typer

from ..client.local import ClientError, LocalClient, find_socket
from ..setup.install import InstallOptions, Installer, flags_from
from ..setup.plan import SetupRefused, SetupWork, StepFailed, run_plan
from ..setup.status import gather_status, status_lines
from ..setup.uninstall import UninstallOptions, Uninstaller
from ..setup.upgrade import UpgradeFailed, UpgradeOptions, Upgrader

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
        if not home_root.exists():  # the demo folder's homes: made here; /home is left as it is
            home_root.mkdir(parents=True)
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
    installed: bool = typer.Option(False, "--installed", help="run the demo job on the node `mtgpu-setup install` "
                                   "set up here (its config: --config) instead of starting one under --dir"),
    config_path: Path = typer.Option(Path("/etc/mtgpu/mtgpu.toml"), "--config", help="with --installed: the "
                                     "installed node's config (its STATE_DIR has the node's socket)"),
    user: Optional[str] = typer.Option(None, "--user", help=f"with --installed: run the job as this existing local "
                                       f"user (default: {DEMO_USER}, created when missing)"),
) -> None:
    """Run a demo job as an unprivileged tenant: on a standalone node with simulated GPUs
    started for it under --dir, or (--installed) on the node installed on this machine."""
    if os.geteuid() != 0:
        typer.echo("mtgpu-setup demo runs a job as another user: run it as root", err=True)
        raise SystemExit(2)
    if installed:
        _demo_on_installed(config_path, user)
        return
    if user is not None:
        typer.echo("--user is for --installed (the demo node under --dir uses its own user)", err=True)
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
        _run_demo_job(str(sock), uid, gid, home)
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


def _demo_on_installed(config_path: Path, user: str | None) -> None:
    sock = find_socket({"MTGPU_CONFIG": str(config_path)})
    try:
        with LocalClient(sock, timeout_s=5) as c:
            c.health()
    except ClientError as e:
        typer.echo(f"the installed node does not answer ({e}): `mtgpu-setup status` says why; install it with "
                   "`mtgpu-setup install --yes`", err=True)
        raise SystemExit(1)
    if user is None:
        uid, gid, home = _ensure_demo_user(Path("/home"))
    else:
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            typer.echo(f"--user {user!r}: no such local user; create it first or leave --user out", err=True)
            raise SystemExit(2)
        uid, gid, home = pw.pw_uid, pw.pw_gid, pw.pw_dir
    _run_demo_job(sock, uid, gid, home)


def _run_demo_job(sock: str, uid: int, gid: int, home: str) -> None:
    """Submit the demo job as the user, wait for it, show the lists; exit 1 if it did not complete."""
    name = pwd.getpwuid(uid).pw_name
    job_file = Path(home) / "hello.sh"
    job_file.write_text(DEMO_JOB)
    os.chown(job_file, uid, gid)
    env = {"MTGPU_SOCKET": sock, "PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "COLUMNS": "120"}
    typer.echo(f"\n$ cat {job_file}\n{DEMO_JOB}")
    typer.echo(f"$ mt-job submit --wait hello.sh    # as the tenant {name} (uid {uid})")
    r = subprocess.run([sys.executable, "-m", "mtgpu.cli.job", "submit", "--wait", "hello.sh"], user=uid, group=gid,
                       extra_groups=[], cwd=home, env=env)
    typer.echo(f"\n$ mt-job list    # as {name}")
    subprocess.run([sys.executable, "-m", "mtgpu.cli.job", "list"], user=uid, group=gid, extra_groups=[], cwd=home,
                   env=env)
    typer.echo("\n$ mtgpu-admin nodes")
    subprocess.run([sys.executable, "-m", "mtgpu.cli.admin", "nodes"], env={**env, "HOME": "/root"})
    if r.returncode != 0:
        typer.echo(f"the demo job did not complete (status {r.returncode})", err=True)
        raise SystemExit(1)
    typer.echo("\nThe demo job completed.")


@app.command()
def secret(json_out: bool = typer.Option(False, "--json")) -> None:
    """Print a new cluster secret (for CLUSTER_SECRET_FILE)."""
    value = secrets.token_urlsafe(48)
    typer.echo(json.dumps({"secret": value}) if json_out else value)


ROOT_HELP = "install into this folder instead of / (every path: /etc, /run, /var, /usr/local, /opt); for images and tests"
YES_HELP = "make every change without asking (unattended); without it each change is asked about"


def _run_setup(worker: SetupWork, yes: bool) -> None:
    """Preflight (a refusal changes nothing: status 2), then the steps (a failed one: 1)."""
    try:
        worker.preflight()
        for line in worker.summary():
            typer.echo(line)
        for note in worker.notes:
            typer.echo(f"note: {note}", err=True)
        steps = worker.steps()

        def ask(question: str) -> bool:
            try:
                return typer.confirm(question, default=False)
            except typer.Abort:
                return False

        result = run_plan(steps, yes=yes, ask=ask, out=typer.echo)
    except SetupRefused as e:
        typer.echo(f"error: {e}", err=True)
        raise SystemExit(2)
    except StepFailed as e:
        typer.echo(f"error: {e}", err=True)
        raise SystemExit(1)
    for kept in worker.kept:
        typer.echo(f"kept: {kept}")
    if result.declined is not None:
        raise SystemExit(1)


@app.command()
def install(
    yes: bool = typer.Option(False, "--yes", "-y", help=YES_HELP),
    cluster_id: str = typer.Option(None, "--cluster-id", help="CLUSTER_ID: cluster mode, in this cluster"),
    peers: str = typer.Option(None, "--peers", help="PEERS, comma-separated host:port (the founding members' LISTEN)"),
    listen: str = typer.Option(None, "--listen", help="LISTEN, host:port"),
    node_name: str = typer.Option(None, "--node-name", help="NODE_NAME (default: the hostname)"),
    ssh_listen: str = typer.Option(None, "--ssh-listen", help="SSH_LISTEN, host:port of the tenant sshd"),
    state_dir: str = typer.Option(None, "--state-dir", help="STATE_DIR (default /var/lib/mtgpu)"),
    tenant_home_root: str = typer.Option(None, "--tenant-home-root", help="TENANT_HOME_ROOT (default /home/mtgpu)"),
    gpu_backend: str = typer.Option(None, "--gpu-backend", help="GPU_BACKEND: auto, nvml, amd, intel or simulated"),
    sets: list[str] = typer.Option([], "--set", help="any other config key: KEY=VALUE in TOML, "
                                                     "e.g. 'TENANT_UID_RANGE=[420000, 429999]'; repeatable"),
    first: bool = typer.Option(False, "--first", help="this is the cluster's first member: create the cluster "
                                                      "secret even though PEERS names others"),
    secret_file: Path = typer.Option(None, "--secret-file", help="a copy of the cluster secret (from the first "
                                                                 "member) for a member that joins"),
    root: Path = typer.Option(Path("/"), "--root", help=ROOT_HELP),
    config: Path = typer.Option(None, "--config", help="the config path (default ROOT/etc/mtgpu/mtgpu.toml)"),
    venv: Path = typer.Option(None, "--venv", help="the environment (default ROOT/opt/mtgpu/venv); one that "
                                                   "already has this mtgpu version is used as it is"),
    source: Path = typer.Option(None, "--source", help="the mtgpu checkout to pip-install from (default: this one)"),
    service: str = typer.Option("auto", "--service", help="auto (systemd where it is PID 1, else the init script), "
                                                          "systemd or init.d; systemd with --root writes and enables "
                                                          "the unit for an image, not started"),
    packages: bool = typer.Option(True, "--packages/--no-packages", help="check and install the distribution "
                                                                         "packages (--no-packages: leave them)"),
    wait_timeout: float = typer.Option(None, "--wait-timeout", help="seconds to wait for the node to answer "
                                                                    "(default 90, more for a member that joins)"),
    windows_drives: str = typer.Option(None, "--windows-drives", help="on a WSL2 host: hidden (the default: the "
                                       "Windows drives under /mnt are made owner-only, in /etc/wsl.conf and the "
                                       "mounts now in place, so tenants cannot read them) or open (left as WSL "
                                       "mounts them); elsewhere there is nothing to do"),
) -> None:
    """Install this machine as a node: unattended with --yes, idempotent (a re-run changes nothing)."""
    options = InstallOptions(
        root=root, config=config, venv=venv, source=source, service=service, packages=packages,
        flags=flags_from(cluster_id=cluster_id, peers=peers, listen=listen, node_name=node_name,
                         ssh_listen=ssh_listen, state_dir=state_dir, tenant_home_root=tenant_home_root,
                         gpu_backend=gpu_backend),
        sets=list(sets), first=first, secret_file=secret_file, wait_timeout_s=wait_timeout,
        windows_drives=windows_drives)
    _run_setup(Installer(options), yes)


@app.command()
def upgrade(
    source: Path = typer.Option(..., "--from", help="the new mtgpu: a checkout's folder (with its pyproject.toml) "
                                "or a wheel mtgpu-VERSION-py3-none-any.whl with the client's wheel beside it"),
    yes: bool = typer.Option(False, "--yes", "-y", help="upgrade without asking"),
    root: Path = typer.Option(Path("/"), "--root", help=ROOT_HELP),
    config: Path = typer.Option(None, "--config", help="the config path (default: as installed)"),
    wait_timeout: float = typer.Option(None, "--wait-timeout", help="seconds to wait for the node to answer "
                                                                    "after the start (default 90)"),
) -> None:
    """Upgrade the installed mtgpu to the package --from; jobs run on; rolls back on failure.

    Builds the new environment beside the running one, stops the server alone, switches,
    starts and waits for the new version; when that fails, the version before comes back
    (docs/INSTALL.md, "Upgrading a node")."""
    worker = Upgrader(UpgradeOptions(source=source, root=root, config=config, wait_timeout_s=wait_timeout),
                      out=typer.echo)
    try:
        worker.preflight()
        if not yes:
            try:
                go = typer.confirm(worker.question(), default=False)
            except typer.Abort:
                go = False
            if not go:
                typer.echo("not upgraded (you said no); --yes upgrades without asking")
                raise SystemExit(1)
        worker.run_steps()
    except SetupRefused as e:
        typer.echo(f"error: {e}", err=True)
        raise SystemExit(2)
    except StepFailed as e:
        typer.echo(f"error: {e}; the node was left as it was", err=True)
        raise SystemExit(1)
    except UpgradeFailed as e:
        typer.echo(f"error: {e}", err=True)
        raise SystemExit(1)
    typer.echo(f"upgraded to mtgpu {worker.new.version}; {worker.previous} keeps {worker.old.version} until the "
               "next upgrade")


@app.command()
def status(
    json_out: bool = typer.Option(False, "--json", help="one JSON document"),
    root: Path = typer.Option(Path("/"), "--root", help=ROOT_HELP),
    config: Path = typer.Option(None, "--config", help="the config path (default: as installed)"),
) -> None:
    """The service's state, the node's health, its role and version. Exit 0: running and
    answering; 1: running but not answering; 3: not running."""
    try:
        doc = gather_status(root, config)
    except SetupRefused as e:
        typer.echo(f"error: {e}", err=True)
        raise SystemExit(2)
    if json_out:
        typer.echo(json.dumps(doc, indent=2, sort_keys=True))
    else:
        for line in status_lines(doc):
            typer.echo(line)
    raise SystemExit(doc["exit"])


@app.command()
def restore(
    file: Path = typer.Argument(..., help="a file `mtgpu-admin backup` wrote"),
    config: Path = typer.Option(Path("/etc/mtgpu/mtgpu.toml"), "--config", help="the stopped node's config"),
    force: bool = typer.Option(False, "--force", help="replace a state STATE_DIR holds already (it is moved "
                                                      "aside, not deleted)"),
) -> None:
    """Make a backup the state of this stopped standalone node (a new machine, or after a
    loss), or the seed of a new cluster on the member that founds it alone (taken at its
    first start): its queue, jobs' records, tenants with their uid/gid and keys, and usage.
    Jobs that ran when the backup was taken are requeued (requeue=no: lost)."""
    from ..setup.restore import restore as do_restore
    try:
        lines = do_restore(file, config, force)
    except SetupRefused as e:
        typer.echo(f"error: {e}", err=True)
        raise SystemExit(2)
    for line in lines:
        typer.echo(line)


@app.command()
def uninstall(
    yes: bool = typer.Option(False, "--yes", "-y", help=YES_HELP),
    purge: bool = typer.Option(False, "--purge", help="also remove the config, STATE_DIR, the tenants' homes and "
                                                      "accounts, and the logs"),
    force: bool = typer.Option(False, "--force", help="uninstall even while jobs run here (they keep running "
                                                      "without their node); not with --purge"),
    root: Path = typer.Option(Path("/"), "--root", help=ROOT_HELP),
    config: Path = typer.Option(None, "--config", help="the config path (default: as installed)"),
    venv: Path = typer.Option(None, "--venv", help="the environment (default: as installed)"),
    service: str = typer.Option("auto", "--service", help="the service kind, when no install record is found"),
) -> None:
    """Stop and remove the service, its autostart, the command links and the environment the
    install made. Keeps the config, STATE_DIR and the tenants' homes unless --purge."""
    _run_setup(Uninstaller(UninstallOptions(root=root, config=config, venv=venv, service=service, purge=purge,
                                            force=force)), yes)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

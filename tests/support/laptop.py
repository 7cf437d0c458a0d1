"""A tenant's 'laptop' for tests: a remotegpu-cli home folder that joined a node.

    home = tmp_path / "laptop"
    pw = invite_and_join(node, name, home)   # invited by the node's admin, joined, account made
    remotegpu(home, "whoami", "--json")
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path

from .node import REPO_ROOT, Node, free_port, running_node, wait_for


# Python installs its Ctrl-C handler only where SIGINT is not ignored at start, and a suite
# run in the background of a non-interactive shell (`nohup ... &`, `cmd &` in a script)
# inherits it ignored: a test's Ctrl-C would then reach nothing. This sets it first.
_CTRL_C_ABLE = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                "del sys.argv[0]; runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")


def interruptible(module: str, *args: str) -> list[str]:
    """The command line of `python -m module args` that a test's SIGINT (Ctrl-C) reaches
    however the test itself was started."""
    return [sys.executable, "-c", _CTRL_C_ABLE, module, *args]


def remotegpu(home: Path, *args: str, program: Path | None = None, **kw) -> subprocess.CompletedProcess:
    """remotegpu-cli of this checkout, with `home` as its REMOTEGPU_HOME; with `program`,
    that one instead (another environment's remotegpu-cli: isolated_client_env())."""
    if program is not None:
        return subprocess.run([str(program), *args], capture_output=True, text=True, timeout=60,
                              **{"cwd": "/", "env": isolated_client_env(program, home), **kw})
    return subprocess.run([sys.executable, "-m", "mtgpu.cli.remotegpu", *args], capture_output=True, text=True,
                          env={**os.environ, "REMOTEGPU_HOME": str(home)}, timeout=60, **kw)


def isolated_client_env(program: Path, home: Path) -> dict[str, str]:
    """The environment a remotegpu-cli installed elsewhere (`program`, in a virtual environment's
    bin) runs in, as on a laptop that has it alone: no PYTHONPATH (nothing of this checkout), its
    environment's bin first on PATH (ssh-config then writes it into ProxyCommand), `home` as
    REMOTEGPU_HOME. Run it from outside the checkout too (remotegpu() runs it from /)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    return {**env, "PATH": f"{Path(program).parent}:/usr/bin:/bin", "VIRTUAL_ENV": str(Path(program).parent.parent),
            "REMOTEGPU_HOME": str(home)}


def join(node: Node, name: str, home: Path, program: Path | None = None) -> dict:
    """`mtgpu-admin tenant invite NAME`, `remotegpu-cli join CODE --server` the node (on
    loopback) from `home`: the join's answer (its --json). `program`: as for remotegpu()."""
    r = node.admin("tenant", "invite", name, "--json")
    assert r.returncode == 0, r.stderr + node.server_log()[-3000:]
    r = remotegpu(home, "join", json.loads(r.stdout)["code"], "--server", f"127.0.0.1:{node.port}", "--json",
                  program=program)
    assert r.returncode == 0, r.stderr + node.server_log()[-2000:]
    return json.loads(r.stdout)


def running_dashboard(home: Path) -> subprocess.Popen:
    """`remotegpu-cli dashboard --print-url --no-browser` from `home`, left running (Ctrl-C
    reaches it: interruptible()); the caller ends it. Its link: printed_link()."""
    return subprocess.Popen(interruptible("mtgpu.cli.remotegpu", "dashboard", "--print-url", "--no-browser"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "REMOTEGPU_HOME": str(home)}, cwd=REPO_ROOT)


def printed_link(proc: subprocess.Popen) -> str:
    """The link running_dashboard()'s command printed; where it ended without one, an
    AssertionError with how (its exit status and stderr)."""
    url = proc.stdout.readline().strip()
    if not url:  # it ended without a link: say how
        proc.wait(timeout=30)
        raise AssertionError(f"remotegpu-cli dashboard ended ({proc.returncode}):\n{proc.stderr.read()}")
    return url


def invite_and_join(node: Node, name: str, home: Path) -> pwd.struct_passwd:
    """join(), then wait for the tenant's account and home on the node (in the machine's
    account database) and, where the node has a tenant sshd, for it to listen with the
    tenant's keys."""
    join(node, name, home)
    pw = wait_for("the tenant's account and home", lambda: os.path.isdir(pwd.getpwnam(name).pw_dir)
                  and pwd.getpwnam(name), timeout_s=60)
    if ssh_listen_port(node) is not None and not node.base.is_relative_to(tempfile.gettempdir()):
        sshd_up(node, name)  # (under /tmp sshd's StrictModes refuses the node's files: no sshd there)
    return pw


def ssh_listen_port(node: Node) -> int | None:
    """The port of the node's tenant sshd (SSH_LISTEN in its config), or None."""
    import tomllib
    listen = tomllib.loads(node.config_path.read_text()).get("SSH_LISTEN")
    return int(str(listen).rpartition(":")[2]) if listen else None


def sshd_up(node: Node, name: str, timeout_s: float = 90) -> None:
    """The tenant sshd listens and serves `name`: its keys are the agent's last step for a new
    tenant, after the account (which appears first) and the mtgpu-tenants group. The member
    starts sshd in its accounts agent, after the node answers: on a loaded machine a test
    that connected at once met a refused connection."""
    import socket
    port = ssh_listen_port(node)

    def accepts():
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True

    wait_for(f"the tenant sshd to listen on 127.0.0.1:{port}", accepts, timeout_s=timeout_s, interval_s=0.2)
    keys = node.state_dir / "ssh" / "authorized_keys" / name
    wait_for(f"{name}'s keys in the tenant sshd ({keys})", lambda: keys.is_file() and keys.stat().st_size > 0,
             timeout_s=timeout_s, interval_s=0.2)


def node_serving_its_relay(name: str, cluster_id: str, uid_range: tuple[int, int]):
    """running_node() of a member (cluster of one, no GPU) that serves the DirectLink relay
    itself on loopback, its tenant sshd too: for joined_behind_directlink()."""
    relay_at = f"127.0.0.1:{free_port()}"
    return running_node([], name=name, CLUSTER_MODE="cluster", CLUSTER_ID=cluster_id,
                        SSH_LISTEN=f"127.0.0.1:{free_port()}", TENANT_UID_RANGE=list(uid_range),
                        DIRECTLINK={"relays": [relay_at], "relay_listen": relay_at})


def joined_behind_directlink(node: Node, name: str, home: Path) -> None:
    """join() from `home`, wait for the member's DirectLink details in the cluster's state
    (`remotegpu-cli ssh-config` fetches them into servers.json), then make the node's
    address there dead: the client reaches it through DirectLink only."""
    join(node, name, home)

    def directlink_known() -> bool:  # the member's DirectLink id, in the cluster's state
        r = remotegpu(home, "ssh-config", "--file", str(home / "ssh_config"))
        assert r.returncode == 0, r.stderr
        return bool(json.loads((home / "servers.json").read_text())[0].get("directlink", {}).get("nodes"))
    wait_for("the member's DirectLink id", directlink_known, timeout_s=60, interval_s=0.5)
    servers = json.loads((home / "servers.json").read_text())
    servers[0]["server"] = "127.0.0.1:9"  # nothing answers there: DirectLink it is
    (home / "servers.json").write_text(json.dumps(servers))

"""A real mtgpu node with one joined tenant, for the extension's `node --test` suite
(test/node.test.mjs). Run as root with PYTHONPATH at the repository root:

    python clients/vscode/test/real_node.py

It starts `mtgpu-server` (simulated GPUs, its own TENANT_UID_RANGE, its tenant sshd on
loopback) as a cluster of one member that serves as its own DirectLink relay: a
standalone node has no DirectLink, and `remotegpu-cli ssh-config` writes Host entries
only for nodes reached through it, which the extension's SSH commands use. It invites a tenant
with `mtgpu-admin tenant invite`, joins it with `remotegpu-cli join` into a temporary
REMOTEGPU home, waits for the tenant's account, and prints one JSON line:
{"server", "home", "servers_json", "tenant", "cluster_id", "node", "ssh_port", "relay"}. It keeps the node up
until stdin ends or SIGTERM/SIGINT comes, then stops the node and removes the tenant's
account and the temporary home. Problems go to stderr and the exit status is 1.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from tests.support import users
from tests.support.node import free_port, running_node, wait_for
from tests.support.users import can_create_users, remove_tenant_accounts

UID_RANGE = (390000, 399999)  # its own: no other test's node makes accounts here
CLUSTER_ID = "vsc-lab"
GPUS = [{"model": "rtx4090", "vendor": "nvidia", "vram": "24G", "count": 2}]


def sweep_own_leftovers() -> None:
    """Accounts an earlier run of this helper left when it was killed (SIGKILL skips the
    teardown): a uid in our range whose home's parent folder is gone."""
    users.TEST_UID_RANGES = (UID_RANGE,)
    users.sweep_leftover_accounts()


def drain(stream) -> None:
    """Read (and drop) until end of file: the test closes our stdin to stop us."""
    while stream.read1(4096):
        pass


def main() -> int:
    why = can_create_users()
    if why:
        print(f"real_node: {why}", file=sys.stderr)
        return 1
    sweep_own_leftovers()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=lambda: (drain(sys.stdin.buffer), stop.set()), daemon=True).start()
    name = f"vsc{os.getpid() % 100000}"
    home = tempfile.mkdtemp(prefix="remotegpu-home-")
    try:
        relay = f"127.0.0.1:{free_port()}"
        ssh_port = free_port()
        # /var/lib: the tenant sshd's StrictModes refuses a node folder under /tmp.
        with running_node(GPUS, parent_dir="/var/lib", CLUSTER_MODE="cluster", CLUSTER_ID=CLUSTER_ID,
                          SSH_LISTEN=f"127.0.0.1:{ssh_port}", TENANT_UID_RANGE=list(UID_RANGE),
                          DIRECTLINK={"relays": [relay], "relay_listen": relay}) as node:
            try:
                r = node.admin("tenant", "invite", name, "--json")
                if r.returncode != 0:
                    raise RuntimeError(f"mtgpu-admin tenant invite failed: {r.stderr}")
                code = json.loads(r.stdout)["code"]
                r = subprocess.run([sys.executable, "-m", "mtgpu.cli.remotegpu", "join", code, "--server",
                                    f"127.0.0.1:{node.port}", "--json"], capture_output=True, text=True,
                                   env={**os.environ, "REMOTEGPU_HOME": home}, timeout=60)
                if r.returncode != 0:
                    raise RuntimeError(f"remotegpu-cli join failed: {r.stderr}\n{node.server_log()[-2000:]}")
                wait_for("the tenant's account and home",
                         lambda: os.path.isdir(pwd.getpwnam(name).pw_dir), timeout_s=60)
                print(json.dumps({"server": f"127.0.0.1:{node.port}", "home": home,
                                  "servers_json": os.path.join(home, "servers.json"), "tenant": name,
                                  "cluster_id": CLUSTER_ID, "node": "node-a", "ssh_port": ssh_port,
                                  "relay": relay}), flush=True)
                stop.wait()
            finally:
                node.cancel_everything()
                node.terminate()
                problems = remove_tenant_accounts([name], UID_RANGE)
            if problems:
                raise RuntimeError(f"the tenant account {name} was not removed cleanly: {problems}")
    except Exception as e:  # noqa: BLE001 - said once, on stderr, for the test's message
        print(f"real_node: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`mtgpu-admin directlink cluster-key` prints what a relay's operator gives
`mtgpu-relay --cluster`: a relay started with it admits the cluster's members."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mtgpu.cli.relay import parse_clusters
from mtgpu.directlink.identity import cluster_key, endpoint_id, issue
from mtgpu.directlink.relay import Relay
from mtgpu.directlink.relay_client import RelayConnection
from tests.support.node import REPO_ROOT


def admin(config, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtgpu.cli.admin", "directlink", "cluster-key", "--config",
                           str(config), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": REPO_ROOT})


def test_the_printed_cluster_key_lets_a_relay_admit_the_clusters_members(tmp_path):
    secret = tmp_path / "cluster.secret"
    secret.write_text("k" * 48 + "\n")
    secret.chmod(0o600)
    config = tmp_path / "mtgpu.toml"
    config.write_text(f'CLUSTER_MODE = "cluster"\nCLUSTER_ID = "lab-7"\nNODE_NAME = "m0"\nLISTEN = "127.0.0.1:7070"\n'
                      f'STATE_DIR = "{tmp_path}/state"\nCLUSTER_SECRET_FILE = "{secret}"\nGPU_BACKEND = "simulated"\n')
    r = admin(config)
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip()
    assert line.startswith("lab-7=") and len(line) == len("lab-7=") + 64, line
    trusted = parse_clusters([line])

    async def body():
        relay = Relay(trusted)
        server, udp = await relay.serve("127.0.0.1", 0)
        try:
            key = Ed25519PrivateKey.generate()
            cred = issue(cluster_key(secret.read_text().strip(), "lab-7"), "lab-7", endpoint_id(key), "member", "m0", 60)
            conn = await RelayConnection.open("127.0.0.1", server.sockets[0].getsockname()[1], key, cred)
            await conn.close()
        finally:
            server.close()
            udp.close()
    asyncio.run(body())

    standalone = tmp_path / "standalone.toml"
    standalone.write_text(f'NODE_NAME = "s"\nSTATE_DIR = "{tmp_path}/s"\nGPU_BACKEND = "simulated"\n')
    r = admin(standalone)
    assert r.returncode == 2 and "standalone" in r.stderr, r.stderr
    secret.unlink()
    r = admin(config)
    assert r.returncode == 2 and "cannot read the cluster secret" in r.stderr, r.stderr

"""Several real `mtgpu-server` processes on loopback forming one cluster.

    with running_cluster(3) as members:      # members[i] is a tests.support.node.Node
        leader = scheduler_of(members)

Each member has its own STATE_DIR; they share one config but for NODE_NAME and
LISTEN, and a cluster secret file. Every process is stopped by its PID at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from mtgpu.client.local import LocalClient

from .node import Node, free_port, kill_leftover_runs, remove_container_leftovers, terminate_all, wait_for, write_config

GPUS_2 = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 2}]


def free_port_pair() -> int:
    """A port p with p+1 also free (LISTEN and Raft), below the ephemeral range (free_port)."""
    return free_port(2)


class Cluster:
    def __init__(self, base: Path, secret_path: Path, peers: list[str], down_after_s: float) -> None:
        self.base = base
        self.secret_path = secret_path
        self.peers = peers
        self.down_after_s = down_after_s
        self.members: list[Node] = []

    def add_member(self, name: str, gpus: list[dict] | None = None, port: int | None = None, start: bool = True,
                   secret_path: Path | None | str = "default", host: str = "127.0.0.1", prefix: list[str] | None = None,
                   **settings) -> Node:
        port = port or free_port_pair()
        state_dir = self.base / name / "state"
        config = {
            "CLUSTER_MODE": "cluster",
            "CLUSTER_ID": "test-lab",
            "NODE_NAME": name,
            "LISTEN": f"{host}:{port}",
            "PEERS": self.peers,
            "STATE_DIR": str(state_dir),
            "GPU_BACKEND": "simulated",
            "TENANT_HOME_ROOT": str(self.base / "homes"),
            "MEMBER_DOWN_AFTER_S": self.down_after_s,
            **settings,
        }
        if secret_path == "default":
            config["CLUSTER_SECRET_FILE"] = str(self.secret_path)
        elif secret_path is not None:
            config["CLUSTER_SECRET_FILE"] = str(secret_path)
        (self.base / name).mkdir(parents=True, exist_ok=True)
        os.chmod(self.base / name, 0o755)
        config_path = self.base / name / "mtgpu.toml"
        write_config(config_path, config, GPUS_2 if gpus is None else gpus)
        node = Node(self.base / name, config_path, state_dir, state_dir / "mtgpu.sock", port, prefix=list(prefix or []))
        self.members.append(node)
        if start:
            node.start()
        return node

    def scheduler(self, among: list[Node] | None = None) -> Node:
        """The member that schedules now (asks every live member; they must agree)."""
        def find():
            names = set()
            for m in among or self.members:
                if m.proc is None or m.proc.poll() is not None:
                    continue
                with contextlib.suppress(Exception), LocalClient(str(m.socket_path), timeout_s=2) as c:
                    info = c.health()
                    if info["is_scheduler"]:
                        names.add(info["node"])
            return names.pop() if len(names) == 1 else None

        name = wait_for("one scheduler to be elected", find, timeout_s=30)
        return next(m for m in self.members if m.config_path.parent.name == name)

    def live(self) -> list[Node]:
        return [m for m in self.members if m.proc is not None and m.proc.poll() is None]


def member_name(node: Node) -> str:
    return node.config_path.parent.name


@contextlib.contextmanager
def running_cluster(n: int = 3, gpus: list[list[dict]] | None = None, down_after_s: float = 8.0,
                    settings: list[dict] | None = None, lab=None,
                    prefixes: list[list[str]] | None = None, secret: str | None = None) -> Iterator[Cluster]:
    """`lab`: a netlab.NetLab (or anything with `addresses` and `prefix(i)`); each member
    then runs in the network namespace of its address there (members that share an
    address get ports of their own; the test reaches each through its Unix socket, as on
    loopback). `prefixes`: what goes before each member's command line (e.g.
    clockjump.py's). `secret`: the cluster secret (one is made when not given)."""
    base = Path(tempfile.mkdtemp(prefix="mtgpu-cl-"))
    os.chmod(base, 0o755)
    secret_path = base / "cluster.secret"
    secret_path.write_text((secret or secrets.token_urlsafe(48)) + "\n")
    os.chmod(secret_path, 0o600)
    hosts = lab.addresses[:n] if lab else ["127.0.0.1"] * n
    ports = [7070 + 2 * hosts[:i].count(h) for i, h in enumerate(hosts)] if lab else [free_port_pair() for _ in range(n)]
    peers = [f"{h}:{p}" for h, p in zip(hosts, ports)]
    cluster = Cluster(base, secret_path, peers, down_after_s)
    try:
        for i, port in enumerate(ports):
            cluster.add_member(f"m{i}", gpus[i] if gpus else None, port=port, start=False, host=hosts[i],
                               prefix=(lab.prefix(i) if lab else []) + (prefixes[i] if prefixes else []),
                               **(settings[i] if settings else {}))
        for m in cluster.members:
            m.start(wait=False)
        for m in cluster.members:
            m.wait_up()
        cluster.scheduler()
        yield cluster
    finally:
        live = cluster.live()
        for m in live:
            with contextlib.suppress(Exception):
                os.kill(m.proc.pid, 18)  # SIGCONT: a stopped member must be able to exit
        if live:
            live[0].cancel_everything()
        terminate_all(cluster.members)
        for m in cluster.members:
            kill_leftover_runs(m.state_dir)
            remove_container_leftovers(m.state_dir, member_name(m))
        shutil.rmtree(base, ignore_errors=True)


def jobs_json(node: Node, *args: str) -> list[dict]:
    r = node.admin("jobs", "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)

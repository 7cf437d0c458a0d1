"""Typed client for a node's API over its Unix socket (identity by peer credentials).

The socket is found through MTGPU_SOCKET, else the STATE_DIR of the config named by
MTGPU_CONFIG, else the default config /etc/mtgpu/mtgpu.toml, else /var/lib/mtgpu.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, ContextManager, Mapping

import httpx

from ..model import logstream
from .errors import ClientError, answer
from .logs import LogPart, stream_log

DEFAULT_CONFIG = "/etc/mtgpu/mtgpu.toml"
DEFAULT_STATE_DIR = "/var/lib/mtgpu"


def find_socket(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    if env.get("MTGPU_SOCKET"):
        return env["MTGPU_SOCKET"]
    config_path = env.get("MTGPU_CONFIG") or DEFAULT_CONFIG
    state_dir = DEFAULT_STATE_DIR
    try:
        with open(config_path, "rb") as f:
            state_dir = tomllib.load(f).get("STATE_DIR", DEFAULT_STATE_DIR)
    except (OSError, tomllib.TOMLDecodeError):
        pass
    return str(Path(state_dir) / "mtgpu.sock")


class LocalClient:
    def __init__(self, socket_path: str | None = None, timeout_s: float = 30.0) -> None:
        self.socket_path = socket_path or find_socket()
        self._http = httpx.Client(transport=httpx.HTTPTransport(uds=self.socket_path),
                                  base_url="http://mtgpu", timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "LocalClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw) -> Any:
        try:
            r = self._http.request(method, path, **kw)
        except (httpx.HTTPError, FileNotFoundError, ConnectionRefusedError) as e:
            raise self._unreachable(e) from None
        return answer(r)

    def _unreachable(self, e: Exception) -> ClientError:
        if isinstance(e, (httpx.ConnectError, FileNotFoundError, ConnectionRefusedError)):
            return ClientError(
                f"cannot reach the mtgpu node at {self.socket_path} ({e}); is mtgpu-server running? "
                "Set MTGPU_SOCKET or MTGPU_CONFIG if it uses another STATE_DIR")
        return ClientError(f"talking to the node at {self.socket_path} failed: {e}")

    # ---------------------------------------------------------------- calls
    def podman_env(self, load: list[str] | None = None, enter: str | None = None,
                   features: list[str] | None = None) -> dict:
        """`enter`: the container this process will `podman exec` into (it is moved into that
        job's cgroup, fenced to its GPUs). `features`: Features whose staged archives to get
        (the answer's `features`, those staged on this node)."""
        body = {**({"load": load} if load else {}), **({"enter": enter} if enter else {}),
                **({"features": features} if features else {})}
        return self._call("POST", "/v1/podman/env", json=body or None, timeout=1800)

    def attach(self, job_id: int) -> dict:
        """Move this process into the caller's running job `job_id` on this node (its cgroups:
        the job's GPUs only); the answer carries the job's environment."""
        return self._call("POST", f"/v1/jobs/{job_id}/attach")

    def gpus_here(self) -> list[dict]:
        """This node's GPUs, their device nodes and telemetry."""
        return self._call("GET", "/v1/gpus/here")

    def health(self) -> dict:
        return self._call("GET", "/v1/health")

    def whoami(self) -> dict:
        return self._call("GET", "/v1/whoami")

    def submit(self, script: str, overrides: dict[str, str] | None = None, workdir: str | None = None) -> dict:
        return self._call("POST", "/v1/jobs", json={"script": script, "overrides": overrides or {}, "workdir": workdir})

    def jobs(self, all_tenants: bool = False, active_only: bool = False) -> list[dict]:
        return self._call("GET", "/v1/jobs", params={"all": all_tenants, "active": active_only})

    def job(self, job_id: int) -> dict:
        return self._call("GET", f"/v1/jobs/{job_id}")

    def cancel(self, job_id: int) -> dict:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")

    def open_log(self, job_id: int, offset: int = 0, tail: int | None = None,
                 rank: int = 0) -> ContextManager[LogPart]:
        """One slice of a job's log, streamed: from `offset` (or its last `tail` lines) to its size now."""
        params: dict = {"offset": offset, "rank": rank}
        if tail is not None:
            params["tail"] = tail
        path = logstream.LOG_STREAM_PATH.format(job_id=job_id)
        return stream_log(lambda: self._http.stream("GET", path, params=params), job_id, self._unreachable)

    def create_workspace(self, body: dict) -> dict:
        return self._call("POST", "/v1/workspaces", json=body)

    def workspaces(self, all_tenants: bool = False) -> list[dict]:
        return self._call("GET", "/v1/workspaces", params={"all": all_tenants})

    def workspace(self, name: str) -> dict:
        return self._call("GET", f"/v1/workspaces/{name}")

    def save_workspace(self, name: str, image: str) -> dict:
        return self._call("POST", f"/v1/workspaces/{name}/save", json={"image": image}, timeout=1800)

    def workspace_action(self, name: str, action: str) -> dict:
        return self._call("POST", f"/v1/workspaces/{name}/{action}")

    def nodes(self) -> list[dict]:
        return self._call("GET", "/v1/nodes")

    def dashboard_link(self) -> dict:
        """A one-time link (its path; valid a minute) to the node's web dashboard, as the caller."""
        return self._call("POST", "/v1/dashboard/link")

    def drain(self, node: str, reason: str = "") -> dict:
        return self._call("POST", f"/v1/nodes/{node}/drain", json={"reason": reason})

    def resume(self, node: str) -> dict:
        return self._call("POST", f"/v1/nodes/{node}/resume")

    def remove_node(self, node: str) -> dict:
        return self._call("POST", f"/v1/nodes/{node}/remove")

    def invite(self, name: str, clusters: list[str] | None = None, ttl_s: float | None = None) -> dict:
        body: dict = {"name": name, "clusters": clusters or []}
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        return self._call("POST", "/v1/tenants", json=body)

    def backup(self) -> dict:
        return self._call("GET", "/v1/backup")

    def retention(self, dry_run: bool = True, as_of: float | None = None) -> dict:
        return self._call("POST", "/v1/retention", json={"dry_run": dry_run, "as_of": as_of})

    def tenants(self) -> list[dict]:
        return self._call("GET", "/v1/tenants")

    def remove_tenant(self, name: str) -> dict:
        return self._call("POST", f"/v1/tenants/{name}/remove")

    def assign_tenant(self, name: str, clusters: list[str], servers: dict[str, str] | None = None) -> dict:
        body: dict = {"clusters": clusters}
        if servers:
            body["servers"] = servers
        return self._call("POST", f"/v1/tenants/{name}/assign", json=body)

    def admin_summary(self) -> dict:
        """This cluster at a glance (`mtgpu-admin clusters`)."""
        return self._call("GET", "/v1/admin/summary")

    def usage(self, since: str | None = None, until: str | None = None, by: str | None = None,
              mine: bool = False) -> dict:
        """Finished jobs' usage: every tenant's (admins), or `mine`, the caller's own."""
        params = {k: v for k, v in (("since", since), ("until", until), ("by", by)) if v}
        return self._call("GET", "/v1/usage/mine" if mine else "/v1/usage", params=params)

    def set_tenant_share(self, name: str, share: float) -> dict:
        return self._call("POST", f"/v1/tenants/{name}/share", json={"share": share})

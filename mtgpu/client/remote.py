"""Typed client for a node's network API, for tenants off the node: requests are
signed with the tenant's ed25519 key (client.signing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ContextManager

import httpx

from ..model import logstream
from .errors import ClientError, answer
from .logs import LogPart, stream_log
from .signing import load_private_key, sign_headers


class RemoteClient:
    def __init__(self, server: str, tenant: str | None = None, key_path: Path | None = None,
                 timeout_s: float = 30.0) -> None:
        self.server = server
        self.tenant = tenant
        self._key = load_private_key(key_path) if key_path is not None else None
        self._http = httpx.Client(base_url=f"http://{server}", timeout=timeout_s)
        self.on_close = None  # e.g. the DirectLink tunnel it goes through
        self.tunnel = None  # the DirectLink tunnel it goes through, if any

    @property
    def path(self) -> str:
        """How it reaches the node now: "direct", or through DirectLink "p2p" or "relayed"."""
        return "direct" if self.tunnel is None else self.tunnel.label

    def close(self) -> None:
        self._http.close()
        if self.on_close is not None:
            self.on_close()

    def __enter__(self) -> "RemoteClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, payload: dict | None = None, signed: bool = True,
              params: dict | None = None) -> Any:
        path, body, headers = self._prepare(method, path, payload, signed, params)
        try:
            r = self._http.request(method, path, content=body, headers=headers)
        except httpx.HTTPError as e:
            raise self._unreachable(e) from None
        return answer(r)

    def _prepare(self, method: str, path: str, payload: dict | None, signed: bool,
                 params: dict | None) -> tuple[str, bytes, dict[str, str]]:
        """The path with its query, the body and the headers, signed with the tenant's key."""
        if params:
            path = path + "?" + "&".join(f"{k}={v}" for k, v in params.items())
        body = json.dumps(payload).encode() if payload is not None else b""
        headers = {"content-type": "application/json"}
        if signed:
            if self._key is None or not self.tenant:
                raise ClientError("this call needs your key: join first (remotegpu-cli join CODE --server HOST:PORT)")
            headers.update(sign_headers(self._key, self.tenant, method, path, body))
        return path, body, headers

    def _unreachable(self, e: Exception) -> ClientError:
        return ClientError(f"cannot reach {self.server}: {e}")

    def info(self) -> dict:
        return self._call("GET", "/v1/info", signed=False)

    def join(self, code: str, public_key: str) -> dict:
        return self._call("POST", "/v1/join", {"code": code, "key": public_key}, signed=False)

    def directlink(self, ident: str) -> dict:
        """Relays, a credential for the key `ident` and the members' ids (docs/DIRECTLINK.md)."""
        return self._call("GET", "/v1/directlink", params={"id": ident})

    def me(self) -> dict:
        return self._call("GET", "/v1/me")

    def submit(self, script: str, overrides: dict[str, str] | None = None) -> dict:
        return self._call("POST", "/v1/jobs", {"script": script, "overrides": overrides or {}})

    def jobs(self) -> list[dict]:
        return self._call("GET", "/v1/jobs")

    def job(self, job_id: int) -> dict:
        return self._call("GET", f"/v1/jobs/{job_id}")

    def cancel(self, job_id: int) -> dict:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")

    def usage(self, since: str | None = None, until: str | None = None, by: str | None = None) -> dict:
        """This tenant's finished jobs' usage (docs/ACCOUNTING.md)."""
        params = {k: v for k, v in (("since", since), ("until", until), ("by", by)) if v}
        return self._call("GET", "/v1/usage/mine", params=params)

    def nodes(self) -> list[dict]:
        """The cluster's members with their GPUs' live use (what a tenant may see)."""
        return self._call("GET", "/v1/nodes")

    def workspaces(self) -> list[dict]:
        return self._call("GET", "/v1/workspaces")

    def dashboard_link(self) -> dict:
        """A one-time link (its path; valid a minute) to the node's web dashboard, as this tenant."""
        return self._call("POST", "/v1/dashboard/link")

    def create_workspace(self, body: dict) -> dict:
        """Create a workspace: body as `POST /v1/workspaces` takes it (template or image, name, ...)."""
        return self._call("POST", "/v1/workspaces", body)

    def workspace_action(self, name: str, action: str) -> dict:
        """start, stop or rm one of your workspaces."""
        return self._call("POST", f"/v1/workspaces/{name}/{action}")

    def workspace(self, name: str) -> dict:
        return self._call("GET", f"/v1/workspaces/{name}")

    def open_log(self, job_id: int, offset: int = 0, tail: int | None = None,
                 rank: int = 0) -> ContextManager[LogPart]:
        """One slice of a job's log, streamed: from `offset` (or its last `tail` lines) to its size now."""
        params: dict = {"offset": offset, "rank": rank}
        if tail is not None:
            params["tail"] = tail
        path, _, headers = self._prepare("GET", logstream.LOG_STREAM_PATH.format(job_id=job_id), None, True, params)
        return stream_log(lambda: self._http.stream("GET", path, headers=headers), job_id, self._unreachable)

"""One long-lived process running as a tenant that calls a node's local API for a test.

The local API knows its callers by their socket's peer credentials, so a call as a
tenant must come from a process running as that tenant. Starting the `mt-job` CLI for
each of hundreds of calls costs a Python start each (seconds on a busy 2-core machine);
this keeps one such process and sends it calls over a pipe:

    with TenantSession(node.socket_path, alice) as s:
        job = s.call("submit", script, {}, workdir=alice.home)   # LocalClient.submit
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from .node import PYTHON, REPO_ROOT

_WORKER = r"""
import json, sys
from mtgpu.client.local import ClientError, LocalClient
client = LocalClient(sys.argv[1], timeout_s=float(sys.argv[2]))
for line in sys.stdin:
    req = json.loads(line)
    try:
        out = {"ok": getattr(client, req["method"])(*req["args"], **req["kw"])}
    except ClientError as e:
        out = {"error": str(e), "status": e.status, "refused": e.refused}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
"""


class TenantCallError(Exception):
    def __init__(self, message: str, status: int, refused: bool) -> None:
        super().__init__(message)
        self.status = status
        self.refused = refused


class TenantSession:
    def __init__(self, socket_path: Path | str, user, timeout_s: float = 30.0) -> None:
        self.proc = subprocess.Popen(
            [PYTHON, "-c", _WORKER, str(socket_path), str(timeout_s)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, user=user.uid, group=user.gid, extra_groups=[], cwd=user.home,
            env={"PATH": "/usr/bin:/bin", "HOME": user.home, "PYTHONPATH": REPO_ROOT, "LANG": "C.UTF-8"})

    def call(self, method: str, *args, **kw):
        """LocalClient.METHOD(*args, **kw) as the tenant; raises TenantCallError with the node's message."""
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps({"method": method, "args": list(args), "kw": kw}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the tenant's API process ended (status {self.proc.poll()})")
        out = json.loads(line)
        if "error" in out:
            raise TenantCallError(out["error"], out["status"], out["refused"])
        return out["ok"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def __enter__(self) -> "TenantSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

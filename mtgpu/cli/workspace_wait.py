"""How `mt-container create` and `start` wait for a workspace, the same way both: until it
runs (its container up), until it has stayed queued QUEUED_WAIT_S (it keeps its place and
says why: not a failure), or until it has ended, which is a failure (exit 1, with its
reason and the end of its output). A container recorded but not seen up within UP_WAIT_S
is a failure too (exit 1, saying what podman showed last and what to look at): it is
neither running nor known to have ended, and success would be a guess.

"Up" is podman's word where the workspace runs on this member: its container running at
two looks SETTLE_S apart, with the same start time (a container whose command is not there
runs for a moment, then exits). On another member, whose podman this one cannot ask, a
workspace not stopped REMOTE_SETTLE_S after its container was recorded counts as up (one
that fails later shows it in `mt-container show`).
"""

from __future__ import annotations

import subprocess
import time
from typing import Callable

from ..client.errors import ClientError
from ..client.local import LocalClient
from ..client.logs import copy_log
from .podman import tenant_podman

QUEUED_WAIT_S = 15.0  # then it stays queued, and says why
STAGING_WAIT_S = 900.0  # staging an image (fetched from another member, loaded) can take that long
UP_WAIT_S = 300.0  # from its container being recorded to podman running it (a loaded machine)
SETTLE_S = 2.0
REMOTE_SETTLE_S = 5.0
POLL_S = 0.1


class WorkspaceNotUp(Exception):
    """Its job runs and its container was recorded, but podman did not show that container up
    within UP_WAIT_S: `record` is the workspace's last view, `last` what podman said last."""

    def __init__(self, name: str, record: dict, last: str) -> None:
        w = record["workspace"]
        super().__init__(
            f"workspace {name} (job {record['id']}) is not up after {UP_WAIT_S:.0f} s: its job is "
            f"{record['state']} on {w['node']}, but its container {w['container']} was not seen up ({last}); "
            f"see `mt-container show {name}` and `mt-container logs {name}` (it may still come up, "
            f"or `mt-container stop {name}` releases what it holds)")
        self.name = name
        self.record = record
        self.last = last


class WorkspaceEnded(Exception):
    """The workspace stopped or ended instead of running: `record` is its view (stopped) or
    its job's final record (ended), with its id, state and reason."""

    def __init__(self, name: str, record: dict) -> None:
        super().__init__(record.get("reason") or record.get("state"))
        self.name = name
        self.record = record


def view(c: LocalClient, name: str, job_id: int) -> dict:
    """The workspace as `show` gives it; WorkspaceEnded when it has ended (an ended
    workspace is no longer listed: its job's record says why)."""
    try:
        return c.workspace(name)
    except ClientError as e:
        if e.status != 404:
            raise
    job = c.job(job_id)
    if job.get("state") in ("queued", "running", "stopped"):  # listed again by the next look
        return c.workspace(name)
    raise WorkspaceEnded(name, job)


def wait_until_up(c: LocalClient, ws: dict, sleep: Callable[[float], None] = time.sleep) -> dict:
    """`ws` (a workspace's view, just created or started) once it runs, or as it is when it
    stays queued or staging past the waits; WorkspaceEnded when it stopped (its container
    exited: the member stops a workspace whose command ends) or ended instead;
    WorkspaceNotUp when its container was recorded but not seen up within UP_WAIT_S."""
    name, job_id = ws["workspace"]["name"], ws["id"]
    ws = _running_or_waiting(c, ws, name, job_id, sleep)
    if ws["state"] == "stopped":
        raise WorkspaceEnded(name, ws)
    return ws


def _running_or_waiting(c: LocalClient, ws: dict, name: str, job_id: int, sleep: Callable[[float], None]) -> dict:
    until = time.monotonic() + QUEUED_WAIT_S
    while ws["state"] == "queued" and time.monotonic() < until:
        sleep(POLL_S)
        ws = view(c, name, job_id)
    until = time.monotonic() + STAGING_WAIT_S
    while ws["state"] == "running" and not ws["workspace"]["container"] and time.monotonic() < until:
        sleep(POLL_S)
        ws = view(c, name, job_id)
    if ws["state"] != "running" or not ws["workspace"]["container"]:
        return ws
    here = isinstance(c, LocalClient) and c.health()["node"] == ws["workspace"]["node"]  # a remote caller: no podman
    podman = tenant_podman_of(c) if here else None  # asked once: the same answer at every look
    recorded_at = time.monotonic()
    seen: str | None = None  # the start time of the container seen running at the last look
    seen_at = 0.0
    last = "podman not asked yet"
    until = recorded_at + UP_WAIT_S
    while time.monotonic() < until:
        ws = view(c, name, job_id)
        if ws["state"] != "running":
            return ws
        status = container_status(podman, ws["workspace"]["container"]) if podman else None
        now = time.monotonic()
        if status is None:  # not ours to ask (another member), or podman cannot say: the job's state decides
            if now - recorded_at >= REMOTE_SETTLE_S:
                return ws
            last = "podman could not be asked"
        elif status[0] == "running":
            if seen != status[1]:
                seen, seen_at = status[1], now
            elif now - seen_at >= SETTLE_S:
                return ws
            last = f"podman last showed it running since {status[1]}, not yet for {SETTLE_S:.0f} s in a row"
        else:
            seen = None
            last = "podman had not made it yet" if status[0] == "missing" else f"podman last showed it {status[0]}"
        sleep(POLL_S * 5)
    raise WorkspaceNotUp(name, ws, last)


def tenant_podman_of(c: LocalClient) -> tuple[str, dict[str, str]] | None:
    """(podman, its environment) for the caller on this member, from the member's answer;
    None when the member cannot say (podman is then not asked)."""
    try:
        return tenant_podman(c.podman_env())
    except ClientError:
        return None


def container_status(podman: tuple[str, dict[str, str]], container: str) -> tuple[str, str] | None:
    """(status, started at) of `container` in the caller's podman store on this member, with
    `podman` from tenant_podman_of; None when podman cannot be asked."""
    program, env = podman
    try:
        r = subprocess.run([program, "container", "inspect", "--format", "{{.State.Status}} {{.State.StartedAt}}",
                            container], env=env, capture_output=True, text=True, timeout=120, cwd="/")
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return ("missing", "")  # not made yet (podman run is starting it)
    status, _, started = r.stdout.strip().partition(" ")
    return status, started


def not_up_message(c, e: WorkspaceEnded) -> str:
    """What create and start say (mt-container, the terminal app) when the workspace stopped
    or ended instead of running: its state, its reason and the end of its output."""
    tail = output_tail(c, e.record["id"])
    return (f"workspace {e.name} (job {e.record['id']}) could not start: it is {e.record['state']}"
            + (f" ({e.record['reason']})" if e.record.get("reason") else "")
            + (f"; its output ends with:\n{tail}" if tail else ""))


def output_tail(c: LocalClient, job_id: int, lines: int = 5) -> str:
    """The last lines of the workspace's output (its command's, its lifecycle commands'), or ""."""
    got: list[bytes] = []
    try:
        copy_log(c, job_id, got.append, follow=False, tail=lines, notice=lambda _text: None)
    except (ClientError, OSError):
        return ""
    return b"".join(got).decode(errors="replace").rstrip()

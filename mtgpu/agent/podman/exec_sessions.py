"""The exec sessions open in a workspace's container, counted for idle culling
(workspaces/idle.py), and the dead ones removed.

Podman (4.3 here) lists a container's exec sessions in `.ExecIDs`. A `podman exec`
whose process never started (an executable not found, a bad working folder or user)
leaves its session there for good: `podman exec` returns 126/127 without removing it.
Counted as attached, such a session kept a workspace busy forever, so idle culling
never stopped it. A running session has a conmon of its own (`conmon -c CONTAINER -u
SESSION`) for as long as its process lives; one without, that was already listed a
sample ago and had none then either, is dead and removed with `podman container cleanup
--exec SESSION --rm`, which refuses to remove a running one. (A session whose start took
longer than the time between two samples, idle_watch's every_s, 2-30 s, would be taken
for dead too, and podman's cleanup refuses to remove only a running one.)
"""

from __future__ import annotations

import logging
import subprocess

import psutil

from .tenant import TenantPodman, last_error

log = logging.getLogger(__name__)


def live_sessions(container_id: str) -> set[str]:
    """The exec sessions of container `container_id` (its full id) that have a conmon
    running: `conmon ... -c CONTAINER -u SESSION ...` (the container's own conmon has
    -u CONTAINER)."""
    out = set()
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            if p.info["name"] != "conmon":
                continue
            argv = p.info["cmdline"] or []
        except psutil.Error:
            continue
        flags = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i] in ("-c", "-u")}
        if flags.get("-c") == container_id and flags.get("-u") not in (None, container_id):
            out.add(flags["-u"])
    return out


def split_sessions(ids: list[str], live: set[str], quiet_before: set[str]) -> tuple[list[str], list[str], set[str]]:
    """(sessions that count as attached, dead sessions to remove, the quiet ones now).
    Quiet: listed with no conmon. A quiet session counts as attached the first time (it may
    be starting: its conmon comes within moments); quiet at two samples in a row, it is dead."""
    quiet = {s for s in ids if s not in live}
    dead = [s for s in ids if s in quiet and s in quiet_before]
    active = [s for s in ids if s not in dead]
    return active, dead, quiet


class ExecSessions:
    """The count per workspace container, remembering which sessions the last sample found quiet."""

    def __init__(self) -> None:
        self._quiet: dict[str, set[str]] = {}
        self._last: dict[str, int] = {}

    def count(self, tenant: TenantPodman, container: str) -> int:
        """Attached sessions of `container` (a name) now; dead ones are removed on the way.
        When podman cannot tell (a timeout on a loaded machine), the last count: a shell
        open in it is not taken for none by one failed look."""
        try:
            r = tenant.run(["container", "inspect", "--format", "{{.ID}}{{range .ExecIDs}} {{.}}{{end}}", container],
                           timeout_s=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            log.info("container %s: its exec sessions could not be read (%s); the last count stands", container, e)
            return self._last.get(container, 0)
        if r.returncode != 0:
            log.info("container %s: its exec sessions could not be read (%s); the last count stands", container,
                     last_error(r))
            return self._last.get(container, 0)
        words = r.stdout.decode(errors="replace").split()
        if not words:
            self._quiet.pop(container, None)
            self._last[container] = 0
            return 0
        cid, ids = words[0], words[1:]
        active, dead, quiet = split_sessions(ids, live_sessions(cid) if ids else set(),
                                             self._quiet.get(container, set()))
        for session in dead:
            if not self._remove(tenant, container, session):
                active.append(session)  # it runs after all (podman refused to remove it)
        self._quiet[container] = quiet
        self._last[container] = len(active)
        return len(active)

    @staticmethod
    def _remove(tenant: TenantPodman, container: str, session: str) -> bool:
        try:
            r = tenant.run(["container", "cleanup", "--exec", session, "--rm", container], timeout_s=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("container %s: exec session %s could not be removed: %s", container, session[:12], e)
            return False
        if r.returncode != 0:
            log.info("container %s: exec session %s kept: %s", container, session[:12], last_error(r))
            return False
        log.info("container %s: removed exec session %s, whose process had ended (a failed podman exec)",
                 container, session[:12])
        return True

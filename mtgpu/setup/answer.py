"""`python -I -m mtgpu.setup.answer CONFIG PID SECONDS`: the init script's wait, after it
started (or restarted) mtgpu-server, until the node answers on its socket (STATE_DIR/
mtgpu.sock of CONFIG), so that `start` returns once `mtgpu-setup status` says it answers.

Exit 0: it answers (one line says so). 1: the server (PID) ended first. 3: it runs but did
not answer within SECONDS (a member that joins its cluster may take longer); the line says
so and how to follow it. 2: CONFIG cannot be read, so the socket is not known."""

from __future__ import annotations

import sys
import time
from pathlib import Path


def _alive(pid: int) -> bool:
    """Whether PID still runs: it exists and is no zombie. Its command line is not asked:
    it is empty for a moment while env, setsid and the interpreter exec one another, and
    a busy machine's init script once took that moment for the server's end."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def main(argv: list[str]) -> int:
    if len(argv) != 3 or not argv[1].isdigit():
        print("usage: python -m mtgpu.setup.answer CONFIG PID SECONDS", file=sys.stderr)
        return 2
    from ..config import ConfigError, load_config
    from .node import try_health

    try:
        config = load_config(Path(argv[0]))
        timeout_s = float(argv[2])
    except (ConfigError, ValueError) as e:
        print(f"mtgpu: cannot tell whether the node answers: {e}", file=sys.stderr)
        return 2
    pid, sock = int(argv[1]), config.socket_path
    start = time.monotonic()
    while True:
        got, why = try_health(sock)
        if got is not None and got.get("ok"):
            print(f"mtgpu answers on {sock} (node {got.get('node')}, after {time.monotonic() - start:.1f}s)")
            return 0
        if not _alive(pid):
            return 1
        if time.monotonic() - start > timeout_s:
            print(f"mtgpu runs (pid {pid}) but did not answer on {sock} within {timeout_s:g}s (last: {why}); a "
                  "member joining its cluster may take longer: `mtgpu-setup status` says when it answers",
                  file=sys.stderr)
            return 3
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

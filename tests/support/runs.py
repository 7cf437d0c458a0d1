"""A job's run as its member's runner keeps it on disk (STATE_DIR/runs, STATE_DIR/agent),
and what a test does to it: kill its server and its supervisor (shim), or make it look
like a run the machine's restart killed."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
from pathlib import Path
from typing import Iterator

from tests.support.node import wait_for


def marked_job(user, *directives: str, shell: str = "/bin/bash") -> tuple[str, Path, Path]:
    """A job that appends a line to its marker, then runs until its flag exists (the
    marker and the flag are in the tenant's home): its script, marker and flag."""
    tag = secrets.token_hex(4)
    marker, flag = Path(user.home) / f"runs-{tag}", Path(user.home) / f"go-{tag}"
    lines = "".join(f"#MTGPU {d}\n" for d in directives)
    return f"#!{shell}\n{lines}echo run >> {marker}\nwhile [ ! -e {flag} ]; do sleep 0.1; done\n", marker, flag


@contextlib.contextmanager
def running_marked_job(node, user, *directives: str, shell: str = "/bin/bash", then: str = "",
                       timeout_s: float = 30) -> Iterator[tuple[int, Path, Path]]:
    """A marked_job submitted to `node` (its script followed by `then`), once its marker has
    its line: its id, marker and flag. The flag is set on the way out, so that the job ends
    also when the test fails."""
    script, marker, flag = marked_job(user, *directives, shell=shell)
    jid = node.submit_json(user, script=script + then)["job_id"]
    try:
        wait_for("the job to write its marker", lambda: lines_of(marker) == ["run"], timeout_s=timeout_s)
        yield jid, marker, flag
    finally:
        flag.touch()


def burner_script(node: str, burners: int, seconds: int) -> str:
    """A job on `node` that keeps `burners` busy loops (no fork inside the loop) for `seconds`."""
    return ("#!/bin/bash\n"
            f"#MTGPU server={node} name=burn-{node}\n"
            f"for i in $(seq {burners}); do\n"
            f"  ( SECONDS=0; while (( SECONDS < {seconds} )); do :; done ) &\n"
            "done\n"
            "wait\n")


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def started(node, jid: int) -> dict:
    return json.loads((node.state_dir / "runs" / str(jid) / "started.json").read_text())


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def kill_server_and_shim(node, jid: int) -> None:
    """SIGKILL the server's process group and the job's shim (not the job)."""
    shim = json.loads((node.state_dir / "agent" / f"{jid}.json").read_text())["runner"]["shim_pid"]
    assert b"shim.py" in Path(f"/proc/{shim}/cmdline").read_bytes()
    os.killpg(node.proc.pid, signal.SIGKILL)
    node.proc.wait(timeout=10)
    os.kill(shim, signal.SIGKILL)
    wait_for("the shim to be gone", lambda: _gone(shim))


def kill_the_keeper(node, jid: int) -> None:
    """SIGKILL the job's keeper (started.json's pid, root, the parent of the job proper):
    after the shim, the last one that knew how the job ends."""
    pid = started(node, jid)["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for("the keeper to be gone", lambda: _gone(pid))


def kill_the_job(node, jid: int) -> None:
    """What a restart of the machine does to the job: its processes are gone, its keeper
    first (so that it records nothing)."""
    kill_the_keeper(node, jid)
    pid = started(node, jid)["pid"]
    os.killpg(pid, signal.SIGKILL)  # the keeper led the job's process group


def as_if_started_in_another_boot(node, jid: int) -> None:
    path = node.state_dir / "runs" / str(jid) / "started.json"
    path.write_text(json.dumps({**started(node, jid), "boot": "0" * 32}))

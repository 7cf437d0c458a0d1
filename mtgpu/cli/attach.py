"""`mt-job attach` and `mt-job gpus`: a session joins a running job, and what it can reach.

`mt-job attach ID [-- CMD...]` (Slurm's `srun --jobid=ID --overlap --pty bash`, and what
pam_slurm_adopt does to an SSH login): run on the member where the job runs, it asks the
node to move this very process into the job's cgroups, sets the job's variables
(CUDA_VISIBLE_DEVICES and the like, MTGPU_*, SLURM_* for a Slurm script), then execs CMD
(default: your shell). The session opens exactly the job's GPUs, counts against the job's
CPU and memory, and ends when the job ends.

`mt-job gpus` lists the GPUs of this member that the calling process can open, with their
telemetry, as nvidia-smi does inside a reservation on an NVIDIA node: in a job or an
attached session its GPUs, in a plain SSH session none (docs/ISOLATION.md).
"""

from __future__ import annotations

import errno
import os
import sys

from ..client.local import ClientError, LocalClient
from ..ssh.wrapper import user_shell
from .common import Col, err, fail, print_json, print_table, request, size


def attach(job_id: int, command: list[str], hold: bool = False) -> None:
    """Join job `job_id` and exec `command` (default: the user's shell); never returns.
    `hold`: on a refusal, keep the message on the terminal until Enter (a tmux pane, which
    would otherwise close with it)."""
    if os.geteuid() == 0:
        fail("mt-job attach joins a job of the calling tenant; root has no jobs to join", 2)
    try:
        with LocalClient() as c:
            got = c.attach(job_id)
    except ClientError as e:
        if hold and sys.stdin.isatty():
            err.print(f"error: {e}\n(press Enter to close)", markup=False)
            sys.stdin.readline()
            raise SystemExit(1)
        fail(e)
    os.environ.update(got["env"])
    argv = list(command) or [user_shell()]
    if not command and sys.stdin.isatty():
        gpus = ",".join(map(str, got["gpus"])) or "none"
        err.print(f"attached to job {got['job_id']} on {got['node']} (GPUs: {gpus}); this shell ends with the job",
                  markup=False)
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        fail(f"could not run {argv[0]}: {e.strerror}", 127)


def opens(path: str) -> bool | None:
    """Whether the device cgroup lets this process open the device node at `path`: True when
    the open got past it (also when no driver answered, ENXIO: a simulated GPU; or the file's
    mode refused it, EACCES: a DRM node of a group the tenant is not in, which is no fence),
    False when it refused (EPERM), None when there is no such node here."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
    except OSError as e:
        if e.errno == errno.EPERM:
            return False
        if e.errno == errno.ENOENT:
            return None
    return True


def openable(gpus: list[dict]) -> list[dict]:
    """The GPUs this process can open: every device node of theirs that exists opens (a GPU
    with no device node known is not fenced, so it counts as open)."""
    return [g for g in gpus if all(opens(p) is not False for p in g.get("devices") or ())]


def gpus(json_out: bool) -> None:
    found = openable(request(LocalClient, lambda c: c.gpus_here()))
    if json_out:
        print_json(found)
        return
    if not found:
        err.print("no GPU of this node can be opened from here: GPUs are reached in a job, a session attached to "
                  "one (`mt-job attach ID`) or a workspace", markup=False)
        return
    print_table(*gpus_table(found), has_wide=False)


def gpus_table(found: list[dict]) -> tuple[list[Col], list[tuple[str, ...]]]:
    """`mt-job gpus`' table (it fits 80 columns; narrower, UTIL goes first)."""
    cols = [Col("GPU", right=True), Col("MODEL"), Col("MEMORY USED"), Col("UTIL", drop=1, right=True),
            Col("YOUR JOB")]
    return cols, [(str(g["index"]), g["model"], f"{size(g['vram_used_bytes'])} / {size(g['vram_total_bytes'])}",
                   f"{g['utilization_pct']:.0f}%", ",".join(map(str, g["your_jobs"])) or "-") for g in found]

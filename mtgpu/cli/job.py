"""mt-job: submit, list, show, cancel and read the logs of your jobs; `usage` adds up what they used;
`attach` joins a running one (its GPUs), `gpus` lists the GPUs this session can open.

Every `#MTGPU` directive is also a flag of `submit` (`--gpus nvidia:1`, `--gpu-mode shared`);
flags win over the file. `--wrap CMD` submits a one-line command without a file. A Slurm
script with `#SBATCH` lines runs as it is, and sbatch's options are flags too (`-c 4 -J x
--gres=gpu:1`, docs/SLURM.md); where a name is both, the `#MTGPU` meaning is taken.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Optional

import typer

from ..client.local import ClientError, LocalClient
from ..jobfile import DIRECTIVES, SBATCH_OVERRIDE, SBATCH_SCRIPT
from ..jobfile.sbatch import cli_option_length
from ..model.job import JobState
from .common import (err, fail, gpu_text, one_line_summaries, out, print_fields, print_json, print_jobs_table,
                     print_warnings, request, size, when)
from . import attach as sessions, squeue
from .joblog import FOLLOW, HEAD, LOGS_HELP, RANK, TAIL, follow_to_end, print_log
from .usage import checked, print_report, since_option, until_option, wide_option

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)

_DIRECTIVE_HELP = "\n".join(f"  --{k} VALUE   {v}" for k, v in DIRECTIVES.items())


def _client() -> LocalClient:
    return LocalClient()


def parse_directive_flags(args: list[str]) -> tuple[dict[str, str], list[str]]:
    """Split `--gpus 1 --gpu-mode=shared -c 4 job.sh` into ({"gpus": "1", ..., "sbatch":
    '["-c", "4"]'}, ["job.sh"]): directive flags, and sbatch options for the server to
    translate with the file's #SBATCH lines."""
    overrides: dict[str, str] = {}
    rest: list[str] = []
    sbatch_args: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        key = a[2:].partition("=")[0] if a.startswith("--") else ""
        if a.startswith("-") and a != "-" and key not in DIRECTIVES:
            n = cli_option_length(args, i)
            if n is None:
                fail(f"unknown option {a.partition('=')[0]}; the directives are: {', '.join(DIRECTIVES)}, "
                     "and sbatch's options (docs/SLURM.md)", 2)
            if i + n > len(args):
                fail(f"{a} needs a value, e.g. {a} VALUE", 2)
            sbatch_args += args[i:i + n]
            i += n
            continue
        if a.startswith("--") and len(a) > 2:
            key, eq, value = a[2:].partition("=")
            if not eq:
                if i + 1 >= len(args):
                    fail(f"--{key} needs a value, e.g. --{key} VALUE", 2)
                i += 1
                value = args[i]
            overrides[key] = value
        else:
            rest.append(a)
        i += 1
    if sbatch_args:
        overrides[SBATCH_OVERRIDE] = json.dumps(sbatch_args)
    return overrides, rest


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    epilog="Directive flags (each also a `#MTGPU key=value` line in the file):\n\n" + _DIRECTIVE_HELP,
)
def submit(
    ctx: typer.Context,
    wrap: Optional[str] = typer.Option(None, "--wrap", help="submit this shell command instead of a file"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON document"),
    wait: bool = typer.Option(False, "--wait", "-W", help="wait for the job to end, print its log, exit with its status"),
    parsable: bool = typer.Option(False, "--parsable", help="print only the job id (an array's first id), as sbatch"),
) -> None:
    """Submit a job file (or --wrap CMD). A request no node could ever run exits with status 2."""
    overrides, rest = parse_directive_flags(list(ctx.args))
    if wrap is not None:
        if rest:
            fail("give either a job file or --wrap, not both", 2)
        # In a container the image's sh (images need not have bash), natively bash.
        script = f"#!/bin/{'sh' if overrides.get('container') else 'bash'}\n{wrap}\n"
        overrides[SBATCH_SCRIPT] = "--wrap"  # a Slurm job named `wrap`, as sbatch --wrap makes
    elif len(rest) == 1:
        path = rest[0]
        try:
            script = sys.stdin.read() if path == "-" else open(path, encoding="utf-8", errors="replace").read()
        except OSError as e:
            fail(f"cannot read the job file {path}: {e.strerror}", 2)
        overrides[SBATCH_SCRIPT] = path if path == "-" else os.path.basename(path)  # sbatch's default job name
    else:
        fail("give one job file (or - for standard input), or --wrap CMD", 2)
    try:
        with _client() as c:
            result = c.submit(script, overrides, workdir=os.getcwd())
            print_warnings(result)
            if json_out and not wait:
                print_json(result)
            elif parsable and not wait:
                out.print(str(result["job_ids"][0]), markup=False)
            elif not wait:
                ids = result["job_ids"]
                out.print(f"submitted job {ids[0]}" if len(ids) == 1 else
                          f"submitted array job {ids[0]} ({len(ids)} tasks: {ids[0]}-{ids[-1]})")
            if wait:
                raise SystemExit(_wait_and_print(c, result["job_ids"], json_out))
    except ClientError as e:
        fail(e)


def _wait_and_print(c: LocalClient, job_ids: list[int], json_out: bool) -> int:
    status = 0
    jobs = []
    for jid in job_ids:
        if json_out:
            while not JobState((job := c.job(jid))["state"]).final:
                time.sleep(0.2)
        else:
            follow_to_end(c, jid)
            job = c.job(jid)
        jobs.append(job)
        if not json_out:
            err.print(f"job {jid} {job['state']}" + (f" (exit {job['exit_code']})" if job["exit_code"] is not None else "")
                      + (f": {job['reason']}" if job["reason"] else ""), markup=False)
        if job["state"] != "completed":
            status = job["exit_code"] if job["exit_code"] else 1
    if json_out:
        print_json(jobs if len(jobs) > 1 else jobs[0])
    return status


@app.command("list")
def list_jobs(
    active: bool = typer.Option(False, "--active", help="only queued and running jobs"),
    states: Optional[str] = typer.Option(None, "--state", "-t", help="only these states: queued,running,... or "
                                         "Slurm's PD,R,CD,F,CA (squeue -t)"),
    name: Optional[str] = typer.Option(None, "--name", "-n", help="only jobs with this name (squeue -n)"),
    me: bool = typer.Option(False, "--me", help="your jobs (squeue --me): the only ones mt-job lists anyway"),
    fmt: Optional[str] = typer.Option(None, "--format", "-o", help="squeue's %-fields, e.g. '%.8i %.20j %.9T "
                                      "%.10M %R' (docs/SLURM.md lists them)"),
    no_header: bool = typer.Option(False, "--noheader", "-h", help="with --format: no heading line"),
    json_out: bool = typer.Option(False, "--json"),
    wide: bool = wide_option(),
) -> None:
    """Your jobs."""
    try:
        wanted = squeue.parse_states(states) if states else None
        if fmt is not None:
            squeue.check_format(fmt)
    except squeue.FormatError as e:
        fail(str(e), 2)
    if no_header and fmt is None:
        fail("--noheader goes with --format (the table always has its heading)", 2)
    jobs = request(_client, lambda c: c.jobs(active_only=active))
    jobs = [j for j in jobs if (wanted is None or j["state"] in wanted) and (name is None or j["name"] == name)]
    if json_out:
        print_json(jobs)
    elif fmt is not None:
        now = time.time()
        lines = ([] if no_header else [squeue.header(fmt)]) + [squeue.render(j, fmt, now) for j in jobs]
        print("\n".join(lines))
    else:
        print_jobs_table(jobs, wide=wide, has_wide=True)


@app.command()
def show(job_id: int, json_out: bool = typer.Option(False, "--json")) -> None:
    """One job in full, with why it waits or failed."""
    j = request(_client, lambda c: c.job(job_id))
    if json_out:
        print_json(j)
        return
    spec = j["spec"]
    rows = [
        ("id", j["id"]), ("name", j["name"]), ("tenant", j["tenant"]), ("state", j["state"]),
        ("reason", j["reason"] or "-"), ("exit code", j["exit_code"]),
        ("nodes", ",".join(j["nodes"]) or "-"), ("gpus", gpu_text(j)),
        ("gpu mode", spec["gpu_mode"]), ("cpus", spec["cpus"] or "-"), ("mem", size(spec["mem_bytes"])),
        ("vram", size(spec["vram_bytes"])), ("submitted", when(j["submitted_at"])),
        ("started", when(j["started_at"])), ("ended", when(j["ended_at"])),
        ("enforced", ", ".join(f"{k}={v}" for k, v in j["enforced"].items()) or "-"),
        ("log", j["log_path"]),
    ]
    if j["array_index"] is not None:
        rows.insert(2, ("array", f"{j['array_parent']}[{j['array_index']}]"))
    print_fields(rows, j.get("history"))


@app.command()
def cancel(job_id: int, json_out: bool = typer.Option(False, "--json")) -> None:
    """Cancel a job (an array's id cancels all its tasks); its whole process tree is stopped."""
    r = request(_client, lambda c: c.cancel(job_id))
    if json_out:
        print_json(r)
    else:
        out.print(f"cancelled {', '.join(map(str, r['cancelled']))}")


@app.command(help=LOGS_HELP)
def logs(job_id: int, follow: bool = FOLLOW, tail: Optional[int] = TAIL, head: Optional[int] = HEAD,
         rank: int = RANK) -> None:
    print_log(_client, job_id, follow, head, tail, rank)


@app.command()
def usage(
    since: Optional[str] = since_option(),
    until: Optional[str] = until_option(),
    by: str = typer.Option("model", "--by", help="group by model (GPU model), day or node"),
    json_out: bool = typer.Option(False, "--json"),
    wide: bool = wide_option(),
) -> None:
    """Your finished jobs' usage: GPU-hours per GPU model, CPU and memory hours reserved, run
    and wait time, wait percentiles per GPU model (docs/ACCOUNTING.md)."""
    checked(since, until, by, ("model", "day", "node"))
    report = request(_client, lambda c: c.usage(since, until, by, mine=True))
    print_report(report, json_out, "usage of your finished jobs", wide)


@app.command(context_settings={"allow_interspersed_args": False})
def attach(
    job_id: int,
    command: Optional[list[str]] = typer.Argument(None, help="what to run in the job (default: your shell)"),
    hold: bool = typer.Option(False, "--hold", hidden=True, help="on a refusal, wait for Enter (a tmux pane)"),
) -> None:
    """Join your running job on this node (Slurm's srun --jobid=ID --overlap --pty): `mt-job attach ID [-- CMD...]`.
    This shell (or CMD) then opens exactly the job's GPUs, sees its CUDA_VISIBLE_DEVICES and the like, counts
    against its CPU and memory, and ends when the job ends. Over SSH: `ssh -o SetEnv=MTGPU_JOB=ID ...`."""
    command = list(command or [])
    sessions.attach(job_id, command[1:] if command[:1] == ["--"] else command, hold)


@app.command()
def gpus(json_out: bool = typer.Option(False, "--json", help="print one JSON document")) -> None:
    """The GPUs of this node this session can open, with their use now (nvidia-smi's view in a reservation):
    in a job or an attached session its GPUs, in a plain SSH session none."""
    sessions.gpus(json_out)


one_line_summaries(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

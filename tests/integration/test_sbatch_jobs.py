"""#SBATCH scripts end to end on a real node: submitted with the real mt-job as a real
tenant from a project folder, run as that tenant, printing Slurm's variables; their
output goes to the job's log and to where the script asked (sbatch's --output/--error,
with %-patterns), `srun` in the body runs its command, and warnings and refusals reach
the submitter's stderr."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.node import PYTHON, running_node, wait_for
from tests.support.users import can_create_users

if can_create_users():
    pytest.skip(can_create_users(), allow_module_level=True)

RTX2 = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 2}]


@pytest.fixture(scope="module")
def node():
    with running_node(RTX2) as n:
        yield n


@pytest.fixture(scope="module")
def project(alice) -> Path:
    """A folder of alice's to submit from, as a lab user does (`cd proj && sbatch job.sh`)."""
    d = Path(alice.home) / "proj"
    d.mkdir(exist_ok=True)
    (d / "out").mkdir(exist_ok=True)
    for p in (d, d / "out"):
        os.chown(p, alice.uid, alice.gid)
    return d


def submit(node, user, cwd: Path, script: str | None, *args: str) -> subprocess.CompletedProcess:
    """mt-job submit as `user` in `cwd`: the script on stdin, or none (--wrap in args)."""
    stdin = ["-"] if script is not None else []
    return subprocess.run([PYTHON, "-m", "mtgpu.cli.job", "submit", "--json", *args, *stdin], input=script,
                          env=node.env_for(user.home), capture_output=True, text=True, timeout=60,
                          user=user.uid, group=user.gid, extra_groups=[], cwd=str(cwd))


def submitted(node, user, cwd: Path, script: str | None, *args: str) -> tuple[dict, list[str]]:
    r = submit(node, user, cwd, script, *args)
    assert r.returncode == 0, f"{r.stderr}\n{node.server_log()}"
    return json.loads(r.stdout), [line for line in r.stderr.splitlines() if line.startswith("warning: ")]


def log_of(node, user, job_id: int) -> str:
    r = node.mt_job(user, "logs", str(job_id))
    assert r.returncode == 0, r.stderr
    return r.stdout


VARS_SCRIPT = r"""#!/bin/bash
#SBATCH --job-name=slurm-vars
#SBATCH --gres=gpu:1
#SBATCH -c 2
#SBATCH --mem=1G
#SBATCH --partition=gpu        # no partitions here: one warning
echo "JOB=$SLURM_JOB_ID JOBID=$SLURM_JOBID NAME=$SLURM_JOB_NAME USER=$SLURM_JOB_USER"
echo "NNODES=$SLURM_NNODES NODEID=$SLURM_NODEID PROCID=$SLURM_PROCID NTASKS=$SLURM_NTASKS NODELIST=$SLURM_JOB_NODELIST"
echo "CPUS=$SLURM_CPUS_PER_TASK GPUS=$SLURM_GPUS_ON_NODE SUBMIT=$SLURM_SUBMIT_DIR PWD=$PWD"
echo "ARRAY=[${SLURM_ARRAY_TASK_ID-unset}]"
srun -l --cpu-bind=cores bash -c 'echo "step rank $SLURM_PROCID of $SLURM_NTASKS sees cuda=$CUDA_VISIBLE_DEVICES"'
echo "a line on stderr" >&2
"""


def test_sbatch_script_sees_slurms_variables_runs_srun_and_writes_slurm_jobid_out(node, alice, project):
    result, warnings = submitted(node, alice, project, VARS_SCRIPT)
    assert result["warnings"] == [w.removeprefix("warning: ") for w in warnings]
    assert len(warnings) == 1 and warnings[0].startswith("warning: line 6: #SBATCH --partition=gpu is accepted")
    jid = result["job_id"]
    job = node.wait_state(jid, {"completed", "failed"})
    assert job["state"] == "completed", job
    log = log_of(node, alice, jid)
    assert f"JOB={jid} JOBID={jid} NAME=slurm-vars USER={alice.name}\n" in log
    assert "NNODES=1 NODEID=0 PROCID=0 NTASKS=1 NODELIST=node-a\n" in log
    assert f"CPUS=2 GPUS=1 SUBMIT={project} PWD={project}\n" in log
    assert "ARRAY=[unset]\n" in log
    assert f"0: step rank 0 of 1 sees cuda={job['gpus'][0]['index']}\n" in log
    assert "srun: warning: --cpu-bind=cores is ignored" in log
    out = project / f"slurm-{jid}.out"  # sbatch's default file, in the submit directory
    assert out.read_text() == log
    st = out.stat()
    assert (st.st_uid, st.st_gid) == (alice.uid, alice.gid)


ARRAY_SCRIPT = r"""#!/bin/bash
#SBATCH -J sweep
#SBATCH --array=0-6:2%2
#SBATCH --output=out/%x-%A_%a.txt
#SBATCH -t 5
echo "task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT min=$SLURM_ARRAY_TASK_MIN max=$SLURM_ARRAY_TASK_MAX array=$SLURM_ARRAY_JOB_ID job=$SLURM_JOB_ID"
"""


def test_array_with_a_limit_writes_one_file_per_task_named_by_the_pattern(node, alice, project):
    result, warnings = submitted(node, alice, project, ARRAY_SCRIPT)
    assert warnings == []
    ids = result["job_ids"]
    assert len(ids) == 4 and ids[0] == result["job_id"]
    jobs = [node.wait_state(i, {"completed", "failed"}) for i in ids]
    assert all(j["state"] == "completed" for j in jobs), jobs
    assert jobs[0]["spec"]["array"]["max_running"] == 2 and jobs[0]["spec"]["time_limit_s"] == 300
    for job, index in zip(jobs, (0, 2, 4, 6)):
        text = (project / "out" / f"sweep-{ids[0]}_{index}.txt").read_text()
        assert text == f"task {index} of 4 min=0 max=6 array={ids[0]} job={job['id']}\n"
        assert log_of(node, alice, job["id"]) == text


SPLIT_SCRIPT = r"""#!/bin/bash
#SBATCH -o split-%j.out -e split-%j.err
echo "to stdout"
echo "to stderr" >&2
exit 3
"""


def test_error_file_gets_stderr_and_the_log_keeps_both_and_the_exit_code(node, alice, project):
    result, _ = submitted(node, alice, project, SPLIT_SCRIPT)
    jid = result["job_id"]
    job = node.wait_state(jid, {"completed", "failed"})
    assert (job["state"], job["exit_code"]) == ("failed", 3)
    assert (project / f"split-{jid}.out").read_text() == "to stdout\n"
    assert (project / f"split-{jid}.err").read_text() == "to stderr\n"
    assert sorted(log_of(node, alice, jid).splitlines()) == ["to stderr", "to stdout"]


def test_an_output_file_that_cannot_be_opened_fails_the_job_naming_it(node, alice, project):
    script = "#!/bin/bash\n#SBATCH --output=no-such-dir/x.out\necho never\n"
    result, _ = submitted(node, alice, project, script)
    job = node.wait_state(result["job_id"], {"completed", "failed"})
    assert job["state"] == "failed"
    assert "could not open the output file no-such-dir/x.out" in job["reason"]
    assert "never" not in log_of(node, alice, job["id"])


def test_options_that_would_change_the_result_are_refused_at_submit(node, alice, project):
    with node.client() as c:
        before = len(c.jobs(all_tenants=True))
    r = submit(node, alice, project, "#!/bin/bash\n#SBATCH --gres=gpu:1\n#SBATCH --exclude=node-a\nhostname\n")
    assert r.returncode == 2 and "exclude=node-a leaves no node of the cluster" in r.stderr, r.stderr
    r = submit(node, alice, project, "#!/bin/bash\n#SBATCH --gres=gpu:1\n#SBATCH --hold\nhostname\n")
    assert r.returncode == 2 and re.search(r"line 3: --hold: holding a job is not available", r.stderr), r.stderr
    r = submit(node, alice, project, "#!/bin/bash\n#SBATCH --gres=gpu:h200:1\nhostname\n")
    assert r.returncode == 2 and "h200" in r.stderr  # a model no node has: refused, as gpus=h200:1 is
    with node.client() as c:
        assert len(c.jobs(all_tenants=True)) == before  # nothing was recorded


def test_sbatch_flags_on_mt_jobs_command_line(node, alice, project):
    result, warnings = submitted(node, alice, project, None, "-J", "from-flags", "-c1", "--qos=x",
                                 "--wrap", 'echo "name=$SLURM_JOB_NAME cpus=$SLURM_CPUS_PER_TASK"')
    assert warnings == ["warning: command line: --qos=x is accepted but there are no QOS levels here; "
                        "priority= sets a job's base priority"]
    job = node.wait_state(result["job_id"], "completed")
    assert log_of(node, alice, job["id"]) == "name=from-flags cpus=1\n"


def test_a_job_is_named_after_its_script_file_and_wrap_writes_slurm_jobid_out(node, alice, project):
    """As sbatch: no -J names the job after the script file (%x, SLURM_JOB_NAME); --wrap's job
    is `wrap` and writes slurm-%j.out in the submit directory."""
    script = project / "train.sh"
    script.write_text("#!/bin/bash\n#SBATCH -o %x-%j.out\necho \"name=$SLURM_JOB_NAME\"\n")
    os.chown(script, alice.uid, alice.gid)
    result, _ = submitted(node, alice, project, None, "train.sh")
    job = node.wait_state(result["job_id"], {"completed", "failed"})
    assert job["state"] == "completed" and job["name"] == "train.sh", job
    assert (project / f"train.sh-{job['id']}.out").read_text() == "name=train.sh\n"
    assert not (project / f"job-{job['id']}-{job['id']}.out").exists()
    result, _ = submitted(node, alice, project, None, "--wrap", 'echo "name=$SLURM_JOB_NAME"')
    job = node.wait_state(result["job_id"], {"completed", "failed"})
    assert job["state"] == "completed" and job["name"] == "wrap", job
    assert (project / f"slurm-{job['id']}.out").read_text() == "name=wrap\n"


def test_a_job_stopped_at_its_time_limit_keeps_what_it_prints_while_stopping(node, alice, project):
    script = ("#!/bin/bash\n#SBATCH --time=0:02 --output=limit-%j.out\n"
              "trap 'echo \"got TERM\"; exit 143' TERM\necho started\nsleep 30 &\nwait\n")
    result, _ = submitted(node, alice, project, script)
    job = node.wait_state(result["job_id"], {"completed", "failed"}, timeout_s=30)
    assert job["state"] == "failed" and "time limit" in job["reason"]
    assert (project / f"limit-{job['id']}.out").read_text() == "started\ngot TERM\n"


def test_in_a_container_job_srun_and_scontrol_work_and_the_output_file_is_written(alice):
    from tests.support.images import busybox_image, podman_missing

    if podman_missing():
        pytest.skip(podman_missing())
    gpus = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 1}]
    with busybox_image() as image, running_node(gpus, CONTAINERS={"enabled": True, "images": [image]}) as cnode:
        def staged() -> dict:
            with cnode.client() as c:
                return next((n.get("containers") or {} for n in c.nodes()), {}).get("staged") or {}

        wait_for("the image to be staged", lambda: image in staged(), timeout_s=120)
        script = (f"#!/bin/sh\n#SBATCH -J in-ctr --gres=gpu:1 -o ctr-%j.out\n#MTGPU container={image}\n"
                  "echo \"name=$SLURM_JOB_NAME gpus=$SLURM_GPUS_ON_NODE\"\n"
                  "srun -l sh -c 'echo step $SLURM_PROCID cuda=$CUDA_VISIBLE_DEVICES'\nscontrol show hostnames\n")
        result, _ = submitted(cnode, alice, Path(alice.home), script)
        job = cnode.wait_state(result["job_id"], {"completed", "failed"}, timeout_s=60)
        assert job["state"] == "completed", job
        expected = "name=in-ctr gpus=1\n0: step 0 cuda=0\nnode-a\n"  # its one GPU is device 0 inside
        assert log_of(cnode, alice, job["id"]) == expected
        assert (Path(alice.home) / f"ctr-{job['id']}.out").read_text() == expected


def test_afterok_waits_for_its_parent_and_is_cancelled_when_the_parent_fails(node, alice, project):
    """Queue dependencies (--dependency, #MTGPU after=): afterok starts only once its parent
    completed, saying what it waits for meanwhile; a failed parent cancels it, with the
    reason; afternotok runs after that failure."""
    flag = project / "go-parent"
    gate = f"#!/bin/bash\n#SBATCH -c 1\nwhile [ ! -e {flag} ]; do sleep 0.1; done\nexit $(cat {flag})\n"
    parent = submitted(node, alice, project, gate)[0]["job_id"]
    wait_for("the parent to run", lambda: node.job(parent)["state"] == "running", timeout_s=30)
    child = submitted(node, alice, project, f"#!/bin/bash\n#SBATCH -c 1\n#SBATCH --dependency=afterok:{parent}\n"
                                            "echo child-ran\n")[0]["job_id"]
    waiting = wait_for("the child's reason", lambda: (j := node.job(child))["reason"] and j, timeout_s=30)
    assert waiting["state"] == "queued" and waiting["reason"] == f"waiting for job {parent} (running)", waiting
    # squeue's habit: the pending ones, in squeue's format
    r = node.mt_job(alice, "list", "-t", "PD", "-o", "%i %t %R", "-h")
    assert r.returncode == 0 and r.stdout.strip() == f"{child} PD (waiting for job {parent} (running))", r
    flag.write_text("0")
    done = node.wait_state(child, {"completed", "failed", "cancelled"}, timeout_s=60)
    assert done["state"] == "completed" and "child-ran" in log_of(node, alice, child), done
    assert done["started_at"] >= node.job(parent)["ended_at"]

    flag.unlink()
    parent = submitted(node, alice, project, gate)[0]["job_id"]
    ok_child = submitted(node, alice, project, f"#!/bin/bash\n#MTGPU cpus=1 after=afterok:{parent}\necho no\n")[0]
    notok_child = submitted(node, alice, project, f"#!/bin/bash\n#SBATCH -c 1 -d afternotok:{parent}\n"
                                                  "echo after-the-failure\n")[0]
    flag.write_text("3")
    assert node.wait_state(parent, {"completed", "failed"}, timeout_s=60)["state"] == "failed"
    cancelled = node.wait_state(ok_child["job_id"], {"completed", "failed", "cancelled"}, timeout_s=60)
    assert cancelled["state"] == "cancelled", cancelled
    assert cancelled["reason"] == f"dependency afterok:{parent} can never be met: job {parent} ended failed"
    ran = node.wait_state(notok_child["job_id"], {"completed", "failed", "cancelled"}, timeout_s=60)
    assert ran["state"] == "completed" and "after-the-failure" in log_of(node, alice, notok_child["job_id"])
    r = submit(node, alice, project, "#!/bin/bash\n#SBATCH --dependency=afterok:999999\ntrue\n")
    assert r.returncode != 0 and "you have no job 999999" in r.stderr, r.stderr

"""#SBATCH scripts run as they are: the translator (jobfile/sbatch.py) over a corpus of
scripts in the styles labs write, its refusals and warnings, the output file patterns,
the Slurm variables a job sees, mt-job's sbatch flags, and our srun/scontrol."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtgpu.agent.runners.base import SLURM_BIN_DIR
from mtgpu.jobfile import SBATCH_OVERRIDE, SBATCH_SCRIPT, JobFileError, parse_job_file, read_job_file
from mtgpu.jobfile.patterns import PatternValues, expand_pattern, pattern_problem
from mtgpu.jobfile.sbatch import OPTION_NAMES, cli_option_length, slurm_size_bytes, slurm_time_s
from mtgpu.model.job import ArraySpec, GpuAlternative, GpuSlot, Job, JobSpec, NodeAllocation
from mtgpu.server.member.jobenv import job_env, output_paths, slurm_env, step_output_env

CORPUS = Path(__file__).resolve().parent.parent / "sbatch_corpus"
SCRIPTS = sorted(CORPUS.glob("*.sbatch"))


def sbatch(*lines: str, body: str = "python train.py\n", overrides: dict | None = None):
    return read_job_file("#!/bin/bash\n" + "".join(f"#SBATCH {x}\n" for x in lines) + body, overrides)


def refusal(*lines: str, body: str = "python train.py\n", overrides: dict | None = None) -> JobFileError:
    with pytest.raises(JobFileError) as info:
        sbatch(*lines, body=body, overrides=overrides)
    return info.value


def expected_spec(text: str, fields: dict) -> JobSpec:
    d = {**JobSpec().to_dict(), "slurm": True, **fields, "script": text}  # every corpus script is a Slurm one
    d["gpus"] = [{"vendor": None, "model": None, **g} for g in d["gpus"]]
    return JobSpec.from_dict(d)


# ---------------------------------------------------------------- the corpus


def test_the_corpus_has_the_styles_labs_write():
    assert 15 <= len(SCRIPTS) <= 30
    texts = [p.read_text() for p in SCRIPTS]
    assert any(" -c " in t or "-c4" in t for t in texts) and any("--cpus-per-task" in t for t in texts)
    assert any("%" in t and "--array" in t for t in texts)
    assert any("--gres=gpu:1" in t for t in texts) and any("--gres=gpu:a100" in t for t in texts)
    assert any("\nsrun " in t for t in texts) and any("$SLURM_ARRAY_TASK_ID" in t for t in texts)
    assert any("  # " in t for t in texts)  # comments after directives


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_corpus_script_translates_to_the_expected_request(path):
    text = path.read_text()
    expected = json.loads(path.with_suffix(".json").read_text())
    if "refused" in expected:
        want = expected["refused"]
        with pytest.raises(JobFileError) as info:
            read_job_file(text)
        e = info.value
        assert (e.line, e.directive, e.value) == (want["line"], want["directive"], want["value"]), str(e)
        assert want["problem"] in e.problem
        return
    parsed = read_job_file(text)
    assert parsed.spec == expected_spec(text, expected["spec"])
    assert len(parsed.warnings) == len(expected["warnings"]), parsed.warnings
    for warning, fragment in zip(parsed.warnings, expected["warnings"]):
        assert fragment in warning


# ---------------------------------------------------------------- values


@pytest.mark.parametrize("text, seconds", [
    ("30", 1800), ("90", 5400), ("10:30", 630), ("1:00:00", 3600), ("36:00:00", 129600),
    ("2-0", 172800), ("1-12", 129600), ("1-12:30", 131400), ("1-00:00:01", 86401), ("0-06:00", 21600),
])
def test_every_slurm_time_format(text, seconds):
    assert slurm_time_s(text) == seconds
    assert sbatch(f"--time={text}").spec.time_limit_s == seconds


@pytest.mark.parametrize("text", ["UNLIMITED", "infinite", "0", "0:00"])
def test_unlimited_and_zero_time_mean_no_limit_as_in_slurm(text):
    assert slurm_time_s(text) is None
    assert sbatch(f"--time={text}").spec.time_limit_s is None


@pytest.mark.parametrize("text", ["2h", "1:2:3:4", "-5", "1-", "abc", ""])
def test_bad_times_are_refused_with_the_slurm_formats(text):
    e = refusal(f"--time={text}")
    assert e.directive == "--time" and "days-hours:minutes:seconds" in e.problem


@pytest.mark.parametrize("text, n_bytes", [
    ("4000", 4000 << 20), ("16G", 16 << 30), ("16g", 16 << 30), ("512M", 512 << 20), ("1T", 1 << 40),
    ("2048K", 2 << 20), ("16GB", 16 << 30),
])
def test_memory_default_unit_is_megabytes_and_suffixes_are_1024_based(text, n_bytes):
    assert slurm_size_bytes(text) == n_bytes
    assert sbatch(f"--mem={text}").spec.mem_bytes == n_bytes


def test_memory_per_cpu_and_per_gpu_are_multiplied_out():
    assert sbatch("--cpus-per-task=8", "--mem-per-cpu=2G").spec.mem_bytes == 16 << 30
    assert sbatch("--mem-per-cpu=3G").spec.mem_bytes == 3 << 30  # one CPU, as sbatch gives a task
    assert sbatch("--gres=gpu:4", "--mem-per-gpu=20G").spec.mem_bytes == 80 << 30
    assert sbatch("--gres=gpu:2", "--cpus-per-gpu=6").spec.cpus == 12


def test_memory_options_are_exclusive_and_per_gpu_needs_gpus():
    e = refusal("--mem=8G", "--mem-per-cpu=2G")
    assert e.directive == "--mem-per-cpu" and "cannot both be given" in e.problem
    assert "asks for no GPU" in refusal("--mem-per-gpu=8G").problem
    assert "asks for no GPU" in refusal("--cpus-per-gpu=4").problem
    assert "cannot both" in refusal("-c 4", "--cpus-per-gpu=2", "--gres=gpu:1").problem


def test_mem_zero_is_no_memory_request_with_a_warning():
    parsed = sbatch("--mem=0")
    assert parsed.spec.mem_bytes is None
    assert len(parsed.warnings) == 1 and "--mem=0" in parsed.warnings[0] and "reserves none" in parsed.warnings[0]


@pytest.mark.parametrize("option, gpus", [
    ("--gres=gpu", (GpuAlternative(1),)),
    ("--gres=gpu:3", (GpuAlternative(3),)),
    ("--gres=gpu:a100:2", (GpuAlternative(2, model="a100"),)),
    ("--gres=gpu:A100:2", (GpuAlternative(2, model="a100"),)),
    ("--gres=gpu:rtx4090:1", (GpuAlternative(1, model="rtx4090"),)),
    ("--gres=gpu:v100", (GpuAlternative(1, model="v100"),)),
    ("--gres=gpu:tesla:2", (GpuAlternative(2, vendor="nvidia"),)),
    ("--gres=gpu:nvidia:1", (GpuAlternative(1, vendor="nvidia"),)),
    ("--gres=gpu:0", ()),
    ("--gres=none", ()),
    ("--gpus=2", (GpuAlternative(2),)),
    ("-G 2", (GpuAlternative(2),)),
    ("--gpus=h100:4", (GpuAlternative(4, model="h100"),)),
    ("--gpus-per-node=l40s:2", (GpuAlternative(2, model="l40s"),)),
    ("--gpus-per-task=1", (GpuAlternative(1),)),
])
def test_gpu_options_map_to_our_models_case_insensitively(option, gpus):
    assert sbatch(option).spec.gpus == gpus


def test_gpu_counts_are_per_node():
    two = sbatch("--nodes=2", "--gres=gpu:a100:4").spec
    assert (two.nodes, two.gpus) == (2, (GpuAlternative(4, model="a100"),))
    assert sbatch("--nodes=2", "--gpus=8").spec.gpus == (GpuAlternative(4),)
    assert sbatch("--nodes=2", "--ntasks=2", "--gpus-per-task=2").spec.gpus == (GpuAlternative(2),)
    e = refusal("--nodes=2", "--gpus=3")
    assert e.directive == "--gpus" and "evenly" in e.problem


def test_gpu_options_that_agree_are_accepted_and_ones_that_disagree_refused():
    assert sbatch("--gres=gpu:2", "--gpus-per-node=a100:2").spec.gpus == (GpuAlternative(2, model="a100"),)
    e = refusal("--gres=gpu:2", "--gpus-per-node=4")
    assert e.directive == "--gpus-per-node" and "--gres=gpu:2" in e.problem
    assert "keep one" in refusal("--gres=gpu:a100:1", "--gpus=h100:1").problem


@pytest.mark.parametrize("option, fragment", [
    ("--gres=shard:2", "only GPUs"),
    ("--gres=gpu:1,mps:50", "only GPUs"),
    ("--gres=gpu:a100:1,gpu:v100:1", "one GPU type"),
    ("--gpus=a100:1,v100:1", "one GPU type"),
    ("--gres=gpu:a100:x", "whole number"),
    ("--gres=gpu:???:1", "not a GPU model"),
])
def test_gpu_requests_we_cannot_express_are_refused(option, fragment):
    assert fragment in refusal(option).problem


# ---------------------------------------------------------------- tasks, nodes, placement


def test_one_task_per_node_is_the_plain_case():
    spec = sbatch("--nodes=2", "--ntasks=2", "-c 8", body="srun python train.py\n").spec
    assert (spec.nodes, spec.cpus) == (2, 8)
    assert sbatch("--ntasks-per-node=1", "--nodes=3").spec.nodes == 3


def test_more_tasks_per_node_with_srun_is_refused_naming_the_launcher_line():
    e = refusal("--ntasks=4", "--gpus-per-task=1", body="echo start\nsrun python train.py\n")
    assert (e.line, e.directive, e.value) == (2, "--ntasks", "4")
    assert "line 5 starts tasks with srun" in e.problem and "torchrun --nproc-per-node=4" in e.problem
    assert "mpirun" in refusal("-n 8", body="mpirun -np 8 ./solver\n").problem


def test_more_tasks_per_node_without_a_launcher_sizes_the_request_with_a_warning():
    parsed = sbatch("--ntasks=4", "--gpus-per-task=1", "--cpus-per-task=2", body="python one_process.py\n")
    assert (parsed.spec.gpus, parsed.spec.cpus) == ((GpuAlternative(4),), 8.0)
    assert len(parsed.warnings) == 1 and "--ntasks=4 is accepted as a size" in parsed.warnings[0]


def test_uneven_or_ranged_counts_are_refused():
    assert "evenly" in refusal("--nodes=2", "--ntasks=3").problem
    assert "disagrees" in refusal("--nodes=2", "--ntasks=2", "--ntasks-per-node=2").problem
    assert "range" in refusal("--nodes=2-4").problem
    assert sbatch("--nodes=2-2").spec.nodes == 2


def test_nodelist_with_one_node_pins_it_and_with_several_is_refused():
    assert sbatch("--nodelist=gpu-node-3").spec.server == "gpu-node-3"
    assert sbatch("-w node[07]").spec.server == "node07"
    for value in ("a,b", "gpu[1-2]"):
        e = refusal(f"--nodelist={value}")
        assert e.directive == "--nodelist" and "several nodes" in e.problem
    assert "cannot all run on the one node" in refusal("--nodes=2", "-w a").problem
    assert "file" in refusal("--nodelist=/home/alice/nodes.txt").problem


@pytest.mark.parametrize("line, directive, fragment", [
    ("--dependency=singleton", "--dependency", "'singleton' is not a dependency kind we have"),
    ("-d afterok:3?afterany:4", "--dependency", "either-or dependencies ('?') are not available"),
    ("--dependency=after:3", "--dependency", "use afterok, afternotok, afterany"),
    ("--exclude=gpu[1-2", "--exclude", "write node names"),
    ("--hold", "--hold", "holding"),
    ("--begin=now+1hour", "--begin", "later start"),
    ("--open-mode=append", "--open-mode", "appending"),
    ("--export=NONE,FOO=1", "--export", "ALL or NONE"),
    ("--wrap=hostname", "--wrap", "mt-job submit --wrap"),
    ("--input=data.txt", "--input", "/dev/null"),
    ("--ntasks-per-gpu=2", "--ntasks-per-gpu", "cannot be expressed"),
    ("--container=/bundles/x", "--container", "container=IMAGE"),
])
def test_options_that_would_change_the_result_are_refused_naming_them(line, directive, fragment):
    e = refusal(line)
    assert e.line == 2 and e.directive == directive and fragment in e.problem
    assert str(e).startswith(f"line 2: {directive}")


def test_options_without_meaning_here_give_one_warning_line_each():
    parsed = sbatch("--partition=gpu", "-p gpu", "--qos=normal", "--account=lab", "--mail-type=ALL",
                    "--mail-user=a@b.c", "--exclusive", "--constraint=a100", "--reservation=r", "--comment=x",
                    "--nice=10", "--signal=USR1@60", "--time-min=10", "-W", "--parsable", "--export=ALL")
    options = ["--partition=gpu", "--qos", "--account", "--mail-type", "--mail-user", "--exclusive",
               "--constraint", "--reservation", "--comment", "--nice", "--signal", "--time-min", "--wait",
               "--parsable", "--export=ALL"]
    assert len(parsed.warnings) == len(options)  # -p and --partition: one option, one line
    for warning, option in zip(parsed.warnings, options):
        assert option in warning and "\n" not in warning and warning.startswith("line ")
    assert all("accepted but" in w for w in parsed.warnings)


def test_chdir_requeue_and_begin_now():
    spec = sbatch("-D /scratch/run", "--no-requeue", "--begin=now", "--input=/dev/null").spec
    assert (spec.workdir, spec.requeue) == ("/scratch/run", False)
    assert sbatch("--no-requeue", "--requeue").spec.requeue is True  # the last one wins
    assert sbatch("--workdir=rel/dir").spec.workdir == "rel/dir"  # made absolute at submit


# ---------------------------------------------------------------- how lines and options are read


def test_long_short_equals_space_attached_and_prefix_forms_mean_the_same():
    forms = [("--cpus-per-task=4",), ("--cpus-per-task", "4"), ("-c", "4"), ("-c4",), ("--cpus-per-t=4",)]
    for form in forms:
        assert sbatch(" ".join(form)).spec.cpus == 4
    assert sbatch("--job-name 'two words'").spec.name == "two words"
    assert sbatch('--job-name="a #1"').spec.name == "a #1"  # a quoted # is no comment
    assert sbatch(r"--job-name=a\ b").spec.name == "a b"


def test_ambiguous_prefixes_and_unknown_options_are_refused():
    e = refusal("--mem-per=4G")
    assert "ambiguous" in e.problem and "--mem-per-cpu" in e.problem and "--mem-per-gpu" in e.problem
    e = refusal("--partitoin=gpu")
    assert e.directive == "--partitoin" and "did you mean --partition?" in e.problem
    assert refusal("-Z").directive == "-Z"
    assert "heterogeneous" in refusal("hetjob").problem
    assert "is not an option" in refusal("gres=gpu:1").problem


def test_values_missing_or_unexpected():
    assert "needs a value" in refusal("--time").problem
    assert "needs a value" in refusal("-t").problem
    assert "takes no value" in refusal("--requeue=yes").problem


def test_block_rule_is_slurms_and_late_lines_are_warned_about():
    text = "#!/bin/bash\n\n  # indented comment\n#SBATCH -c 2\necho hi\n#SBATCH -c 8\n"
    parsed = read_job_file(text)
    assert parsed.spec.cpus == 2
    assert parsed.warnings == ("line 6: #SBATCH after the script's first command is ignored, as sbatch ignores "
                               "it; move it up to the comment block at the top",)
    assert read_job_file("#!/bin/bash\n #SBATCH -c 2\n").spec.cpus is None  # not in column 1
    assert read_job_file("#!/bin/bash\n#SBATCHx -c 2\n").spec.cpus is None


def test_late_mtgpu_lines_are_warned_about_too():
    parsed = read_job_file("#!/bin/bash\n#MTGPU cpus=2\nrun\n#MTGPU cpus=9\n")
    assert parsed.spec.cpus == 2 and parsed.warnings[0].startswith("line 4: #MTGPU after")


def test_repeated_option_last_one_wins():
    assert sbatch("-c 2", "--cpus-per-task=6").spec.cpus == 6


def test_errors_on_translated_values_name_the_sbatch_option():
    e = refusal("--job-name=" + "x" * 300)
    assert e.directive == "--job-name" and e.line == 2 and "label" in e.problem
    e = refusal("--output=logs/%q.out")
    assert e.directive == "--output" and "%q is not one of Slurm's filename patterns" in e.problem


# ---------------------------------------------------------------- #MTGPU and #SBATCH together


def test_mtgpu_wins_per_key_with_a_warning_and_sbatch_keys_still_apply():
    text = "#!/bin/bash\n#SBATCH --gres=gpu:2 --time=1:00:00 -J from-sbatch\n#MTGPU gpus=h200:1 name=from-mtgpu\nrun\n"
    parsed = read_job_file(text)
    assert parsed.spec.gpus == (GpuAlternative(1, model="h200"),) and parsed.spec.name == "from-mtgpu"
    assert parsed.spec.time_limit_s == 3600
    assert parsed.warnings == (
        "line 3: #MTGPU gpus=h200:1 wins over #SBATCH --gres=gpu:2 (line 2), which asks for something else",
        "line 3: #MTGPU name=from-mtgpu wins over #SBATCH --job-name=from-sbatch (line 2), which asks for "
        "something else",
    )


def test_the_same_request_in_both_forms_is_no_conflict():
    text = "#!/bin/bash\n#SBATCH --time=90 --mem=32G\n#MTGPU time=1:30:00 mem=32G\nrun\n"
    assert read_job_file(text).warnings == ()


def test_a_script_without_sbatch_lines_is_unchanged():
    text = "#!/bin/bash\n#MTGPU gpus=1\npython x.py\n"
    parsed = read_job_file(text)
    assert parsed.warnings == () and parsed.spec.output is None and parsed.spec == parse_job_file(text)


def test_sbatch_script_writes_slurms_default_output_file_unless_told():
    assert sbatch("-c 1").spec.output == "slurm-%j.out"
    assert sbatch("--array=0-3").spec.output == "slurm-%A_%a.out"
    assert sbatch("-e err.txt").spec.output == "slurm-%j.out"
    mixed = "#!/bin/bash\n#SBATCH -c 1\n#MTGPU output=mine.txt\nrun\n"
    assert read_job_file(mixed).spec.output == "mine.txt" and read_job_file(mixed).warnings == ()


def test_a_job_without_a_name_is_named_as_sbatch_names_it_and_percent_x_follows():
    named = lambda text, source, **o: read_job_file(text, {SBATCH_SCRIPT: source, **o}).spec  # noqa: E731
    slurm = "#!/bin/bash\n#SBATCH -o %x-%j.out\nrun\n"
    spec = named(slurm, "train.sh")
    assert (spec.name, spec.output) == ("train.sh", "%x-%j.out")
    job = make_job(spec_extra={"name": spec.name, "output": spec.output})
    assert output_paths(job, 0, "node-a", "alice")[0] == "train.sh-42.out"  # not job-42-42.out
    assert named(slurm, "-").name == "sbatch"  # a script on standard input, as sbatch names it
    assert named(slurm, "train.sh", name="mine").name == "mine"  # a name given wins
    assert named("#!/bin/bash\n#SBATCH -J sweep\nrun\n", "train.sh").name == "sweep"
    assert named("#!/bin/bash\n#MTGPU name=n1\n#SBATCH -c 1\nrun\n", "train.sh").name == "n1"
    assert named("#!/bin/bash\n#MTGPU gpus=1\nrun\n", "train.sh").name == ""  # no Slurm job: job-ID
    assert named("#!/bin/bash\nrun\n", "a.sh", **{SBATCH_OVERRIDE: '["-c", "2"]'}).name == "a.sh"
    assert named(slurm, "x" * 300).name == ""  # no usable label: job-ID, never a refusal


def test_wrap_is_a_slurm_job_named_wrap_writing_slurm_jobid_out():
    spec = read_job_file("#!/bin/bash\ntrue\n", {SBATCH_SCRIPT: "--wrap"}).spec
    assert (spec.name, spec.output, spec.slurm) == ("wrap", "slurm-%j.out", True)
    spec = read_job_file("#!/bin/bash\ntrue\n", {SBATCH_SCRIPT: "--wrap", "output": "o.txt", "name": "w"}).spec
    assert (spec.name, spec.output) == ("w", "o.txt")
    assert read_job_file("#!/bin/bash\ntrue\n", {SBATCH_OVERRIDE: '["-c", "1"]'}).spec.output == "slurm-%j.out"
    with pytest.raises(JobFileError, match="sbatch-script"):
        read_job_file("#!/bin/bash\ntrue\n", {SBATCH_SCRIPT: ""})


def test_command_line_sbatch_options_win_over_the_file():
    overrides = {SBATCH_OVERRIDE: json.dumps(["-c", "16", "--time=2:00:00"])}
    parsed = sbatch("-c 4", "--time=1:00:00", "--mem-per-cpu=1G", overrides=overrides)
    assert (parsed.spec.cpus, parsed.spec.time_limit_s, parsed.spec.mem_bytes) == (16, 7200, 16 << 30)
    text = "#!/bin/bash\n#MTGPU cpus=2\nrun\n"
    assert read_job_file(text, {SBATCH_OVERRIDE: '["-c", "6"]'}).spec.cpus == 6  # the command line wins
    assert read_job_file(text, {SBATCH_OVERRIDE: '["-c", "6"]', "cpus": "3"}).spec.cpus == 3
    e = refusal(overrides={SBATCH_OVERRIDE: '["--exclude=/etc/nodes"]'})
    assert e.line is None and str(e).startswith("command line: --exclude")
    assert refusal(overrides={SBATCH_OVERRIDE: "-c 4"}).directive == SBATCH_OVERRIDE


# ---------------------------------------------------------------- robustness

_OPTION_TEXT = st.one_of(
    st.sampled_from([f"--{n}" for n in OPTION_NAMES] + ["-c", "-N", "-n", "-t", "-J", "-o", "-a", "-G", "-w", "-p"]),
    st.text(max_size=6),
)
_VALUE_TEXT = st.one_of(
    st.sampled_from(["1", "0", "2-4", "gpu:a100:2", "gpu", "16G", "0-15%4", "1:00:00", "UNLIMITED", "%j.out",
                     "a,b", "n[1-3]", "'", '"', "#", "\\", "=", ":", "-1", "9" * 20, "ALL", "é"]),
    st.text(max_size=8),
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.tuples(_OPTION_TEXT, st.booleans(), _VALUE_TEXT), min_size=1, max_size=4), max_size=5),
       st.sampled_from(["python x.py\n", "srun python x.py\n", ""]))
def test_any_sbatch_lines_raise_only_job_file_error(lines, body):
    text = "#!/bin/bash\n" + "".join(
        "#SBATCH " + " ".join(f"{o}={v}" if eq else f"{o} {v}" for o, eq, v in line) + "\n" for line in lines) + body
    try:
        parsed = read_job_file(text)
    except JobFileError as e:
        assert str(e)
    else:
        assert parsed.spec.script == text and all("\n" not in w for w in parsed.warnings)


# ---------------------------------------------------------------- output file patterns


def test_filename_patterns_expand_as_slurms():
    v = PatternValues(job_id=120, array_job_id=117, array_index=3, name="train", user="alice", node="gpu-1")
    assert expand_pattern("%x-%A_%a.out", v) == "train-117_3.out"
    assert expand_pattern("%j %J %u %N %% %4a %n %t %s", v) == "120 120 alice gpu-1 % 0003 0 0 batch"
    assert expand_pattern(r"lit\%j.out", v) == "lit%j.out"  # a backslash turns replacements off
    plain = PatternValues(job_id=9, name="job-9")
    assert expand_pattern("%A_%a", plain) == "9_0"


@pytest.mark.parametrize("pattern, ok", [("a-%j.out", True), ("%%", True), ("%q", False), ("x%", False),
                                         ("", False), ("dir/", False), ("a\nb", False), ("%3a", True)])
def test_filename_pattern_check(pattern, ok):
    assert (pattern_problem(pattern) is None) == ok


# ---------------------------------------------------------------- Slurm's variables


def make_job(*, nodes=("node-a",), gpus=(0, 1), cpus=8.0, mem=32 << 30, array=None, index=None, parent=None,
             name="train", spec_extra=None, attempt=0) -> Job:
    spec = JobSpec(**{"name": name, "array": array, "submit_dir": "/home/alice/proj", "slurm": True,
                      **(spec_extra or {})})
    allocs = tuple(NodeAllocation(n, tuple(GpuSlot(i) for i in gpus), cpus, mem, "nvidia") for n in nodes)
    return Job(id=42, tenant="alice", uid=250001, gid=250001, spec=spec, allocations=allocs,
               array_index=index, array_parent=parent, attempt=attempt)


def test_a_job_sees_slurms_variables():
    env = slurm_env(make_job(), 0, "node-a", "alice", "/home/alice")
    assert env["SLURM_JOB_ID"] == env["SLURM_JOBID"] == "42"
    assert env["SLURM_JOB_NAME"] == "train" and env["SLURM_JOB_USER"] == "alice"
    assert (env["SLURM_NNODES"], env["SLURM_NODEID"], env["SLURM_PROCID"], env["SLURM_NTASKS"]) == ("1", "0", "0", "1")
    assert env["SLURM_JOB_NODELIST"] == "node-a" and env["SLURMD_NODENAME"] == "node-a"
    assert (env["SLURM_CPUS_PER_TASK"], env["SLURM_GPUS_ON_NODE"], env["SLURM_MEM_PER_NODE"]) == ("8", "2", "32768")
    assert env["SLURM_SUBMIT_DIR"] == "/home/alice/proj"
    assert "SLURM_ARRAY_TASK_ID" not in env


def test_array_tasks_see_the_array_variables():
    job = make_job(array=ArraySpec((0, 4, 8, 12), 2), index=8, parent=40)
    env = slurm_env(job, 0, "node-a", "alice", "/home/alice")
    assert (env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"]) == ("40", "8")
    assert (env["SLURM_ARRAY_TASK_COUNT"], env["SLURM_ARRAY_TASK_MIN"], env["SLURM_ARRAY_TASK_MAX"],
            env["SLURM_ARRAY_TASK_STEP"]) == ("4", "0", "12", "4")


def test_each_rank_of_a_multi_node_job_is_its_nodes_task():
    job = make_job(nodes=("m0", "m1", "m2"))
    env = slurm_env(job, 2, "m2", "alice", "/home/alice")
    assert (env["SLURM_NNODES"], env["SLURM_NODEID"], env["SLURM_PROCID"], env["SLURM_NTASKS"]) == ("3", "2", "2", "3")
    assert env["SLURM_JOB_NODELIST"] == "m0,m1,m2" and env["SLURM_TASKS_PER_NODE"] == "1(x3)"
    full = job_env(job, 2, "m2", "alice", "/home/alice", {"nvidia"}, ("10.0.0.1", 29500))
    assert full["PATH"].split(":")[0] == SLURM_BIN_DIR and full["MTGPU_NODE_RANK"] == "2"


def test_a_cpu_only_job_without_requests_sees_no_cpu_or_gpu_counts_but_zero_gpus():
    env = slurm_env(make_job(gpus=(), cpus=0.0, mem=0), 0, "node-a", "alice", "/home/alice")
    assert env["SLURM_GPUS_ON_NODE"] == "0"
    assert not {"SLURM_CPUS_PER_TASK", "SLURM_MEM_PER_NODE", "SLURM_JOB_GPUS"} & set(env)
    no_dir = make_job(spec_extra={"submit_dir": None, "workdir": "/w"})
    assert slurm_env(no_dir, 0, "node-a", "alice", "/home/alice")["SLURM_SUBMIT_DIR"] == "/w"


def test_output_files_are_rank_zeros_and_expanded_on_its_node():
    job = make_job(array=ArraySpec((0, 1)), index=1, parent=41,
                   spec_extra={"output": "logs/%x-%A_%a.out", "error": "logs/%x-%A_%a.err"})
    assert output_paths(job, 0, "node-a", "alice") == ("logs/train-41_1.out", "logs/train-41_1.err")
    assert output_paths(job, 1, "node-b", "alice") == (None, None)
    same = make_job(spec_extra={"output": "o-%j", "error": "o-%j"})
    assert output_paths(same, 0, "node-a", "alice") == ("o-42", None)  # both to one file
    assert output_paths(make_job(), 0, "node-a", "alice") == (None, None)


def test_the_other_ranks_steps_are_told_rank_zeros_output_file():
    two = make_job(nodes=("node-a", "node-b"), spec_extra={"output": "o-%x-%j-%N.out", "workdir": "/home/alice/p"})
    assert step_output_env(two, 1, "alice", "/home/alice") == {"MTGPU_STEP_OUTPUT": "/home/alice/p/o-train-42-node-a.out"}
    assert step_output_env(two, 0, "alice", "/home/alice") == {}  # rank 0's own steps write through its script
    assert job_env(two, 1, "node-b", "alice", "/home/alice", set())["MTGPU_STEP_OUTPUT"].endswith("-node-a.out")
    apart = make_job(nodes=("node-a", "node-b"), spec_extra={"output": "o.out", "error": "e.err"})
    assert step_output_env(apart, 1, "alice", "/home/alice") == {}
    assert step_output_env(make_job(spec_extra={"output": "o.out"}), 0, "alice", "/h") == {}


# ---------------------------------------------------------------- mt-job's flags


def test_mt_job_passes_sbatch_options_to_the_server_and_keeps_directive_flags():
    from mtgpu.cli.job import parse_directive_flags

    overrides, rest = parse_directive_flags(["-c", "4", "-J", "x y", "--gres=gpu:1", "--gpus", "2", "-t10",
                                             "--partition", "gpu", "job.sh"])
    assert rest == ["job.sh"] and overrides["gpus"] == "2"
    assert json.loads(overrides[SBATCH_OVERRIDE]) == ["-c", "4", "-J", "x y", "--gres=gpu:1", "-t10",
                                                      "--partition", "gpu"]
    assert parse_directive_flags(["-"]) == ({}, ["-"])
    assert cli_option_length(["--exclusive"], 0) == 1 and cli_option_length(["--nope"], 0) is None
    assert cli_option_length(["-vc", "3"], 0) == 2


# ---------------------------------------------------------------- srun and scontrol


def run_tool(tool: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {"PATH": f"{SLURM_BIN_DIR}:/usr/bin:/bin", "SLURM_NNODES": "1", "SLURM_NODEID": "0"}
    return subprocess.run(["/bin/sh", os.path.join(SLURM_BIN_DIR, tool), *args], env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=20)


def test_srun_runs_the_command_once_with_its_status():
    r = run_tool("srun", "sh", "-c", "echo task $SLURM_PROCID of $SLURM_NTASKS; exit 3")
    assert (r.returncode, r.stdout, r.stderr) == (3, "task 0 of 1\n", "")


def test_srun_accepts_common_options_and_names_the_ones_it_ignores():
    r = run_tool("srun", "-n", "1", "-N1", "--ntasks-per-node=1", "-u", "--mpi=none", "--cpu-bind=cores",
                 "--export=ALL,FOO=bar", "-l", "sh", "-c", "echo $FOO")
    assert r.returncode == 0 and r.stdout == "0: bar\n"
    assert r.stderr == "srun: warning: --cpu-bind=cores is ignored: the step runs with the job's resources on this node\n"
    r = run_tool("srun", "-c", "4", "--gres=gpu:1", "true", env={"SLURM_CPUS_PER_TASK": "4", "SLURM_GPUS_ON_NODE": "1"})
    assert (r.returncode, r.stderr) == (0, "")


def test_srun_on_a_node_beyond_the_asked_tasks_runs_nothing():
    r = run_tool("srun", "-N", "1", "echo", "x", env={"SLURM_NNODES": "2", "SLURM_NODEID": "1"})
    assert (r.returncode, r.stdout) == (0, "")
    r = run_tool("srun", "echo", "x", env={"SLURM_NNODES": "2", "SLURM_NODEID": "1"})
    assert r.stdout == "x\n"


def test_srun_on_another_rank_appends_its_steps_output_to_the_jobs_output_file(tmp_path):
    out = tmp_path / "slurm-42.out"
    out.write_text("rank 0 line\n")
    env = {"SLURM_NNODES": "2", "SLURM_NODEID": "1", "MTGPU_STEP_OUTPUT": str(out)}
    r = run_tool("srun", "-l", "sh", "-c", "echo on $SLURM_PROCID; echo oops >&2; exit 4", env=env)
    assert (r.returncode, r.stdout) == (4, "1: on 1\n1: oops\n")  # still in this rank's log
    assert out.read_text() == "rank 0 line\n1: on 1\n1: oops\n"
    r = run_tool("srun", "echo", "plain", env=env)
    assert (r.returncode, r.stdout) == (0, "plain\n") and out.read_text().endswith("1: oops\nplain\n")
    r = run_tool("srun", "echo", "x", env={**env, "SLURM_NODEID": "0"})  # rank 0's srun: its script's output
    assert out.read_text().endswith("plain\n")
    # A file this node does not reach (homes not shared): said once, the step still runs.
    away = {**env, "MTGPU_STEP_OUTPUT": str(tmp_path / "elsewhere/slurm-42.out"), "TMPDIR": str(tmp_path)}
    r = run_tool("srun", "echo", "here", env=away)
    assert (r.returncode, r.stdout) == (0, "here\n") and "is not reachable from this node (rank 1)" in r.stderr
    r = run_tool("srun", "echo", "again", env=away)
    assert (r.returncode, r.stdout, r.stderr) == (0, "again\n", "")


def test_srun_refuses_more_than_one_task_per_node():
    r = run_tool("srun", "-n", "4", "python", "x.py")
    assert r.returncode == 1 and "one task runs per node" in r.stderr
    r = run_tool("srun", "--ntasks-per-node=2", "true")
    assert r.returncode == 1 and "torchrun --nproc-per-node=2" in r.stderr


def test_scontrol_names_the_jobs_nodes_and_nothing_else():
    r = run_tool("scontrol", "show", "hostnames", env={"SLURM_JOB_NODELIST": "m0,m1"})
    assert (r.returncode, r.stdout) == (0, "m0\nm1\n")
    assert run_tool("scontrol", "show", "job", "3").returncode == 1


def test_the_tools_are_executable_by_everyone():
    for tool in ("srun", "scontrol"):
        assert os.stat(os.path.join(SLURM_BIN_DIR, tool)).st_mode & 0o555 == 0o555


def test_dependencies_become_after():
    assert sbatch("--dependency=afterok:12:13").spec.after == (("afterok", (12, 13)),)
    assert sbatch("-d afterany:3,afternotok:4").spec.after == (("afterany", (3,)), ("afternotok", (4,)))


def test_an_mtgpu_job_is_no_slurm_one_and_sees_no_slurm_variables():
    assert read_job_file("#!/bin/bash\n#MTGPU gpus=1\npython train.py\n").spec.slurm is False
    assert sbatch("--gres=gpu:1").spec.slurm is True


def test_an_mtgpu_jobs_environment_has_no_slurm_variables_and_no_srun():
    job = make_job(spec_extra={"slurm": False})
    env = job_env(job, 0, "node-a", "alice", "/home/alice", {"nvidia"})
    assert not [k for k in env if k.startswith("SLURM")] and SLURM_BIN_DIR not in env["PATH"]


def test_exclude_becomes_exclude_with_host_ranges_expanded():
    assert sbatch("--exclude=gpu[1-2],cpu-a").spec.exclude == ("cpu-a", "gpu1", "gpu2")
    assert read_job_file("#!/bin/bash\n#MTGPU exclude=b,a\ntrue\n").spec.exclude == ("a", "b")

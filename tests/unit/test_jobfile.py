"""The #MTGPU batch-file parser: every directive, its errors, overrides, and robustness."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtgpu.jobfile import (
    DIRECTIVES,
    MAX_ARRAY_INDICES,
    JobFileError,
    late_directive_lines,
    parse_array,
    parse_gpus,
    parse_job_file,
)
from mtgpu.model.job import ArraySpec, GpuAlternative, GpuMode, JobSpec


def script(*directive_lines: str, body: str = "python train.py\n") -> str:
    """A batch script with a shebang, the given #MTGPU lines, then a body."""
    return "#!/bin/bash\n" + "".join(f"#MTGPU {d}\n" for d in directive_lines) + body


def parse(*directive_lines: str, **overrides: str) -> JobSpec:
    return parse_job_file(script(*directive_lines), {k.replace("_", "-"): v for k, v in overrides.items()} or None)


def error_of(*directive_lines: str, overrides: dict | None = None) -> JobFileError:
    with pytest.raises(JobFileError) as info:
        parse_job_file(script(*directive_lines), overrides)
    return info.value


# ---------------------------------------------------------------- the design's example


def test_design_example_parses_to_the_expected_spec():
    text = (
        "#!/bin/bash\n"
        "#MTGPU gpus=rtx4090:1 vram=20G cpus=8 mem=32G\n"
        "#MTGPU gpu-mode=shared\n"
        "#MTGPU container=localhost/pytorch:2.6\n"
        "#MTGPU name=train-resnet\n"
        "python train.py --epochs 50\n"
    )
    spec = parse_job_file(text)
    assert spec.script == text
    assert spec.gpus == (GpuAlternative(1, model="rtx4090"),)
    assert spec.vram_bytes == 20 * 1024**3
    assert spec.cpus == 8
    assert spec.mem_bytes == 32 * 1024**3
    assert spec.gpu_mode is GpuMode.SHARED
    assert spec.container == "localhost/pytorch:2.6"
    assert spec.name == "train-resnet"


def test_a_script_without_directives_asks_for_nothing():
    spec = parse_job_file("#!/bin/sh\necho hi\n")
    assert spec == JobSpec(script="#!/bin/sh\necho hi\n")
    assert not spec.wants_gpu


# ---------------------------------------------------------------- gpus


@pytest.mark.parametrize(
    "value, expected",
    [
        ("2", (GpuAlternative(2),)),
        ("nvidia:1", (GpuAlternative(1, vendor="nvidia"),)),
        ("AMD:4", (GpuAlternative(4, vendor="amd"),)),
        ("intel:1", (GpuAlternative(1, vendor="intel"),)),
        ("h200:2", (GpuAlternative(2, model="h200"),)),
        ("RTX4090:1", (GpuAlternative(1, model="rtx4090"),)),
        ("a100:1|h100:1", (GpuAlternative(1, model="a100"), GpuAlternative(1, model="h100"))),
        ("a100:2 | nvidia:4", (GpuAlternative(2, model="a100"), GpuAlternative(4, vendor="nvidia"))),
        ("0.5", (GpuAlternative(0.5),)),
        ("t4:0.25", (GpuAlternative(0.25, model="t4"),)),
        ("0", ()),
        ("", ()),
        ("0.0", ()),
    ],
)
def test_gpus_forms(value, expected):
    assert parse_gpus(value) == expected


def test_gpu_model_names_are_normalized():
    assert parse_gpus("geforce-rtx-4090:1") == (GpuAlternative(1, model="rtx4090"),)


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("h200:x", "the count must be a number, e.g. gpus=h200:1 or gpus=0.5"),
        ("1.5", "must be whole"),
        ("h100:2.5", "must be whole"),
        ("h200", "needs a count, e.g. gpus=h200:1"),
        ("-1", "the count must be a number"),
        ("a100:1|", "empty"),
        ("nvidia:h100:1", "VENDOR:N or MODEL:N"),
        ("geforce:1", "not a GPU model or vendor"),
        ("h200:0", "write gpus=0"),
        ("0.001", "at least 0.01"),
        ("5000", "at most 1024"),
        ("1e3", "the count must be a number"),
        ("nan", "needs a count"),
    ],
)
def test_gpus_errors_say_what_is_allowed(value, fragment):
    with pytest.raises(JobFileError) as info:
        parse_gpus(value)
    assert fragment in str(info.value)
    assert info.value.directive == "gpus" and info.value.value == value and info.value.line is None


def test_fraction_implies_shared_mode():
    assert parse("gpus=0.5").gpu_mode is GpuMode.SHARED
    assert parse("gpus=a100:1|t4:0.25").gpu_mode is GpuMode.SHARED


def test_fraction_keeps_an_explicit_oversubscribe_mode():
    assert parse("gpus=0.5 gpu-mode=oversubscribe").gpu_mode is GpuMode.OVERSUBSCRIBE


def test_fraction_with_explicit_exclusive_mode_is_refused_on_the_mode_line():
    err = error_of("gpus=t4:0.25", "gpu-mode=exclusive")
    assert err.line == 3 and err.directive == "gpu-mode" and err.value == "exclusive"
    assert "gpu-mode=shared" in str(err) and str(err).startswith("line 3: gpu-mode=")


def test_whole_gpus_default_to_exclusive():
    assert parse("gpus=1").gpu_mode is GpuMode.EXCLUSIVE


# ---------------------------------------------------------------- the other directives


def test_sizes_and_numbers():
    spec = parse("gpus=1 vram=80GiB", "cpus=0.5 mem=512M")
    assert spec.vram_bytes == 80 * 1024**3
    assert spec.mem_bytes == 512 * 1024**2
    assert spec.cpus == 0.5


@pytest.mark.parametrize("mode", ["exclusive", "shared", "oversubscribe", "SHARED"])
def test_gpu_modes(mode):
    assert parse(f"gpus=1 gpu-mode={mode}").gpu_mode is GpuMode(mode.lower())


def test_placement_and_labels():
    spec = parse(
        "server=gpu-node-3 container=docker.io/library/python:3.12",
        "nodes=4 name='big run' priority=-20 time=1:30:00",
        "workdir=/home/mtgpu/alice/proj requeue=no",
    )
    assert spec.server == "gpu-node-3"
    assert spec.container == "docker.io/library/python:3.12"
    assert spec.nodes == 4
    assert spec.name == "big run"
    assert spec.priority == -20
    assert spec.time_limit_s == 5400
    assert spec.workdir == "/home/mtgpu/alice/proj"
    assert spec.requeue is False


@pytest.mark.parametrize("text, points", [("-0.005", -0.005), ("2.5", 2.5), ("+10", 10.0), ("-1000", -1000.0)])
def test_priority_takes_fractions_of_a_point(text, points):
    assert parse(f"priority={text}").priority == points


def test_requeue_defaults_to_yes():
    assert parse().requeue is True
    assert parse("requeue=yes").requeue is True


def test_the_nodes_requeue_default_applies_only_where_the_job_says_nothing():
    no = {"requeue": "no"}  # a node with JOB_REQUEUE = false
    assert parse_job_file(script(), None, no).requeue is False
    assert parse_job_file(script("requeue=yes"), None, no).requeue is True
    assert parse_job_file(script(), {"requeue": "yes"}, no).requeue is True
    assert parse_job_file("#!/bin/bash\n#SBATCH --requeue\ntrue\n", None, no).requeue is True
    assert parse_job_file("#!/bin/bash\ntrue\n", {"sbatch": '["--requeue"]'}, no).requeue is True
    assert parse_job_file("#!/bin/bash\n#SBATCH --no-requeue\ntrue\n", None, {"requeue": "yes"}).requeue is False


def test_time_bare_number_is_minutes_as_in_slurm():
    assert parse("time=90").time_limit_s == 90 * 60


@pytest.mark.parametrize(
    "value, expected",
    [
        ("0-9", ArraySpec(tuple(range(10)))),
        ("1,3,5", ArraySpec((1, 3, 5))),
        ("0-99%10", ArraySpec(tuple(range(100)), max_running=10)),
        ("1-3,7", ArraySpec((1, 2, 3, 7))),
        ("0-10:2", ArraySpec((0, 2, 4, 6, 8, 10))),
        ("7,1-3,2", ArraySpec((1, 2, 3, 7))),
        ("5", ArraySpec((5,))),
        (f"0-{MAX_ARRAY_INDICES - 1}", ArraySpec(tuple(range(MAX_ARRAY_INDICES)))),
    ],
)
def test_array_forms(value, expected):
    assert parse_array(value) == expected


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("9-0", "ends before it starts"),
        ("0-10:0", "step"),
        ("0-9%0", "at least 1"),
        ("0-9%x", "at least 1"),
        ("", "no indices"),
        ("a-b", "is not an index or range"),
        ("1,,2", "is not an index or range"),
        (f"0-{MAX_ARRAY_INDICES}", f"at most {MAX_ARRAY_INDICES}"),
        ("0-999999999", f"at most {MAX_ARRAY_INDICES}"),
        ("-1", "is not an index or range"),
    ],
)
def test_array_errors(value, fragment):
    with pytest.raises(JobFileError) as info:
        parse_array(value)
    assert fragment in str(info.value)
    assert info.value.directive == "array" and info.value.value == value


@pytest.mark.parametrize(
    "directive, fragment",
    [
        ("vram=lots", "a size such as"),
        ("vram=0", "more than 0"),
        ("mem=-1G", "a size such as"),
        ("cpus=0", "more than 0"),
        ("cpus=many", "positive number"),
        ("gpu-mode=private", "exclusive, shared, oversubscribe"),
        ("server=bad/node", "name one node"),
        ("container=", "name an image"),
        ("nodes=0", "from 1 to"),
        ("nodes=1.5", "whole number"),
        ("priority=5000", "from -1000 to 1000"),
        ("priority=0.0001", "at most 3 decimals"),
        ("priority=1e3", "at most 3 decimals"),
        ("time=soon", "a duration such as"),
        ("time=0", "a duration such as"),
        ("name=", "a label of 1 to 200"),
        ("workdir=", "a directory path"),
        ("requeue=maybe", "yes or no"),
    ],
)
def test_each_directive_error_names_line_directive_value_and_what_is_allowed(directive, fragment):
    key, _, value = directive.partition("=")
    lines = [directive] if key != "vram" else ["gpus=1", directive]
    err = error_of(*lines)
    assert err.line == 1 + len(lines)
    assert err.directive == key and err.value == value
    assert str(err).startswith(f'line {err.line}: {key}="{value}": ')
    assert fragment in str(err)


def test_vram_without_gpus_is_refused():
    err = error_of("vram=20G")
    assert err.directive == "vram" and "no GPU" in str(err)


def test_huge_time_values_are_a_job_file_error():
    err = error_of("time=" + "9" * 5000 + "-00:00")
    assert err.directive == "time"


# ---------------------------------------------------------------- the comment block and syntax


def test_directives_stop_at_the_first_command_as_slurm_does():
    text = "#!/bin/bash\n\n# a comment\n#MTGPU gpus=1\nmodule load cuda\n#MTGPU gpus=4\n"
    assert parse_job_file(text).gpus == (GpuAlternative(1),)
    assert late_directive_lines(text) == [6]


def test_spaced_and_glued_prefixes_are_plain_comments():
    assert parse_job_file("# MTGPU gpus=1\n#MTGPUgpus=1\n").gpus == ()


def test_indented_directives_count_and_crlf_is_tolerated():
    spec = parse_job_file("#!/bin/bash\r\n   #MTGPU gpus=2\r\n\t#MTGPU name=x\r\nrun\r\n")
    assert spec.gpus == (GpuAlternative(2),) and spec.name == "x"


def test_byte_order_mark_is_ignored():
    assert parse_job_file("\ufeff#MTGPU gpus=1\n").gpus == (GpuAlternative(1),)


def test_trailing_comment_and_hash_inside_a_value():
    spec = parse("name=run#3 cpus=2  # two cores please")
    assert spec.name == "run#3" and spec.cpus == 2


def test_duplicates_last_one_wins():
    assert parse("gpus=1", "gpus=h200:2").gpus == (GpuAlternative(2, model="h200"),)
    assert parse("cpus=1 cpus=3").cpus == 3


def test_keys_are_case_insensitive_and_underscore_means_dash():
    assert parse("GPU_MODE=shared gpus=1").gpu_mode is GpuMode.SHARED


def test_unknown_directive_lists_known_ones_and_suggests_closest():
    err = error_of("cpus=2", "gpu=1")
    assert err.line == 3 and err.directive == "gpu" and err.value == "1"
    assert "did you mean gpus?" in str(err)
    for name in DIRECTIVES:
        assert name in str(err)


def test_token_without_equals_is_reported_with_its_line():
    err = error_of("gpus=1", "--gpus 2")
    assert err.line == 3 and "key=value" in str(err)


def test_unclosed_quote_is_reported_with_its_line():
    err = error_of('name="oops')
    assert err.line == 2 and "quote" in str(err)


def test_error_survives_pickling():
    err = error_of("gpus=h200:x")
    again = pickle.loads(pickle.dumps(err))
    assert (again.line, again.directive, again.value, str(again)) == (err.line, err.directive, err.value, str(err))


def test_non_text_input_is_a_job_file_error():
    with pytest.raises(JobFileError):
        parse_job_file(b"#MTGPU gpus=1")  # type: ignore[arg-type]


# ---------------------------------------------------------------- overrides


def test_overrides_win_over_the_file():
    spec = parse_job_file(script("gpus=h200:2", "name=file"), {"gpus": "nvidia:1", "gpu-mode": "shared"})
    assert spec.gpus == (GpuAlternative(1, vendor="nvidia"),)
    assert spec.gpu_mode is GpuMode.SHARED
    assert spec.name == "file"


def test_override_fraction_conflicts_with_file_mode():
    err = error_of("gpu-mode=exclusive", overrides={"gpus": "0.5"})
    assert err.line == 2 and err.directive == "gpu-mode"


def test_override_errors_say_command_line():
    err = error_of(overrides={"gpus": "h200:x"})
    assert err.line is None
    assert str(err) == 'command line: gpus="h200:x": the count must be a number, e.g. gpus=h200:1 or gpus=0.5'


def test_unknown_override_is_reported():
    err = error_of(overrides={"gpuz": "1"})
    assert err.line is None and "did you mean gpus?" in str(err)


def test_unset_and_non_string_overrides():
    spec = parse_job_file(script("gpus=1"), {"gpus": None, "nodes": 2, "requeue": False, "gpu_mode": "shared"})
    assert spec.gpus == (GpuAlternative(1),) and spec.nodes == 2 and spec.requeue is False
    assert spec.gpu_mode is GpuMode.SHARED


def test_directives_mapping_is_ordered_read_only_help():
    assert list(DIRECTIVES)[:4] == ["gpus", "vram", "cpus", "mem"]
    assert {"workdir", "requeue", "gpu-mode", "array", "time"} <= set(DIRECTIVES)
    assert all(isinstance(h, str) and h and "\n" not in h for h in DIRECTIVES.values())
    with pytest.raises(TypeError):
        DIRECTIVES["x"] = "y"  # type: ignore[index]


# ---------------------------------------------------------------- robustness


def _only_job_file_errors(text: str, overrides=None) -> None:
    try:
        spec = parse_job_file(text, overrides)
    except JobFileError as exc:
        assert str(exc)
    else:
        assert spec.script == text


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.text())
def test_any_text_raises_only_job_file_error(text):
    _only_job_file_errors(text)


_KEYS = st.one_of(
    st.sampled_from(list(DIRECTIVES)),
    st.sampled_from(["GPUS", "gpu_mode", "gpu", "", "=", "x-y"]),
    st.text(max_size=8),
)
_FRAGMENTS = st.sampled_from(
    ["0", "1", "0.5", "1.5", "-3", "h200", "nvidia", "t4", ":", "|", "%", ",", "-", ".", "G", "GiB", "e9", "9" * 30,
     "shared", "exclusive", "yes", "'", '"', "#", " ", "\t", "\x00", "\u2028", "é"]
)
_VALUES = st.one_of(st.lists(_FRAGMENTS, max_size=6).map("".join), st.text(max_size=12))


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.lists(st.tuples(_KEYS, _VALUES), min_size=1, max_size=4), max_size=5),
    st.dictionaries(_KEYS, st.one_of(_VALUES, st.none(), st.integers(), st.booleans()), max_size=3),
)
def test_structured_directive_lines_raise_only_job_file_error(lines, overrides):
    text = "#!/bin/bash\n" + "".join("#MTGPU " + " ".join(f"{k}={v}" for k, v in line) + "\n" for line in lines)
    _only_job_file_errors(text, overrides)


@settings(max_examples=200)
@given(st.sampled_from(list(DIRECTIVES)), _VALUES)
def test_every_directive_value_raises_only_job_file_error(name, value):
    try:
        parse_job_file("", {name: value})
    except JobFileError as exc:
        assert exc.directive == name and exc.line is None

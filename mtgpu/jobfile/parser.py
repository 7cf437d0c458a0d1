"""The batch-file parser: `#MTGPU key=value` comment lines -> model.job.JobSpec.

Where directives are read, as Slurm reads `#SBATCH`: only in the script's
leading comment block. Lines are read from the top; blank lines and lines whose
first non-blank character is `#` (the shebang included) belong to the block; the
first other line ends it, and `#MTGPU` lines after it are ordinary comments
(`late_directive_lines` finds them so a CLI can warn). `# MTGPU` (with a space)
is an ordinary comment too, the usual way to switch a directive off.

How a directive line is written: `#MTGPU` then whitespace-separated `key=value`
tokens, several per line and over several lines. A value may be quoted with
single or double quotes (`name="my job"`; no backslash escapes). A token that
starts with `#` ends the line (a trailing comment). Keys are case-insensitive
and `_` may stand for `-` (`gpu_mode=shared`).

Duplicates: the last one wins, as with repeated Slurm options, so a later line
can refine an earlier one. Command-line overrides (`overrides=`) win over every
line of the file and get the same validation; their errors carry `line=None`.

Every problem is a `JobFileError` (a ValueError) whose message names the line,
the directive, the value and what is allowed; no other exception escapes.

`#SBATCH` lines (a Slurm script) are translated by sbatch.py into the same directives
and checked here; `read_job_file` says how the two meet and returns the warnings.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from mtgpu.jobfile import sbatch
from mtgpu.jobfile.after import parse_after
from mtgpu.jobfile.block import prefixed_lines, split_words
from mtgpu.jobfile.errors import JobFileError
from mtgpu.jobfile.patterns import pattern_problem
from mtgpu.model.gpu import VENDORS, normalize_model
from mtgpu.model.job import ArraySpec, GpuAlternative, GpuMode, JobSpec
from mtgpu.model.units import SIZE_HELP, UnitError, parse_duration, parse_size

DIRECTIVE_PREFIX = "#MTGPU"
MAX_ARRAY_INDICES = 100_000
MAX_GPUS_PER_ALTERNATIVE = 1024
MIN_GPU_FRACTION = 0.01
MAX_NODES = 10_000
MAX_CPUS = 100_000
PRIORITY_RANGE = (-1000, 1000)


class _Invalid(Exception):
    """Raised by a value parser with the problem text; the caller adds where it was."""


# ---------------------------------------------------------------- value parsers

_NUMBER_RE = re.compile(r"^(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)$")
_INT_RE = re.compile(r"^[+-]?[0-9]{1,12}$")
_PRIORITY_RE = re.compile(r"^[+-]?[0-9]{1,4}(?:\.[0-9]{1,3})?$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
_IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,511}$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def _gpu_count(text: str, kind: str | None) -> float:
    example = f"gpus={kind}:1 or gpus=0.5" if kind else "gpus=1 or gpus=0.5"
    if not _NUMBER_RE.match(text) or len(text) > 20:
        raise _Invalid(f"the count must be a number, e.g. {example}")
    count = float(text)
    if count == 0:
        raise _Invalid("a count of 0 asks for no GPU; write gpus=0 for a job without GPUs")
    if count < 1:
        if count < MIN_GPU_FRACTION:
            raise _Invalid(f"a share of a GPU must be at least {MIN_GPU_FRACTION:g}, e.g. gpus=0.25")
        return count
    if count != int(count):
        raise _Invalid(f"a count above one must be whole (fractions are shares of one GPU, below 1), e.g. {example}")
    if count > MAX_GPUS_PER_ALTERNATIVE:
        raise _Invalid(f"at most {MAX_GPUS_PER_ALTERNATIVE} GPUs can be asked for")
    return float(int(count))


def _gpu_alternative(text: str) -> GpuAlternative:
    parts = text.split(":")
    if len(parts) == 1:
        if parts[0][:1].isalpha():
            raise _Invalid(f"{parts[0]!r} needs a count, e.g. gpus={parts[0].lower()}:1")
        return GpuAlternative(count=_gpu_count(parts[0], None))
    if len(parts) != 2:
        raise _Invalid("write N, VENDOR:N or MODEL:N, e.g. gpus=2, gpus=nvidia:1 or gpus=h200:2")
    kind_text, count_text = parts[0].strip(), parts[1].strip()
    kind = kind_text.lower()
    count = _gpu_count(count_text, kind or None)
    if kind in VENDORS:
        return GpuAlternative(count=count, vendor=kind)
    model = normalize_model(kind)
    if not model:
        raise _Invalid(
            f"{kind_text!r} is not a GPU model or vendor; use a vendor ({', '.join(VENDORS)}) "
            "or a model such as rtx4090, a100 or h200"
        )
    return GpuAlternative(count=count, model=model)


def _parse_gpus(value: str) -> tuple[GpuAlternative, ...]:
    text = value.strip()
    if text == "" or (_NUMBER_RE.match(text) and len(text) <= 20 and float(text) == 0):
        return ()
    alternatives = []
    for alt in text.split("|"):
        alt = alt.strip()
        if not alt:
            raise _Invalid("an alternative between '|' is empty; write e.g. gpus=a100:1|h100:1")
        alternatives.append(_gpu_alternative(alt))
    return tuple(alternatives)


def _parse_size_value(value: str, what: str) -> int:
    try:
        n_bytes = parse_size(value.strip())
    except (UnitError, ValueError, OverflowError):
        raise _Invalid(f"{what} must be {SIZE_HELP}") from None
    if n_bytes <= 0:
        raise _Invalid(f"{what} must be more than 0, e.g. 20G")
    return n_bytes


def _parse_vram(value: str) -> int:
    return _parse_size_value(value, "the GPU memory per GPU")


def _parse_mem(value: str) -> int:
    return _parse_size_value(value, "the host memory")


def _parse_cpus(value: str) -> float:
    text = value.strip()
    if not _NUMBER_RE.match(text) or len(text) > 20:
        raise _Invalid("the number of CPU cores must be a positive number, e.g. cpus=8 or cpus=0.5")
    cpus = float(text)
    if cpus <= 0 or cpus > MAX_CPUS:
        raise _Invalid(f"the number of CPU cores must be more than 0 and at most {MAX_CPUS}, e.g. cpus=8")
    return cpus


def _parse_gpu_mode(value: str) -> GpuMode:
    try:
        return GpuMode(value.strip().lower())
    except ValueError:
        raise _Invalid(f"use one of {', '.join(m.value for m in GpuMode)}") from None


def _parse_server(value: str) -> str:
    text = value.strip()
    if not _NAME_RE.match(text):
        raise _Invalid("name one node: letters, digits, '.', '_' and '-', e.g. server=gpu-node-3")
    return text


def _parse_exclude(value: str) -> tuple[str, ...]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    bad = [n for n in names if not _NAME_RE.match(n)]
    if not names or bad:
        raise _Invalid("name nodes, separated by ',': letters, digits, '.', '_' and '-', e.g. exclude=gpu-1,gpu-2")
    if len(names) > MAX_NODES:
        raise _Invalid(f"at most {MAX_NODES} nodes")
    return tuple(sorted(set(names)))


def _parse_container(value: str) -> str:
    text = value.strip()
    if not _IMAGE_RE.match(text):
        raise _Invalid("name an image, e.g. container=localhost/pytorch:2.6 or container=docker.io/library/python:3.12")
    return text


def _parse_int(value: str, lo: int, hi: int, what: str, example: str) -> int:
    text = value.strip()
    if not _INT_RE.match(text):
        raise _Invalid(f"{what} must be a whole number from {lo} to {hi}, e.g. {example}")
    n = int(text)
    if not lo <= n <= hi:
        raise _Invalid(f"{what} must be from {lo} to {hi}, e.g. {example}")
    return n


def _parse_nodes(value: str) -> int:
    return _parse_int(value, 1, MAX_NODES, "the number of nodes", "nodes=2")


def _parse_priority(value: str) -> float:
    """Points, with up to three decimals: aging adds one point per hour waited, so a
    thousandth of a point is 3.6 seconds of waiting (docs/SCHEDULING.md)."""
    text = value.strip()
    lo, hi = PRIORITY_RANGE
    if not _PRIORITY_RE.match(text):
        raise _Invalid(f"the priority must be a number from {lo} to {hi} with at most 3 decimals, "
                       "e.g. priority=10 or priority=-0.5")
    points = float(text)
    if not lo <= points <= hi:
        raise _Invalid(f"the priority must be from {lo} to {hi}, e.g. priority=10")
    return points


_ARRAY_HELP = "write indices as 0-9, 1,3,5, 0-10:2 (step 2) or 1-3,7, optionally %N to run at most N at once (0-99%10)"
_ARRAY_PART_RE = re.compile(r"^([0-9]{1,9})(?:-([0-9]{1,9})(?::([0-9]{1,9}))?)?$")


def _parse_array(value: str) -> ArraySpec:
    text = value.strip()
    max_running = None
    if "%" in text:
        text, _, limit = text.rpartition("%")
        limit = limit.strip()
        if not re.fullmatch(r"[0-9]{1,9}", limit) or int(limit) < 1:
            raise _Invalid(f"the limit after % must be a whole number of at least 1; {_ARRAY_HELP}")
        max_running = int(limit)
    if not text.strip():
        raise _Invalid(f"no indices given; {_ARRAY_HELP}")
    indices: set[int] = set()
    for part in text.split(","):
        m = _ARRAY_PART_RE.match(part.strip())
        if not m:
            raise _Invalid(f"{part.strip()!r} is not an index or range; {_ARRAY_HELP}")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        step = int(m.group(3)) if m.group(3) is not None else 1
        if last < first:
            raise _Invalid(f"the range {part.strip()!r} ends before it starts; {_ARRAY_HELP}")
        if step < 1:
            raise _Invalid(f"the step in {part.strip()!r} must be at least 1; {_ARRAY_HELP}")
        if (last - first) // step + 1 > MAX_ARRAY_INDICES:
            raise _Invalid(f"an array has at most {MAX_ARRAY_INDICES} indices")
        indices.update(range(first, last + 1, step))
        if len(indices) > MAX_ARRAY_INDICES:
            raise _Invalid(f"an array has at most {MAX_ARRAY_INDICES} indices")
    return ArraySpec(indices=tuple(sorted(indices)), max_running=max_running)


def _parse_name(value: str) -> str:
    text = value.strip()
    if not text or len(text) > 200 or _CONTROL_RE.search(text):
        raise _Invalid("a label of 1 to 200 printable characters, e.g. name=train-resnet")
    return text


def _parse_time(value: str) -> float:
    try:
        return parse_duration(value.strip())
    except (UnitError, ValueError, OverflowError) as exc:
        # UnitError's text already says what is allowed; other errors come from absurd inputs.
        detail = str(exc) if isinstance(exc, UnitError) else "a duration such as 90, 2h or 1-12:00:00"
        raise _Invalid(f"the wall-clock limit must be {detail}") from None


def _parse_workdir(value: str) -> str:
    text = value.strip()
    if not text or len(text) > 4096 or _CONTROL_RE.search(text):
        raise _Invalid("a directory path, e.g. workdir=/home/mtgpu/alice/project (relative paths are the submitter's)")
    return text


_YES = {"yes", "true", "on", "1"}
_NO = {"no", "false", "off", "0"}


def _parse_requeue(value: str) -> bool:
    text = value.strip().lower()
    if text in _YES:
        return True
    if text in _NO:
        return False
    raise _Invalid("use yes or no")


def _parse_after(value: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    try:
        return parse_after(value.strip())
    except ValueError as e:
        raise _Invalid(str(e)) from None


def _parse_output(value: str) -> str:
    text = value.strip()
    problem = pattern_problem(text)
    if problem:
        raise _Invalid(problem)
    return text


@dataclass(frozen=True, slots=True)
class _Directive:
    help: str
    parse: Callable[[str], Any]
    field: str  # the JobSpec field it fills


_TABLE: dict[str, _Directive] = {
    "gpus": _Directive(
        "GPUs: N, VENDOR:N, MODEL:N, '|'-separated alternatives, or a share below 1 (0.5, t4:0.25)", _parse_gpus, "gpus"
    ),
    "vram": _Directive("minimum free GPU memory per GPU, e.g. 20G", _parse_vram, "vram_bytes"),
    "cpus": _Directive("CPU cores, e.g. 8 or 0.5", _parse_cpus, "cpus"),
    "mem": _Directive("host memory, e.g. 32G", _parse_mem, "mem_bytes"),
    "gpu-mode": _Directive("exclusive (default), shared or oversubscribe", _parse_gpu_mode, "gpu_mode"),
    "server": _Directive("run only on this node", _parse_server, "server"),
    "exclude": _Directive("never run on these nodes, e.g. exclude=gpu-1,gpu-2", _parse_exclude, "exclude"),
    "container": _Directive("run in this image (rootless Podman), e.g. localhost/pytorch:2.6", _parse_container, "container"),
    "nodes": _Directive("run the same command on N nodes at once, all or nothing", _parse_nodes, "nodes"),
    "array": _Directive("one job per index: 0-9, 1,3,5, 0-10:2, 0-99%10 (at most 10 at once)", _parse_array, "array"),
    "name": _Directive("a label for the job", _parse_name, "name"),
    "priority": _Directive(f"base priority in points, {PRIORITY_RANGE[0]} to {PRIORITY_RANGE[1]} (up to 3 decimals; "
                           "waiting adds 1 point an hour)", _parse_priority, "priority"),
    "time": _Directive("wall-clock limit, e.g. 90 (minutes), 2h or 1-12:00:00", _parse_time, "time_limit_s"),
    "workdir": _Directive("directory the job starts in", _parse_workdir, "workdir"),
    "requeue": _Directive("yes or no (default: the node's JOB_REQUEUE, yes unless set): put the job back in the queue "
                          "when it is interrupted (its node lost, its machine restarted)", _parse_requeue, "requeue"),
    "output": _Directive("also write the job's output to this file (relative: to workdir); %j job id, %A array id, "
                         "%a index, %x name, %u user, %N node", _parse_output, "output"),
    "error": _Directive("write the job's stderr to this file instead of output= (the job's log keeps both); "
                        "the same % patterns", _parse_output, "error"),
    "after": _Directive("start only when these jobs of yours have ended: afterok:ID[:ID] (completed), "
                        "afternotok:ID (failed), afterany:ID; several with ','", _parse_after, "after"),
}

DIRECTIVES: Mapping[str, str] = MappingProxyType({name: d.help for name, d in _TABLE.items()})
"""Directive name -> one-line help, in the order the CLI should offer `--name value` flags."""


# ---------------------------------------------------------------- public value parsers


def parse_gpus(value: str) -> tuple[GpuAlternative, ...]:
    """Parse a `gpus=` value; `()` means no GPU. Raises JobFileError (line=None)."""
    return _parse_one("gpus", value, None)


def parse_array(value: str) -> ArraySpec:
    """Parse an `array=` value into sorted, distinct indices. Raises JobFileError (line=None)."""
    return _parse_one("array", value, None)


def _parse_one(name: str, value: Any, line: int | None) -> Any:
    if not isinstance(value, str):
        raise JobFileError("the value must be text", line=line, directive=name, value=repr(value))
    try:
        return _TABLE[name].parse(value)
    except _Invalid as exc:
        raise JobFileError(str(exc), line=line, directive=name, value=value) from None


# ---------------------------------------------------------------- reading the file


@dataclass(frozen=True, slots=True)
class _Given:
    """One directive as written: where (line None = command line) and the raw value.
    `option`: the #SBATCH option it was translated from (--name=value), for messages."""

    name: str
    value: str
    line: int | None
    option: str | None = None

    def parse(self) -> Any:
        if self.option is None:
            return _parse_one(self.name, self.value, self.line)
        option, _, written = self.option.partition("=")
        try:
            return _parse_one(self.name, self.value, self.line)
        except JobFileError as e:
            raise JobFileError(e.problem, line=self.line, directive=option, value=written) from None


def _canonical_name(key: str) -> str:
    return key.strip().lower().replace("_", "-")


def _unknown_directive(key: str, value: str, line: int | None) -> JobFileError:
    close = difflib.get_close_matches(_canonical_name(key), list(_TABLE), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return JobFileError(
        f"unknown directive{hint}; known: {', '.join(_TABLE)}", line=line, directive=key, value=value
    )


def _directive_lines(text: str) -> tuple[list[tuple[int, str]], list[int]]:
    """The `#MTGPU` lines of the leading comment block (number, rest of line), and
    the numbers of `#MTGPU` lines found after the block (ignored, as Slurm does)."""
    return prefixed_lines(text, DIRECTIVE_PREFIX, at_column_one=False)


def late_directive_lines(text: str) -> list[int]:
    """Line numbers of `#MTGPU` lines after the leading comment block, which are
    ignored; a CLI can warn about them (the usual mistake is a directive below
    the first command)."""
    if not isinstance(text, str):
        return []
    return _directive_lines(text)[1]


def _given_from_text(text: str) -> dict[str, _Given]:
    given: dict[str, _Given] = {}
    for number, rest in _directive_lines(text)[0]:
        for token in split_words(rest, number, backslash=False, hash_inside_word=False):
            key, sep, value = token.partition("=")
            if not sep or not key.strip():
                raise JobFileError(
                    f"{token!r} is not key=value; write directives as key=value, e.g. gpus=1 cpus=4",
                    line=number,
                )
            name = _canonical_name(key)
            if name not in _TABLE:
                raise _unknown_directive(key, value, number)
            given[name] = _Given(name, value, number)  # the last one wins
    return given


def _given_from_overrides(overrides: Mapping[Any, Any]) -> dict[str, _Given]:
    given: dict[str, _Given] = {}
    try:
        items = list(overrides.items())
    except Exception:  # noqa: BLE001 - a caller passed something that is not a mapping
        raise JobFileError("overrides must be a mapping of directive name to value") from None
    for key, value in items:
        if value is None or key in (SBATCH_OVERRIDE, SBATCH_SCRIPT):
            continue  # an unset CLI flag; sbatch options (and the script's name) are read with the file's
        if not isinstance(key, str):
            raise JobFileError(f"override key {key!r} is not a directive name; known: {', '.join(_TABLE)}")
        if isinstance(value, bool):
            value = "yes" if value else "no"
        elif isinstance(value, (int, float)):
            value = str(value)
        elif not isinstance(value, str):
            raise JobFileError("the value must be text", directive=key, value=repr(value))
        name = _canonical_name(key)
        if name not in _TABLE:
            raise _unknown_directive(key, value, None)
        given[name] = _Given(name, value, None)
    return given


SBATCH_OVERRIDE = "sbatch"
"""The override key that carries sbatch options given on the command line (`mt-job submit
-c 4 --gres=gpu:1 job.sh`): a JSON list of the arguments, read like `#SBATCH` options that
come after the file's (so they win, as in sbatch)."""


SBATCH_SCRIPT = "sbatch-script"
"""The override key saying where the script came from, for sbatch's name of a job that has
none of its own: the script's file name (`mt-job submit train.sh`: the job is `train.sh`),
`-` for standard input (`sbatch`), `--wrap` for --wrap (`wrap`; a --wrap job is a Slurm
one, as `sbatch --wrap` is: it writes slurm-%j.out in the submit directory)."""
WRAP = "--wrap"


def _script_source(overrides: Mapping[Any, Any] | None) -> str | None:
    if not overrides or not isinstance(overrides, Mapping) or overrides.get(SBATCH_SCRIPT) is None:
        return None
    raw = overrides[SBATCH_SCRIPT]
    if not isinstance(raw, str) or not raw.strip():
        raise JobFileError("must be the script's file name, - (standard input) or --wrap",
                           directive=SBATCH_SCRIPT, value=str(raw))
    return raw


def sbatch_job_name(source: str) -> str | None:
    """The name sbatch gives a job of this script source that names none itself (None: a
    file name that is no usable label; the job then keeps job-ID)."""
    if source == WRAP:
        return "wrap"
    if source == "-":
        return "sbatch"
    name = source.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    try:
        return _parse_name(name)
    except _Invalid:
        return None


@dataclass(frozen=True, slots=True)
class ParsedJobFile:
    """A request, and what the submitter should hear about it (one line each)."""

    spec: JobSpec
    warnings: tuple[str, ...] = ()


def _sbatch_tokens(overrides: Mapping[Any, Any] | None) -> list[str]:
    if not overrides or not isinstance(overrides, Mapping) or overrides.get(SBATCH_OVERRIDE) is None:
        return []
    raw = overrides[SBATCH_OVERRIDE]
    try:
        tokens = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        tokens = None
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise JobFileError("must be a JSON list of sbatch command-line arguments, e.g. [\"-c\", \"4\"]",
                           directive=SBATCH_OVERRIDE, value=str(raw))
    return tokens


def _same_value(a: _Given, b: _Given) -> bool:
    try:
        return _parse_one(a.name, a.value, a.line) == _parse_one(b.name, b.value, b.line)
    except JobFileError:
        return False


def _merge_sbatch(given: dict[str, _Given], request: sbatch.SbatchRequest, warnings: list[str]) -> None:
    """#SBATCH values join the #MTGPU ones: where both set a directive the #MTGPU line wins
    (with a warning when they differ); an sbatch option from the command line wins over the
    file, as every command-line flag does."""
    for name in _TABLE:
        t = request.directives.get(name)
        if t is None:
            continue
        g = _Given(name, t.value, t.line, option=t.option)
        mine = given.get(name)
        if mine is None or t.line is None and not t.default:
            given[name] = g
        elif not t.default and not _same_value(mine, g):
            where = f"line {mine.line}" if mine.line is not None else "the command line"
            warnings.append(f"{where}: #MTGPU {name}={mine.value} wins over #SBATCH {t.option} (line {t.line}), "
                            f"which asks for something else")


def parse_job_file(text: str, overrides: Mapping[str, str] | None = None,
                   defaults: Mapping[str, str] | None = None) -> JobSpec:
    """Parse a batch script's `#MTGPU` (and `#SBATCH`) directives, then `overrides`, which
    win, into a JobSpec; `read_job_file` also returns the warnings.

    The whole text becomes `JobSpec.script`. Raises JobFileError and nothing else."""
    return read_job_file(text, overrides, defaults).spec


def read_job_file(text: str, overrides: Mapping[str, str] | None = None,
                  defaults: Mapping[str, str] | None = None) -> ParsedJobFile:
    """The request of a batch script and what to tell the submitter about it.

    `#MTGPU` lines, `#SBATCH` lines (translated by sbatch.py; where both set the same
    thing, `#MTGPU` wins, with a warning), then `overrides` (command-line flags, and
    sbatch options under SBATCH_OVERRIDE), which win over the file. `defaults`: directive
    values of the node's config (e.g. requeue from JOB_REQUEUE) for what none of those
    gives. Raises JobFileError and nothing else."""
    if not isinstance(text, str):
        raise JobFileError("the job file must be text (a shell script)")
    warnings: list[str] = []
    given = _given_from_text(text)
    for n in late_directive_lines(text):
        warnings.append(f"line {n}: #MTGPU after the script's first command is ignored; move it up to the "
                        "comment block at the top")
    source = _script_source(overrides)
    request = sbatch.translate(text, _sbatch_tokens(overrides), wrap=source == WRAP)
    warnings += request.warnings
    _merge_sbatch(given, request, warnings)
    if overrides:
        given.update(_given_from_overrides(overrides))
    for name, value in (defaults or {}).items():
        if name not in _TABLE:
            raise ValueError(f"{name!r} is no directive")  # a programming error, not the submitter's
        given.setdefault(name, _Given(name, value, None))

    # a Slurm script (#SBATCH lines, sbatch options given, or --wrap): it sees Slurm's variables and
    # srun, and a job that names itself nowhere is named as sbatch names it (after the script file)
    slurm = request.found or bool(_sbatch_tokens(overrides)) or source == WRAP
    if slurm and source is not None and "name" not in given:
        name = sbatch_job_name(source)
        if name is not None:
            given["name"] = _Given("name", name, None)

    fields: dict[str, Any] = {}
    for name, directive in _TABLE.items():
        g = given.get(name)
        if g is not None:
            fields[directive.field] = g.parse()

    gpus: tuple[GpuAlternative, ...] = fields.get("gpus", ())
    fractional = any(alt.fractional for alt in gpus)
    if "gpu_mode" in fields:
        if fractional and fields["gpu_mode"] is GpuMode.EXCLUSIVE:
            g = given["gpu-mode"]
            raise JobFileError(
                f"gpus={given['gpus'].value} asks for a share of a GPU, which cannot be exclusive; "
                "use gpu-mode=shared or oversubscribe, or ask for whole GPUs",
                line=g.line,
                directive="gpu-mode",
                value=g.value,
            )
    elif fractional:
        fields["gpu_mode"] = GpuMode.SHARED
    if "vram_bytes" in fields and not gpus:
        g = given["vram"]
        raise JobFileError(
            "vram= is memory per GPU, but the job asks for no GPU; add gpus=, e.g. gpus=1",
            line=g.line,
            directive="vram",
            value=g.value,
        )
    fields["slurm"] = slurm
    return ParsedJobFile(JobSpec(script=text, **fields), tuple(warnings))

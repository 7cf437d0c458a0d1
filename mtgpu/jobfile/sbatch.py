"""`#SBATCH` options -> the equivalent `#MTGPU` directive values, plus warnings.

A Slurm batch script runs as it is: its `#SBATCH` lines become directive values that the
`#MTGPU` parser (parser.py) then checks as if they had been written as `#MTGPU` lines, so
every limit and message is the same. Pure: no I/O, no clock.

Where options are read, exactly as sbatch reads them: lines that start with `#SBATCH`
(in column 1, then a blank or the end of the line) in the leading comment block; the
first line that is neither blank nor a comment ends the block, and `#SBATCH` lines after
it are ignored (with a warning here). A line may hold several options. Each option as
getopt_long takes it: `--name=value`, `--name value`, an unambiguous prefix of a long
name (`--ntasks-per-n=1`), `-c 4`, `-c4`; a value may be quoted with `"` or `'`, a
backslash escapes the next character, and an unquoted `#` ends the line (a trailing
comment). A repeated option: the last one wins, as in sbatch.

What each option becomes (docs/SLURM.md has the table):
- mapped: resources (per node, as our `gpus=`/`cpus=`/`mem=` are), name, time, nodes,
  array, output/error, chdir, one node of --nodelist, --exclude, --dependency, requeue;
- accepted with one warning each: options that have no meaning here (partition, qos,
  account, mail, exclusive, constraint, ...): the job runs the same without them;
- refused, naming the option: options whose loss would change what the job does or gets
  (several nodes in --nodelist, more than one task per node in
  a script that starts tasks with srun/mpirun, ...), and options we do not know.

A script with `#SBATCH` lines writes its output to `slurm-%j.out` (an array's task to
`slurm-%A_%a.out`) in its working directory unless it says `--output`, as sbatch does;
the job's log is kept in its usual place as well.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from mtgpu.jobfile.after import parse_after
from mtgpu.jobfile.block import prefixed_lines, split_words
from mtgpu.jobfile.errors import JobFileError
from mtgpu.jobfile.sbatch_options import (BY_LONG, BY_SHORT, NONE, OPTION_NAMES, OPTIONAL, OPTIONS, REQUIRED,
                                          SHORT_REFUSED, Opt)
from mtgpu.model.gpu import VENDORS, normalize_model

SBATCH_PREFIX = "#SBATCH"
DEFAULT_OUTPUT = "slurm-%j.out"
DEFAULT_ARRAY_OUTPUT = "slurm-%A_%a.out"

__all__ = ["OPTION_NAMES", "SbatchRequest", "Translated", "cli_option_length", "slurm_size_bytes",
           "slurm_time_s", "translate"]


@dataclass(frozen=True, slots=True)
class Translated:
    """One #MTGPU directive's value, from #SBATCH options. `line`: the line of the option
    it comes from (None: the command line); `option`: that option as --name=value, for
    messages; `default`: filled in (sbatch's default output file), not written."""

    value: str
    line: int | None
    option: str
    default: bool = False


@dataclass(slots=True)
class SbatchRequest:
    """What the #SBATCH options (and command-line sbatch options) ask for."""

    directives: dict[str, Translated] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)  # the #SBATCH lines read

    @property
    def found(self) -> bool:
        return bool(self.lines)


@dataclass(frozen=True, slots=True)
class _Seen:
    opt: Opt
    value: str | None
    line: int | None

    @property
    def shown(self) -> str:
        return f"--{self.opt.name}" + (f"={self.value}" if self.value is not None else "")

    def where(self) -> str:
        return f"line {self.line}: #SBATCH " if self.line is not None else "command line: "

    def error(self, problem: str) -> JobFileError:
        return JobFileError(problem, line=self.line, directive=f"--{self.opt.name}", value=self.value)


# ---------------------------------------------------------------- reading the lines


def sbatch_lines(text: str) -> tuple[list[tuple[int, str]], list[int]]:
    """The `#SBATCH` lines of the leading comment block (number, rest of the line), and the
    numbers of `#SBATCH` lines after it (which sbatch ignores). sbatch reads them only at
    the start of a line."""
    return prefixed_lines(text, SBATCH_PREFIX, at_column_one=True)


def split_line(rest: str, line: int | None) -> list[str]:
    """sbatch's own splitting of a directive line: blanks separate, `"` and `'` quote, a
    backslash escapes the next character, and an unquoted `#` ends the line."""
    return split_words(rest, line, backslash=True, hash_inside_word=True)


def _long_option(name: str, line: int | None) -> Opt:
    """getopt_long's rule: an exact name, else an unambiguous prefix of one."""
    if name in BY_LONG:
        return BY_LONG[name]
    matches = [o for o in OPTIONS if o.name.startswith(name)] if name else []
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise JobFileError(f"--{name} is ambiguous: it could be {', '.join('--' + o.name for o in matches)}; "
                           "write the whole name", line=line, directive=f"--{name}")
    close = difflib.get_close_matches(name, OPTION_NAMES, n=1, cutoff=0.7)
    hint = f" (did you mean --{close[0]}?)" if close else ""
    raise JobFileError(f"not an sbatch option known here{hint}; docs/SLURM.md lists the ones that are, "
                       "or write the request as #MTGPU directives", line=line, directive=f"--{name}")


def _options(tokens: Sequence[str], line: int | None) -> list[_Seen]:
    """The options of one line (or of the command line), in order."""
    seen: list[_Seen] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token.startswith("--") and len(token) > 2:
            name, eq, value = token[2:].partition("=")
            opt = _long_option(name, line)
            if opt.arg == NONE:
                if eq:
                    raise JobFileError(f"--{opt.name} takes no value; write --{opt.name}", line=line,
                                       directive=f"--{opt.name}", value=value)
                seen.append(_Seen(opt, None, line))
            elif opt.arg == OPTIONAL:
                seen.append(_Seen(opt, value if eq else None, line))
            else:
                if not eq:
                    if i >= len(tokens):
                        raise JobFileError(f"--{opt.name} needs a value, e.g. --{opt.name}=VALUE", line=line,
                                           directive=f"--{opt.name}")
                    value = tokens[i]
                    i += 1
                seen.append(_Seen(opt, value, line))
        elif token.startswith("-") and len(token) > 1 and token != "--":
            j = 1
            while j < len(token):  # a cluster of short flags (-vQ), or -cVALUE / -c VALUE
                letter = token[j]
                opt = BY_SHORT.get(letter)
                if opt is None:
                    what = f" ({SHORT_REFUSED[letter]})" if letter in SHORT_REFUSED else ""
                    raise JobFileError(f"-{letter}{what} is not an sbatch option known here; docs/SLURM.md lists "
                                       "the ones that are", line=line, directive=f"-{letter}")
                j += 1
                if opt.arg == NONE or (opt.arg == OPTIONAL and j >= len(token)):
                    seen.append(_Seen(opt, None, line))
                    continue
                value = token[j:]
                if not value:
                    if i >= len(tokens):
                        raise JobFileError(f"-{letter} (--{opt.name}) needs a value, e.g. -{letter} VALUE",
                                           line=line, directive=f"-{letter}")
                    value = tokens[i]
                    i += 1
                seen.append(_Seen(opt, value, line))
                break
        else:
            if token.lower() in ("hetjob", "packjob"):
                raise JobFileError("heterogeneous jobs are not available; split them into separate jobs",
                                   line=line, directive=token)
            raise JobFileError("is not an option; #SBATCH lines hold options such as --time=1:00:00 or -c 4",
                               line=line, directive=token)
    return seen


def cli_option_length(args: Sequence[str], i: int) -> int | None:
    """How many command-line arguments the sbatch option at args[i] takes (1 or 2), or
    None when it is not one we know. Lets mt-job submit accept `-c 4 -J x --gres=gpu:1`."""
    token = args[i]
    if token.startswith("--") and len(token) > 2:
        name, eq, _ = token[2:].partition("=")
        try:
            opt = _long_option(name, None)
        except JobFileError:
            return None
        return 2 if opt.arg == REQUIRED and not eq else 1
    if token.startswith("-") and len(token) > 1:
        j = 1
        while j < len(token):
            opt = BY_SHORT.get(token[j])
            if opt is None:
                return None
            j += 1
            if opt.arg == REQUIRED:
                return 1 if j < len(token) else 2
        return 1
    return None


# ---------------------------------------------------------------- values


_TIME_RE = re.compile(r"^(?:(\d{1,7})-(\d{1,7})(?::(\d{1,7})(?::(\d{1,7}))?)?|(\d{1,9})(?::(\d{1,7})(?::(\d{1,7}))?)?)$")
_SIZE_RE = re.compile(r"^(\d{1,15}(?:\.\d{1,6})?)\s*([KMGTP]?)(?:I?B)?$", re.IGNORECASE)
_INT_RE = re.compile(r"^\d{1,9}$")
_UNITS = {"": 1 << 20, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_TIME_HELP = ("minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes, "
              "days-hours:minutes:seconds, or UNLIMITED")
_VENDOR_FAMILIES = {"tesla": "nvidia", "geforce": "nvidia", "quadro": "nvidia", "nvidia": "nvidia",
                    "radeon": "amd", "instinct": "amd", "amd": "amd", "intel": "intel"}


def slurm_time_s(text: str) -> float | None:
    """Seconds in a Slurm time limit; None for no limit (0, UNLIMITED, INFINITE). Raises
    ValueError for anything else."""
    t = text.strip()
    if t.upper() in ("UNLIMITED", "INFINITE", "-1"):
        return None
    m = _TIME_RE.match(t)
    if not m:
        raise ValueError(t)
    d, dh, dm, ds, mins, ms, hs = m.groups()
    if d is not None:
        seconds = int(d) * 86400 + int(dh) * 3600 + int(dm or 0) * 60 + int(ds or 0)
    elif hs is not None:  # hours:minutes:seconds
        seconds = int(mins) * 3600 + int(ms) * 60 + int(hs)
    else:  # minutes[:seconds]
        seconds = int(mins) * 60 + int(ms or 0)
    return float(seconds) if seconds > 0 else None


def slurm_size_bytes(text: str) -> int:
    """Bytes in a Slurm memory size: a bare number is megabytes; K, M, G, T are 1024-based,
    as in sbatch. Raises ValueError."""
    m = _SIZE_RE.match(text.strip())
    if not m:
        raise ValueError(text)
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _size_text(n_bytes: int) -> str:
    for unit, factor in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n_bytes % factor == 0:
            return f"{n_bytes // factor}{unit}"
    return str(n_bytes)


def _count(s: _Seen, text: str, what: str) -> int:
    if not _INT_RE.match(text.strip()):
        raise s.error(f"{what} must be a whole number, e.g. {s.shown.split('=')[0]}=2")
    return int(text.strip())


def _gpu_kind(s: _Seen, text: str) -> str:
    """A Slurm GPU type as our gpus= kind: a model (case-insensitive, normalized by the
    parser) or a vendor; Slurm's family names (tesla, geforce, ...) are their vendor's."""
    kind = text.strip().lower()
    if not kind:
        raise s.error("the GPU type is empty; write TYPE:N, e.g. a100:2, or just N")
    if kind in VENDORS:
        return kind
    if not normalize_model(kind):
        if kind in _VENDOR_FAMILIES:
            return _VENDOR_FAMILIES[kind]
        raise s.error(f"{text!r} is not a GPU model; write a model such as a100, h100 or rtx4090")
    if ":" in kind or "|" in kind:
        raise s.error("write one GPU type, e.g. a100:2")
    return kind


@dataclass(frozen=True, slots=True)
class _Gpus:
    kind: str | None
    count: int  # per node
    seen: _Seen

    def label(self) -> str:
        return f"{self.kind}:{self.count}" if self.kind else str(self.count)


def _typed_count(s: _Seen, value: str) -> tuple[str | None, int]:
    """`[TYPE:]N` of --gpus, --gpus-per-node, --gpus-per-task."""
    if "," in value:
        raise s.error("one GPU type at a time is available here; write TYPE:N or N, e.g. a100:2")
    kind_text, sep, count_text = value.rpartition(":")
    if not sep:
        return None, _count(s, value, "the number of GPUs")
    return _gpu_kind(s, kind_text), _count(s, count_text, "the number of GPUs")


def _gres_gpus(s: _Seen) -> tuple[str | None, int]:
    """--gres=gpu[:TYPE][:N][,...]: the GPUs per node (other resources are refused)."""
    found: tuple[str | None, int] | None = None
    for item in (s.value or "").split(","):
        parts = item.strip().split(":")
        name = parts[0].lower()
        if name == "none" and len(parts) == 1:
            continue
        if name != "gpu":
            raise s.error(f"only GPUs are available as a generic resource here (gpu[:TYPE]:N); "
                          f"{parts[0] or item!r} is not")
        if found is not None:
            raise s.error("one GPU type at a time is available here; write gpu:TYPE:N or gpu:N")
        rest = parts[1:]
        if len(rest) > 2:
            raise s.error("write gpu, gpu:N or gpu:TYPE:N, e.g. gpu:a100:2")
        if not rest:
            found = (None, 1)
        elif len(rest) == 1:
            found = (None, _count(s, rest[0], "the number of GPUs")) if rest[0].strip()[:1].isdigit() \
                else (_gpu_kind(s, rest[0]), 1)
        else:
            found = (_gpu_kind(s, rest[0]), _count(s, rest[1], "the number of GPUs"))
    return found or (None, 0)


def _launcher(text: str, after_line: int) -> tuple[int, str] | None:
    """The first line after `after_line` that starts tasks (srun, mpirun, mpiexec)."""
    word = re.compile(r"(?:^|[\s;&|(`$])(srun|mpirun|mpiexec)(?=\s|$|;)")
    for number, line in enumerate(text.split("\n"), start=1):
        if number <= after_line or line.lstrip().startswith("#"):
            continue
        m = word.search(line)
        if m:
            return number, m.group(1)
    return None


def _hostnames(s: _Seen) -> list[str]:
    """Node names of a Slurm host list: `a,b`, `node[1-3,5]`, `gpu[01-02]`."""
    value = (s.value or "").strip()
    if "/" in value:
        raise s.error("a file of node names is not available; name the one node the job must run on")
    if value.count("[") != value.count("]"):
        raise s.error("write node names, e.g. --nodelist=gpu-node-3 or gpu[1-3]")
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", value):
        m = re.fullmatch(r"([^\[\]]*)\[([0-9,\-]+)\]([^\[\]]*)", part)
        if not m:
            if "[" in part or "]" in part:
                raise s.error("write node names, e.g. --nodelist=gpu-node-3")
            names.append(part.strip())
            continue
        head, ranges, tail = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise s.error("write node names, e.g. --nodelist=gpu-node-3")
            for n in range(int(lo), int(hi or lo) + 1):
                names.append(f"{head}{str(n).zfill(len(lo))}{tail}")
                if len(names) > 1000:
                    return names
    return [n for n in names if n]


# ---------------------------------------------------------------- translating


def translate(text: str, cli_tokens: Sequence[str] = (), wrap: bool = False) -> SbatchRequest:
    """The #SBATCH options of a script (and sbatch options from the command line, which
    win, as in sbatch) as #MTGPU directive values; `wrap`: the script is sbatch --wrap's.
    Raises JobFileError."""
    req = _translate_options(text, cli_tokens)
    if (req.found or cli_tokens or wrap) and "output" not in req.directives:
        # sbatch's default output file, for every batch job (--wrap's and command-line options' too)
        pattern = DEFAULT_ARRAY_OUTPUT if "array" in req.directives else DEFAULT_OUTPUT
        req.directives["output"] = Translated(pattern, None, "sbatch's default output file", default=True)
    return req


def _translate_options(text: str, cli_tokens: Sequence[str]) -> SbatchRequest:
    inside, late = sbatch_lines(text)
    req = SbatchRequest(lines=[n for n, _ in inside])
    for n in late:
        req.warnings.append(f"line {n}: #SBATCH after the script's first command is ignored, as sbatch ignores "
                            "it; move it up to the comment block at the top")
    seen: list[_Seen] = []
    for number, rest in inside:
        seen += _options(split_line(rest, number), number)
    seen += _options(list(cli_tokens), None)
    if not seen:
        return req
    got: dict[str, _Seen] = {}
    for s in seen:
        if s.opt.refuse:
            raise s.error(s.opt.refuse)
        got.pop(s.opt.key or s.opt.name, None)  # keep the order of the last ones
        got[s.opt.key or s.opt.name] = s
    for s in got.values():
        if s.opt.warn:
            req.warnings.append(f"{s.where()}{s.shown} is accepted but {s.opt.warn}")
    block_end = max((n for n, _ in inside), default=0)
    _translate(got, req, _launcher(text, block_end) if inside or cli_tokens else None)
    req.warnings.sort(key=_line_of)  # in the order of the script's lines; the command line's last
    return req


def _line_of(warning: str) -> int:
    m = re.match(r"line (\d+): ", warning)
    return int(m.group(1)) if m else 1 << 30


def _translate(got: dict[str, _Seen], req: SbatchRequest, launcher: tuple[int, str] | None) -> None:
    out = req.directives

    def put(directive: str, value: str, s: _Seen) -> None:
        out[directive] = Translated(value, s.line, s.shown)

    for option, directive in (("job-name", "name"), ("array", "array"), ("output", "output"),
                              ("error", "error"), ("chdir", "workdir")):
        if option in got and got[option].value is not None:
            put(directive, got[option].value, got[option])
    if "dependency" in got:
        s = got["dependency"]
        try:
            parse_after(s.value or "")
        except ValueError as e:
            raise s.error(str(e)) from None
        put("after", s.value or "", s)
    if "requeue" in got:
        put("requeue", "yes" if got["requeue"].opt.name == "requeue" else "no", got["requeue"])
    if "time" in got:
        s = got["time"]
        try:
            limit = slurm_time_s(s.value or "")
        except ValueError:
            raise s.error(f"a Slurm time limit is {_TIME_HELP}") from None
        if limit is not None:
            put("time", (s.value or "").strip(), s)
    _check_simple(got, req)

    nodes = 1
    if "nodes" in got:
        s = got["nodes"]
        lo, sep, hi = (s.value or "").strip().partition("-")
        if "," in (s.value or "") or (sep and lo != hi):
            raise s.error("a range or list of node counts is not available (a job runs on exactly N nodes, all "
                          "at once); write one count, e.g. --nodes=2")
        nodes = _count(s, lo, "the number of nodes")
        if nodes < 1:
            raise s.error("the number of nodes must be at least 1, e.g. --nodes=1")
        put("nodes", str(nodes), s)

    tasks = _tasks_per_node(got, nodes, req, launcher)
    gpus = _gpus_per_node(got, nodes, tasks)
    if gpus is not None:
        put("gpus", gpus.label(), gpus.seen)
    gpu_count = gpus.count if gpus is not None else 0

    cpus: int | None = None
    if "cpus-per-task" in got and "cpus-per-gpu" in got:
        raise got["cpus-per-gpu"].error("--cpus-per-task and --cpus-per-gpu cannot both be given (as in sbatch); "
                                        "keep one")
    if "cpus-per-task" in got:
        s = got["cpus-per-task"]
        cpus = _count(s, s.value or "", "the number of CPUs per task") * tasks
        if cpus < 1:
            raise s.error("at least 1 CPU per task, e.g. --cpus-per-task=4")
        put("cpus", str(cpus), s)
    elif "cpus-per-gpu" in got:
        s = got["cpus-per-gpu"]
        if not gpu_count:
            raise s.error("the job asks for no GPU; ask for GPUs (--gres=gpu:N) or use --cpus-per-task")
        cpus = _count(s, s.value or "", "the number of CPUs per GPU") * gpu_count
        put("cpus", str(cpus), s)
    elif tasks > 1:
        cpus = tasks  # sbatch gives every task a CPU at least
        put("cpus", str(cpus), got.get("ntasks-per-node") or got["ntasks"])

    _memory(got, cpus if cpus is not None else tasks, gpu_count, put, req)

    if "nodelist" in got:
        s = got["nodelist"]
        names = sorted(set(_hostnames(s)))
        if len(names) != 1:
            raise s.error("a job can be pinned to one node here (#MTGPU server=); several nodes in --nodelist "
                          "cannot be honoured: name one, or leave the choice to the scheduler")
        if nodes > 1:
            raise s.error(f"--nodes={nodes} cannot all run on the one node {names[0]}; drop --nodelist or ask "
                          "for one node")
        put("server", names[0], s)
    if "exclude" in got:
        s = got["exclude"]
        put("exclude", ",".join(sorted(set(_hostnames(s)))), s)


def _check_simple(got: dict[str, _Seen], req: SbatchRequest) -> None:
    """Options that are accepted in one spelling and refused in the others."""
    if "open-mode" in got:
        s = got["open-mode"]
        mode = (s.value or "").strip().lower()
        if mode not in ("truncate", "t"):
            raise s.error("appending to the output file is not available: a job's first run starts it empty, "
                          "as --open-mode=truncate (sbatch's default) does, and a requeued run appends")
    if "export" in got:
        s = got["export"]
        mode = (s.value or "").strip().upper()
        if mode == "ALL":
            req.warnings.append(f"{s.where()}{s.shown} is accepted but the job starts in a clean environment "
                                "(PATH, HOME, USER, the MTGPU_* and SLURM_* variables), not the one it was "
                                "submitted from; set the environment up in the script")
        elif mode != "NONE":
            raise s.error("only --export=ALL or NONE: passing or setting variables is not available; "
                          "set them in the script")
    if "begin" in got:
        s = got["begin"]
        if (s.value or "").strip().lower() not in ("now", "now+0"):
            raise s.error("a later start is not available; submit the job when it should start")
    if "input" in got:
        s = got["input"]
        if (s.value or "").strip() != "/dev/null":
            raise s.error("a job's standard input is /dev/null here; let the script read the file")


def _tasks_per_node(got: dict[str, _Seen], nodes: int, req: SbatchRequest,
                    launcher: tuple[int, str] | None) -> int:
    """Tasks per node. One task runs per node here (the script runs once on each node of the
    job, and srun in it runs its command once there): more is refused when the script
    starts tasks itself (srun, mpirun), and sizes the request otherwise."""
    per_node: int | None = None
    source: _Seen | None = None
    if "ntasks-per-node" in got:
        source = got["ntasks-per-node"]
        per_node = _count(source, source.value or "", "the number of tasks per node")
    if "ntasks" in got:
        s = got["ntasks"]
        total = _count(s, s.value or "", "the number of tasks")
        if total % nodes:
            raise s.error(f"{total} tasks do not spread evenly over {nodes} nodes (one rank per node here); "
                          f"make --ntasks a multiple of --nodes, e.g. --ntasks={nodes}")
        if per_node is not None and per_node * nodes != total:
            raise s.error(f"--ntasks={total} disagrees with --ntasks-per-node={per_node} on {nodes} node(s); "
                          "give one of them")
        per_node, source = total // nodes, s
    if per_node is None or source is None:
        return 1
    if per_node < 1:
        raise source.error("at least one task, e.g. --ntasks=1")
    if per_node == 1:
        return 1
    if launcher is not None:
        number, word = launcher
        raise source.error(
            f"{per_node} tasks per node: here one task runs per node (the script, and each srun in it, runs "
            f"once on every node of the job), but line {number} starts tasks with {word}; ask for one task per "
            f"node (--ntasks-per-node=1) and start the {per_node} processes yourself "
            f"(e.g. torchrun --nproc-per-node={per_node}), or use --nodes={nodes * per_node}")
    req.warnings.append(f"{source.where()}{source.shown} is accepted as a size: the script runs once per node "
                        f"(one task), with the CPUs, memory and GPUs of {per_node} tasks (SLURM_NTASKS is the "
                        "number of nodes; SLURM_CPUS_ON_NODE the CPUs)")
    return per_node


def _gpus_per_node(got: dict[str, _Seen], nodes: int, tasks: int) -> _Gpus | None:
    asked: list[_Gpus] = []
    if "gres" in got:
        kind, count = _gres_gpus(got["gres"])
        asked.append(_Gpus(kind, count, got["gres"]))
    if "gpus-per-node" in got:
        kind, count = _typed_count(got["gpus-per-node"], got["gpus-per-node"].value or "")
        asked.append(_Gpus(kind, count, got["gpus-per-node"]))
    if "gpus-per-task" in got:
        kind, count = _typed_count(got["gpus-per-task"], got["gpus-per-task"].value or "")
        asked.append(_Gpus(kind, count * tasks, got["gpus-per-task"]))
    if "gpus" in got:
        s = got["gpus"]
        kind, total = _typed_count(s, s.value or "")
        if total % nodes:
            raise s.error(f"{total} GPUs do not spread evenly over {nodes} nodes (every node of a job gets the "
                          f"same GPUs here); ask for GPUs per node, e.g. --gpus-per-node={math.ceil(total / nodes)}")
        asked.append(_Gpus(kind, total // nodes, s))
    if not asked:
        return None
    first = asked[0]
    for other in asked[1:]:
        if other.count != first.count or (other.kind and first.kind and other.kind != first.kind):
            raise other.seen.error(f"asks for {other.label()} GPUs per node but {first.seen.shown} asks for "
                                   f"{first.label()}; keep one of them")
    kind = next((a.kind for a in asked if a.kind), None)
    return _Gpus(kind, first.count, first.seen)


def _memory(got: dict[str, _Seen], cpus: int, gpus: int, put, req: SbatchRequest) -> None:
    given = [got[k] for k in ("mem", "mem-per-cpu", "mem-per-gpu") if k in got]
    if not given:
        return
    if len(given) > 1:
        raise given[1].error(f"{given[0].shown} and {given[1].shown} cannot both be given (as in sbatch); keep one")
    s = given[0]
    try:
        n_bytes = slurm_size_bytes(s.value or "")
    except ValueError:
        raise s.error("a Slurm memory size is a number of megabytes or a number with K, M, G or T "
                      "(1024-based), e.g. 16G or 4000") from None
    if n_bytes == 0:
        req.warnings.append(f"{s.where()}{s.shown} (all of a node's memory) is accepted as no memory request: "
                            "the job reserves none and is not limited, as without mem=")
        return
    if s.opt.name == "mem-per-cpu":
        n_bytes *= max(1, cpus)
    elif s.opt.name == "mem-per-gpu":
        if not gpus:
            raise s.error("the job asks for no GPU; ask for GPUs (--gres=gpu:N) or use --mem")
        n_bytes *= gpus
    put("mem", _size_text(n_bytes), s)

"""sbatch's options, and what becomes of each here: mapped (translated by sbatch.py),
accepted with a warning (`warn`: it has no effect here) or refused (`refuse`: without it
the job would do or get something else). docs/SLURM.md shows the same table."""

from __future__ import annotations

from dataclasses import dataclass

REQUIRED, NONE, OPTIONAL = "required", "none", "optional"


@dataclass(frozen=True, slots=True)
class Opt:
    name: str  # the long name
    arg: str = REQUIRED  # REQUIRED, NONE or OPTIONAL (OPTIONAL: only as --name=value)
    short: str | None = None
    key: str | None = None  # options that set the same thing share a key (the last one wins)
    warn: str | None = None  # accepted, with this warning: it has no effect here
    refuse: str | None = None  # refused, with this reason


_NO_LAYOUT = "CPU layout and binding are not controlled here: the job gets its cpus= cores"
_NO_PLACEMENT = "the scheduler places the job on the nodes that fit it best"
_NO_ACCOUNTING = "there is no Slurm accounting here; `mt-job show` tells what a job used"
_NO_EFFECT = "it has no effect here"

OPTIONS: tuple[Opt, ...] = (
    # ---- mapped
    Opt("job-name", short="J"),
    Opt("time", short="t"),
    Opt("nodes", short="N"),
    Opt("ntasks", short="n"),
    Opt("ntasks-per-node"),
    Opt("cpus-per-task", short="c"),
    Opt("cpus-per-gpu"),
    Opt("gres"),
    Opt("gpus", short="G"),
    Opt("gpus-per-node"),
    Opt("gpus-per-task"),
    Opt("mem"),
    Opt("mem-per-cpu"),
    Opt("mem-per-gpu"),
    Opt("array", short="a"),
    Opt("output", short="o"),
    Opt("error", short="e"),
    Opt("chdir", short="D", key="chdir"),
    Opt("workdir", key="chdir"),  # sbatch's old name for --chdir
    Opt("nodelist", short="w"),
    Opt("dependency", short="d"),
    Opt("exclude", short="x"),
    Opt("requeue", arg=NONE, key="requeue"),
    Opt("no-requeue", arg=NONE, key="requeue"),
    Opt("open-mode"),
    Opt("export"),
    Opt("begin", short="b"),
    Opt("input", short="i"),
    # ---- accepted with a warning: no meaning here
    Opt("partition", short="p", warn="there are no partitions here: the job may run on any node that fits it"),
    Opt("qos", short="q", warn="there are no QOS levels here; priority= sets a job's base priority"),
    Opt("account", short="A", warn="there are no Slurm accounts here: use is counted per tenant"),
    Opt("mail-type", warn="no mail is sent; `mt-job show` and `mt-job list` tell how a job ended"),
    Opt("mail-user", warn="no mail is sent; `mt-job show` and `mt-job list` tell how a job ended"),
    Opt("exclusive", arg=OPTIONAL,
         warn="nodes are not given whole; the job's GPUs are its own (gpu-mode=exclusive, the default)"),
    Opt("constraint", short="C",
         warn="nodes have no features here; ask for a GPU model with --gres=gpu:MODEL:N"),
    Opt("cluster-constraint", warn="nodes have no features here"),
    Opt("reservation", warn="there are no reservations here"),
    Opt("comment", warn="comments are not kept; --job-name labels the job"),
    Opt("nice", arg=OPTIONAL, warn="priority= sets a job's base priority here"),
    Opt("priority", warn="priority= sets a job's base priority here"),
    Opt("signal", warn="no signal is sent before the time limit: at the limit the job gets SIGTERM, "
                        "then SIGKILL 3 s later"),
    Opt("time-min", warn="the time limit is --time"),
    Opt("tmp", warn="local disk is not reserved"),
    Opt("mincpus", warn="use --cpus-per-task to reserve cores"),
    Opt("hint", warn=_NO_LAYOUT),
    Opt("distribution", short="m", warn=_NO_LAYOUT),
    Opt("sockets-per-node", warn=_NO_LAYOUT),
    Opt("cores-per-socket", warn=_NO_LAYOUT),
    Opt("threads-per-core", warn=_NO_LAYOUT),
    Opt("ntasks-per-core", warn=_NO_LAYOUT),
    Opt("ntasks-per-socket", warn=_NO_LAYOUT),
    Opt("mem-bind", warn=_NO_LAYOUT),
    Opt("extra-node-info", short="B", warn=_NO_LAYOUT),
    Opt("core-spec", short="S", warn=_NO_LAYOUT),
    Opt("thread-spec", warn=_NO_LAYOUT),
    Opt("cpu-freq", warn="CPU frequencies are not controlled here"),
    Opt("gpu-bind", warn="GPU binding is not controlled here: the job sees exactly its GPUs"),
    Opt("gpu-freq", warn="GPU frequencies are not controlled here"),
    Opt("gres-flags", warn="GPU binding is not controlled here: the job sees exactly its GPUs"),
    Opt("licenses", short="L", warn="there are no licenses here"),
    Opt("clusters", short="M", warn="the job runs on the cluster it is submitted to"),
    Opt("wckey", warn=_NO_ACCOUNTING),
    Opt("acctg-freq", warn=_NO_ACCOUNTING),
    Opt("profile", warn=_NO_ACCOUNTING),
    Opt("propagate", arg=OPTIONAL, warn="the submitting shell's resource limits are not passed on"),
    Opt("get-user-env", arg=OPTIONAL, warn="the job starts in a clean environment; set it up in the script"),
    Opt("kill-on-invalid-dep", warn="queue dependencies are not available yet"),
    Opt("no-kill", short="k", arg=OPTIONAL, warn="a job on several nodes fails when one of its nodes is lost"),
    Opt("overcommit", short="O", arg=NONE, warn="CPU sharing follows cpus= here"),
    Opt("oversubscribe", short="s", arg=NONE, warn="CPU sharing follows cpus= here"),
    Opt("contiguous", arg=NONE, warn=_NO_PLACEMENT),
    Opt("switches", warn=_NO_PLACEMENT),
    Opt("network", warn=_NO_PLACEMENT),
    Opt("spread-job", arg=NONE, warn=_NO_PLACEMENT),
    Opt("use-min-nodes", arg=NONE, warn=_NO_PLACEMENT),
    Opt("power", warn=_NO_EFFECT),
    Opt("delay-boot", warn=_NO_EFFECT),
    Opt("bb", warn="there are no burst buffers here"),
    Opt("bbf", warn="there are no burst buffers here"),
    Opt("mcs-label", warn=_NO_EFFECT),
    Opt("x11", arg=OPTIONAL, warn="batch jobs have no display"),
    Opt("batch", warn=_NO_PLACEMENT),
    Opt("verbose", short="v", arg=NONE, warn=_NO_EFFECT),
    Opt("quiet", short="Q", arg=NONE, warn=_NO_EFFECT),
    Opt("parsable", arg=NONE, warn="use mt-job submit --parsable (or --json)"),
    Opt("wait", short="W", arg=NONE, warn="use mt-job submit --wait"),
    Opt("ignore-pbs", arg=NONE, warn="#PBS lines are never read"),
    Opt("requeue-exit", warn=_NO_EFFECT),
    # ---- refused: without them the job would do or get something else
    Opt("hold", short="H", arg=NONE, refuse="holding a job is not available; submit it when it should run"),
    Opt("deadline", refuse="deadlines are not available; use --time to bound how long the job runs"),
    Opt("test-only", arg=NONE, refuse="a test-only submission is not available"),
    Opt("uid", refuse="a job always runs as the tenant who submits it"),
    Opt("gid", refuse="a job always runs as the tenant who submits it"),
    Opt("nodefile", short="F", refuse="a node file is not available; name one node with --nodelist"),
    Opt("ntasks-per-gpu", refuse="tasks per GPU cannot be expressed here (one task runs per node); "
                                  "ask for GPUs per node with --gres=gpu:N"),
    Opt("gpus-per-socket", refuse="GPUs per socket cannot be expressed here; ask for GPUs per node with "
                                   "--gres=gpu:N"),
    Opt("container", refuse="Slurm's OCI bundles are not available; run in an image with #MTGPU container=IMAGE"),
    Opt("container-id", refuse="Slurm's OCI bundles are not available; run in an image with #MTGPU container=IMAGE"),
    Opt("wrap", refuse="--wrap is for the command line, not a script: mt-job submit --wrap 'CMD'"),
    Opt("export-file", refuse="an environment file is not available; set the variables in the script"),
    Opt("het-group", refuse="heterogeneous jobs are not available"),
)

BY_LONG: dict[str, Opt] = {o.name: o for o in OPTIONS}
BY_SHORT: dict[str, Opt] = {o.short: o for o in OPTIONS if o.short}
# Short options sbatch has that we list under no long name above (help, usage, version).
SHORT_REFUSED = {"h": "--help", "u": "--usage", "V": "--version"}

OPTION_NAMES: tuple[str, ...] = tuple(BY_LONG)
"""Every long option the translator knows (mapped, warned or refused)."""

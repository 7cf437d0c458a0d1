"""Every table command of the CLIs, rendered with fixed data at 80 and 200 columns (a
terminal) and through a pipe, compared with the golden files in tests/unit/golden/: a
change that cuts, wraps or drops a column differently fails here. Regenerate the golden
files only on purpose, and read the diff: MTGPU_UPDATE_GOLDEN=1 pytest tests/unit/test_cli_tables.py

Also: through a pipe nothing is cut (one line a row, every cell whole); on a terminal
of 80 columns no line is longer and no cell but a reason is cut; our text is never read
as rich markup or emoji; `--help` gives every command a one-line summary."""

from __future__ import annotations

import io
import os
import re
import time
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import mtgpu.cli.common as common
import mtgpu.cli.usage as usage_cli
from mtgpu.cli import admin, attach, container, job, remotegpu
from mtgpu.cli.common import fail, jobs_table_rows, render_table, summary_line, wrapped
from mtgpu.cli.nodes_table import nodes_text
from mtgpu.cli.usage import print_report, report_heads, report_tables
from mtgpu.model.usage import JobUsage, UsagePart
from mtgpu.model.usage_report import usage_report
from mtgpu.server.cluster.standing import Facts, decide
from mtgpu.tui.rows import JOB_COLUMNS, WORKSPACE_COLUMNS, ClusterSnapshot, Row, job_rows, workspace_rows

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("MTGPU_UPDATE_GOLDEN") == "1"
WIDTHS = (80, 200)
GIB = 1 << 30
T0 = 1_764_666_000.0  # 2025-12-02 09:00 UTC


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    """Times print in the local zone: UTC here, so that the golden files hold."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


# ---------------------------------------------------------------- fixed data
def api_gpu(index: int, model: str = "NVIDIA GeForce RTX 4090", used: int = 1, total: int = 24, util: float = 37.0,
            fraction: float = 0.5, committed: int = 12, exclusive: bool = False) -> dict:
    return {"index": index, "vendor": "nvidia", "model": model, "vram_total_bytes": total * GIB,
            "vram_used_bytes": used * GIB, "utilization_pct": util, "committed_fraction": fraction,
            "committed_vram_bytes": committed * GIB, "exclusive": exclusive}


def api_node(name: str, role: str, state: str, gpus: list[dict], reason: str = "", standing: dict | None = None,
             **kw) -> dict:
    node = {"name": name, "role": role, "state": state, "reason": reason, "cpus": 64.0, "cpus_committed": 12.0,
            "mem_total_bytes": 512 * GIB, "mem_committed_bytes": 96 * GIB, "gpus": gpus, "containers": None,
            "address": f"10.0.0.{len(name)}:7070", **kw}
    if standing is not None:
        node["standing"] = standing
    return node


def cluster_nodes() -> list[dict]:
    """A scheduler cut off from its majority and two members that cannot reach it (the
    nodes table of issue 27: the role's mark kept, the long reason said once)."""
    facts = Facts(node="gpu-a", now=1000.0, wall_now=T0, leads=True, majority_heard_at=998.0, report_taken_at=0.0,
                  started_at=100.0, stale_after_s=1.5, report_fresh_s=3.0, lease_ends_at=1005.0, jobs_here=1)
    s = decide(facts)
    h100 = [api_gpu(i, "NVIDIA H100 80GB HBM3", used=40, total=80, util=98, fraction=1, committed=80,
                    exclusive=True) for i in range(2)]
    return [api_node("gpu-a", s.role("scheduler"), s.health, h100, s.reason, s.to_json()),
            api_node("gpu-b", "scheduler?", "unknown", [api_gpu(0), api_gpu(1)], s.problem),
            api_node("workstation-12", "voter?", "unknown", [api_gpu(0, util=0, fraction=0, committed=0)], s.problem),
            api_node("cpu-only", "member", "drained", [], "maintenance until Friday")]


def api_job(jid: int, state: str, name: str, nodes: list[str], reason: str = "", exit_code: int | None = None,
            tenant: str = "alice", gpus: int = 1) -> dict:
    return {"id": jid, "tenant": tenant, "name": name, "state": state, "nodes": nodes,
            "gpus": [{"node": n, "index": i, "fraction": 1.0} for n in nodes for i in range(gpus)],
            "submitted_at": T0 + jid * 61, "started_at": None, "ended_at": None, "exit_code": exit_code,
            "reason": reason, "spec": {}, "array_index": None}


def jobs() -> list[dict]:
    return [api_job(7, "running", "train-resnet50", ["gpu-a"], gpus=2),
            api_job(18, "queued", "sweep-lr-0.001", [], "waiting for 2 GPUs of model H100: every node that has them "
                    "is busy (gpu-a runs job 7 until about 14:00); your fair share is 1 (docs/SCHEDULING.md)"),
            api_job(1042, "failed", "[bold]eval[/] :m:", ["gpu-b", "workstation-12"], "exit status 3", exit_code=3,
                    tenant="bob"),
            api_job(1043, "completed", "wrap", ["gpu-b"], exit_code=0)]


def usage_records() -> list[JobUsage]:
    """Finished jobs' usage over three days, three tenants, three GPU models."""
    records = []
    for i, (tenant, day, node, model, gpus, hours) in enumerate([
            ("alice", 1, "gpu-a", "NVIDIA H100 80GB HBM3", 2, 3.5), ("alice", 1, "gpu-b", "NVIDIA GeForce RTX 4090", 1, 12.25),
            ("bob", 2, "gpu-a", "NVIDIA H100 80GB HBM3", 4, 1.0),
            ("s16alice-long-tenant", 3, "workstation-12", "NVIDIA A100-SXM4-40GB", 1, 30.0),
            ("bob", 3, "gpu-b", "NVIDIA GeForce RTX 4090", 1, 0.5)]):
        end = T0 + day * 86400
        run = hours * 3600
        wait = 600.0 * (i + 1)
        part = UsagePart(node, model, 1.0, gpus * run, 8 * run, 64 * GIB * run)
        records.append(JobUsage(i + 1, tenant, 2000 + len(tenant), time.strftime("%Y-%m-%d", time.gmtime(end)),
                                "completed", 0, end - run - wait, end - run, end, wait, run, 1, (part,)))
    return records


def report(by: str) -> dict:
    return usage_report(usage_records(), [], None, None, by)


def gpu(index: int, model: str, used: int, total: int, util: float, committed: float = 0.0) -> dict:
    return api_gpu(index, model, used=used, total=total, util=util, fraction=committed, committed=0)


def snapshots() -> list[ClusterSnapshot]:
    eight = [gpu(i, "NVIDIA H100 80GB HBM3", 10 * i, 80, 12.5 * i, 1.0 if i < 3 else 0.0) for i in range(8)]
    mixed = [gpu(0, "NVIDIA A100-SXM4-40GB", 3, 40, 5), gpu(1, "NVIDIA T4", 0, 16, 0), gpu(2, "NVIDIA T4", 15, 16, 99)]
    ws = {"id": 9, "state": "running", "reason": "", "gpus": [{"index": 0}],
          "workspace": {"name": "notebook", "node": "gpu-a", "image": "docker.io/pytorch/pytorch:2.4.0-cuda12.4",
                        "ports": [{"port": 8888, "host_port": 41234, "url": None}], "container": "c1"}}
    waiting = {"id": 10, "state": "queued", "gpus": [],
               "reason": "waiting for 1 GPU with 40G free: every such GPU is committed (gpu-a 8/8, gpu-b 3/3)",
               "workspace": {"name": "vscode-long-workspace-name", "node": None, "image": "ubuntu:24.04",
                             "ports": [{"port": 8080, "host_port": None, "url": None}], "container": None}}
    return [ClusterSnapshot("lab", "10.0.0.1:7070", "alice", "direct",
                            [api_node("gpu-a", "scheduler", "up", eight), api_node("gpu-b", "voter", "up", mixed)],
                            jobs(), [ws, waiting]),
            ClusterSnapshot("home", "192.168.1.20:7070", "alice", "relayed",
                            [api_node("workstation-12", "scheduler", "up", [gpu(0, "NVIDIA GeForce RTX 4090", 2, 24, 7)])],
                            [], []),
            ClusterSnapshot("cloud", "cloud.example.org:7070", "alice", error="timed out after 5.0 s (connect)"),
            ClusterSnapshot("old", "10.9.0.1:7070", "alice", "direct",
                            [api_node("old-1", "scheduler", "up", [gpu(0, "NVIDIA T4", 1, 16, 3)])], [], [],
                            error="connection refused")]


def containers() -> list[dict]:
    s = snapshots()[0]
    return [{**w, "id": w["id"]} for w in s.workspaces]


def tenants() -> list[dict]:
    return [{"name": "alice", "uid": 2001, "gid": 2001, "managed": True, "clusters": ["lab"], "share": 1.0,
             "keys": [1], "last_seen_at": T0},
            {"name": "s16alice-long-tenant", "uid": 2002, "gid": 2002, "managed": True,
             "clusters": ["lab", "home", "cloud-eu-west-1"], "share": 2.5, "keys": [1, 2], "last_seen_at": None},
            {"name": "root-local", "uid": 1000, "gid": 1000, "managed": False, "clusters": [], "share": 1.0,
             "keys": [], "last_seen_at": T0 - 86400 * 3}]


def usage_text(by: str, width: int | None) -> str:
    r = report(by)
    return "\n".join(wrapped(head, width) + "\n" + render_table(cols, rows, width)
                     for head, (cols, rows) in zip(report_heads(r, "usage of every tenant's finished jobs"),
                                                   report_tables(r)))


def view_text(columns, rows, width):
    return render_table(*remotegpu.view_table(columns, rows, width), width, has_wide=False)


# every table command: its name in the golden files, and its text at a width (None: a pipe)
TABLES = {
    "admin_nodes": lambda w: nodes_text(cluster_nodes(), w),
    "admin_jobs": lambda w: render_table(*jobs_table_rows(jobs(), tenant=True), w),
    "mt_job_list": lambda w: render_table(*jobs_table_rows(jobs()), w),
    "admin_usage_by_tenant": lambda w: usage_text("tenant", w),
    "admin_usage_by_day": lambda w: usage_text("day", w),
    "mt_job_usage_by_model": lambda w: usage_text("model", w),
    "usage_by_node": lambda w: usage_text("node", w),
    "admin_tenant_list": lambda w: render_table(*admin.tenant_table(tenants()), w, has_wide=False),
    "mt_container_list": lambda w: render_table(*container.workspace_table(containers()), w, has_wide=False),
    "remotegpu_servers_live": lambda w: remotegpu.live_text(snapshots(), w),
    "remotegpu_jobs": lambda w: view_text(JOB_COLUMNS, job_rows(snapshots()), w),
    "remotegpu_workspaces": lambda w: view_text(WORKSPACE_COLUMNS, workspace_rows(snapshots()), w),
    "mt_job_gpus": lambda w: render_table(*attach.gpus_table(
        [{**api_gpu(i, "NVIDIA H100 80GB HBM3", 40, 80, 98.0), "your_jobs": [7]} for i in range(2)]), w, has_wide=False),
    "mt_python_list": lambda w: render_table(*python_table(), w, has_wide=False),
}


def python_table():
    from mtgpu.cli.python import interpreters_table
    return interpreters_table([
        {"name": "py311", "version": "3.11.2 (main, Aug 26 2024) [GCC 12.2.0]", "error": None, "path": "/usr/bin/python3.11"},
        {"name": "conda-torch", "version": None, "path": "/opt/conda/envs/torch/bin/python",
         "error": "exited with status 127: /opt/conda/envs/torch/bin/python: error while loading shared libraries: "
                  "libpython3.12.so.1.0: cannot open shared object file"}])


def narrow_cells_needed(name: str, width: int) -> None:
    """servers --live on 80 columns shows the app's narrow cells (tui/rows.py, Row.short,
    issue 27 point 1, committed beside this)."""
    if name == "remotegpu_servers_live" and width < 200 and "short" not in Row.__dataclass_fields__:
        pytest.skip("the app's narrow server cells (Row.short in mtgpu/tui/rows.py) are not in this tree yet")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_table_matches_its_golden_rendering(name, width):
    narrow_cells_needed(name, width)
    text = TABLES[name](width) + "\n"
    path = GOLDEN / f"{name}_{width}.txt"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} is missing: MTGPU_UPDATE_GOLDEN=1 makes it (then read it)"
    assert text == path.read_text(), f"{name} at {width} columns differs from {path}:\n{text}"


@pytest.mark.parametrize("name", sorted(TABLES))
def test_at_80_columns_no_line_is_longer_and_nothing_but_a_summary_is_cut(name):
    narrow_cells_needed(name, 80)
    text = TABLES[name](80)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "…" not in text, text


@pytest.mark.parametrize("name", sorted(TABLES))
def test_through_a_pipe_nothing_is_cut_or_wrapped_or_left_out(name):
    piped = TABLES[name](None)
    wide = TABLES[name](UNLIMITED_TEST)
    assert piped == wide and "…" not in piped and "left out" not in piped, piped


UNLIMITED_TEST = 10_000


def test_usage_by_day_piped_keeps_every_day_and_tenant_whole(capsys):
    """`mtgpu-admin usage --by day | cat` showed 2026…, 00:0…, s16a…"""
    print_report(report("day"), False, "usage")
    print_report(report("tenant"), False, "usage")
    text = capsys.readouterr().out
    for word in ("2025-12-03", "2025-12-04", "2025-12-05", "s16alice-long-tenant", "NVIDIA A100-SXM4-40GB 30.00",
                 "MEM GIB-HOURS", "RUN HOURS", "WAIT HOURS"):
        assert word in text, text
    assert "…" not in text, text
    rows = [line for line in text.splitlines() if line.startswith(("2025-", "TOTAL", "alice", "bob", "s16"))]
    assert len(rows) == 4 + 4, text  # one line a row (3 days, 3 tenants, each TOTAL): nothing wrapped


def terminal(monkeypatch, width: int) -> io.StringIO:
    """stdout as a terminal of `width` columns, for the CLI's own printing."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=True, color_system=None, highlight=False,
                      soft_wrap=True, markup=False, emoji=False)
    monkeypatch.setattr(common, "out", console)
    monkeypatch.setattr(usage_cli, "out", console)
    return buf


def test_usage_on_an_80_column_terminal_drops_columns_and_says_so_and_wide_keeps_them(monkeypatch):
    buf = terminal(monkeypatch, 80)
    print_report(report("day"), False, "usage")
    text = buf.getvalue()
    assert "2025-12-03" in text and "…" not in text and max(map(len, text.splitlines())) <= 80, text
    assert "(left out at this width: BY MODEL, MEM GIB-HOURS, RUN HOURS, WAIT HOURS;" in text, text
    buf.truncate(0)
    buf.seek(0)
    print_report(report("day"), False, "usage", wide=True)
    assert "RUN HOURS" in buf.getvalue() and "left out" not in buf.getvalue()


def test_the_nodes_table_keeps_each_role_whole_and_says_a_stale_members_problem_once():
    for width in (80, 200, None):
        text = nodes_text(cluster_nodes(), width)
        lines = text.splitlines()
        assert any(line.startswith("gpu-b ") and " scheduler? " in line for line in lines), text
        assert any(line.startswith("workstation-12 ") and " voter? " in line for line in lines), text
        assert text.count("gpu-a was the scheduler and lost the majority") == 1, text
        assert "gpu-b, workstation-12 (unknown): gpu-a was the scheduler" in text, text
    narrow = nodes_text(cluster_nodes(), 80)
    assert " H100 80GB HBM3 " in narrow and "NVIDIA" not in narrow.split("\n\n")[0], narrow


def test_servers_live_has_one_line_a_node_and_whole_headers_at_80_columns():
    """`servers --live` wrapped each node over 4 lines and cut its header to `used/to…`."""
    narrow_cells_needed("remotegpu_servers_live", 80)
    text = remotegpu.live_text(snapshots(), 80)
    lines = text.splitlines()
    assert lines[0].split() == ["CLUSTER", "NODE", "STATE", "GPUS", "FREE", "MY", "JOBS", "PATH"], text
    assert "(left out at this width: UTIL%, VRAM GiB; --wide or a pipe shows them)" in text, text
    for node in ("gpu-a", "gpu-b", "workstation-12"):
        assert len([line for line in lines if f" {node} " in line]) == 1, text
    assert "cloud (cloud.example.org:7070) did not answer: timed out after 5.0 s (connect)" in text, text
    assert "old (10.9.0.1:7070) did not answer: connection refused (its nodes as they were)" in text, text
    assert "…" not in text and max(map(len, lines)) <= 80, text


def test_our_text_is_never_read_as_markup_or_emoji(monkeypatch, capsys):
    """`mt-job submit --time xyz` said (hⓂs): every console of the CLIs prints our text as it is."""
    text = "--time xyz: give 1:30:00 (h:m:s) [bold]not bold[/] [/] :m: :thumbs_up:"
    common.out.print(text)
    common.err.print(text)
    with pytest.raises(SystemExit):
        fail(text)
    captured = capsys.readouterr()
    assert captured.out == text + "\n", captured.out
    assert captured.err == text + "\n" + "error: " + text + "\n", captured.err
    table = render_table(*jobs_table_rows(jobs()), 200)
    assert "[bold]eval[/] :m:" in table, table


@pytest.mark.parametrize("app", [remotegpu.app, job.app, admin.app, container.app], ids=lambda a: a.info.name or "")
def test_help_gives_every_command_a_one_line_summary_at_80_columns(app):
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
    assert result.exit_code == 0, result.output
    panel = result.output[result.output.index("Commands"):]
    rows = [line for line in panel.splitlines() if line.startswith("│")]
    assert rows and all(re.match(r"│ [a-z][a-z-]* +\S", line) for line in rows), panel  # no continuation line


def test_a_summary_is_the_first_sentence_without_asides_or_its_first_clause():
    assert summary_line("Ask a server who you are (checks your key).\n  More.") == "Ask a server who you are."
    assert summary_line("Your jobs on every joined cluster (workspaces are in `workspaces`), or, with\n"
                        "    --server, every job of yours on that server's cluster.") == "Your jobs on every joined cluster"
    assert summary_line("A loopback port that reaches the server's node API through DirectLink, for programs\n"
                        "    that sign their own requests (the VS Code extension).") == \
        "A loopback port that reaches the server's node API through…"
    long = summary_line("Redeem an invitation: registers your public key; you get an account on every node.")
    assert long == "Redeem an invitation" and "\n" not in long


def typer_apps():
    from mtgpu.cli import python, setup
    return [remotegpu.app, job.app, admin.app, container.app, python.app, setup.app]


def every_help_text(command, path=""):
    """(where, text) of every help text of a click command and of its subcommands."""
    import click
    where = path or command.name or "app"
    for kind in ("help", "short_help", "epilog"):
        if getattr(command, kind, None):
            yield f"{where} {kind}", getattr(command, kind)
    for p in command.params:
        if getattr(p, "help", None):
            yield f"{where} {p.name}", p.help
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from every_help_text(sub, f"{where} {name}")


def test_no_help_text_of_ours_reads_as_rich_markup_or_emoji():
    """typer prints help through rich markup (emoji codes included): each text must come
    out as written."""
    import inspect

    import typer.main
    from rich.text import Text
    for app in typer_apps():
        for where, text in every_help_text(typer.main.get_command(app)):
            text = inspect.cleandoc(text)
            assert Text.from_markup(text).plain == text, f"{where}: {text!r}"


def test_typers_own_errors_print_our_values_as_given():
    result = CliRunner().invoke(job.app, [":m:[bold]x[/]"], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "No such command ':m:[bold]x[/]'" in result.output, result.output


def test_nodes_of_mixed_versions_get_one_note_that_fits_80_columns():
    from mtgpu.cli.nodes_table import node_notes
    same = [{"name": f"m{i}", "state": "up", "mtgpu_version": "0.9.0", "state_format": 1} for i in range(3)]
    assert node_notes(same, 80) == []
    mixed = same[:2] + [{"name": "m2", "state": "up", "mtgpu_version": "0.10.0", "state_format": 2}]
    lines = node_notes(mixed, 80)
    text = " ".join(lines)
    assert all(len(line) <= 80 for line in lines), lines
    assert "0.9.0 (state format 1) on m0, m1" in text and "0.10.0 (state format 2) on m2" in text, text
    assert "newer than state format 1 wait" in text, text

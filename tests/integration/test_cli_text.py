"""What the CLIs print, end to end against a real node (issue 27 points 2-3): an error of
ours is printed as written, never read as rich emoji or markup (`mt-job submit --time xyz`
said `(hⓂs)`), and a table through a pipe keeps every cell whole on one line."""

from __future__ import annotations

import pytest

from tests.support.node import running_node
from tests.support.users import can_create_users

if can_create_users():
    pytest.skip(can_create_users(), allow_module_level=True)

GPUS = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 1}]


def test_errors_print_as_written_and_piped_tables_keep_every_cell(alice):
    with running_node(GPUS) as node:
        r = node.mt_job(alice, "submit", "--time", "xyz", "--wrap", "true")
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert "(h:m:s)" in r.stderr and "Ⓜ" not in r.stderr, r.stderr
        jid = node.submit_json(alice, "--gpus", "1", "-J", "[bold]name[/]:m:", "--wrap", "true")["job_id"]
        node.wait_state(jid, {"completed", "failed"})
        listed = node.mt_job(alice, "list")
        assert listed.returncode == 0, listed.stderr
        line = next(ln for ln in listed.stdout.splitlines() if ln.split()[:1] == [str(jid)])
        assert "[bold]name[/]:m:" in line and "…" not in listed.stdout, listed.stdout
        days = node.admin("usage", "--by", "day")
        assert days.returncode == 0, days.stderr
        rows = [ln for ln in days.stdout.splitlines() if ln[:4].isdigit()]
        assert rows and all(len(ln.split()[0]) == 10 for ln in rows) and "…" not in days.stdout, days.stdout
        assert "RUN HOURS" in days.stdout and "left out" not in days.stdout, days.stdout

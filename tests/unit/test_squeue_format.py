"""`mt-job list --state/--format` as squeue's (mtgpu/cli/squeue.py)."""

from __future__ import annotations

import pytest

from mtgpu.cli import squeue

NOW = 1_800_000_000.0


def job(**kw):
    base = {"id": 12, "name": "train", "state": "running", "tenant": "alice", "nodes": ["gpu1"],
            "gpus": [{"fraction": 1.0}, {"fraction": 1.0}], "submitted_at": NOW - 4000, "started_at": NOW - 3725,
            "ended_at": None, "reason": None, "array_index": None, "array_parent": None,
            "spec": {"cpus": 8.0, "mem_bytes": 32 << 30, "time_limit_s": 7200.0, "nodes": 1}}
    return {**base, **kw}


def test_states_take_ours_and_slurms_names_and_codes():
    assert squeue.parse_states("R,PD") == {"running", "queued"}
    assert squeue.parse_states("PENDING,completed,ca") == {"queued", "completed", "cancelled"}
    assert squeue.parse_states("all") == set(squeue.CODES)
    with pytest.raises(squeue.FormatError, match="'zz' is no state; use queued, running"):
        squeue.parse_states("R,zz")


def test_format_fields_as_squeue_prints_them():
    fmt = "%.8i %.10j %.9T %t %.10M %.6D %b %l %R"
    assert squeue.render(job(), fmt, NOW) == "      12      train   RUNNING R    1:02:05      1 2 2:00:00 gpu1"
    queued = job(state="queued", nodes=[], gpus=[], started_at=None, reason="waiting for job 11 (running)")
    assert squeue.render(queued, "%i %t %M %R", NOW) == "12 PD 0:00 (waiting for job 11 (running))"
    assert squeue.render(job(state="completed", ended_at=NOW - 3600 + 5), "%M", NOW) == "2:10"
    assert squeue.render(job(started_at=NOW - 90061), "%M", NOW) == "1-01:01:01"
    assert squeue.render(job(gpus=[{"fraction": 0.5}]), "%b|%10j|", NOW) == "0.5|train     |"
    assert squeue.render(job(), "%u %% %C %m %K %F", NOW) == "alice % 8.0 32768M N/A 12"
    assert squeue.header("%.8i %.9T %R") == "   JOBID     STATE NODELIST(REASON)"


@pytest.mark.parametrize("fmt, says", [("%i %Z", "%Z is not a field here"), ("100%", "a '%' that starts no field")])
def test_a_format_with_an_unknown_field_is_refused_listing_the_fields(fmt, says):
    with pytest.raises(squeue.FormatError) as e:
        squeue.check_format(fmt)
    assert says in str(e.value) and "%i job id" in str(e.value) or "write %%" in str(e.value)

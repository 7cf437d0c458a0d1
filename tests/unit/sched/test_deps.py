"""Queue dependencies: when a job may start, must wait, or never can (mtgpu/sched/deps.py)."""

from __future__ import annotations

import pytest

from mtgpu.model.job import JobState as S
from mtgpu.jobfile.after import parse_after, render_after
from mtgpu.sched.deps import NEVER, READY, WAITING, verdict


def states(table):
    return lambda jid: table.get(jid)


@pytest.mark.parametrize("after, table, state, reason", [
    ([("afterok", (1,))], {1: [S.RUNNING]}, WAITING, "waiting for job 1 (running)"),
    ([("afterok", (1,))], {1: [S.QUEUED]}, WAITING, "waiting for job 1 (queued)"),
    ([("afterok", (1,))], {1: [S.COMPLETED]}, READY, None),
    ([("afterok", (1,))], {1: [S.FAILED]}, NEVER, "dependency afterok:1 can never be met: job 1 ended failed"),
    ([("afterok", (1,))], {1: [S.CANCELLED]}, NEVER, "job 1 ended cancelled"),
    ([("afterok", (1, 2))], {1: [S.COMPLETED], 2: [S.RUNNING]}, WAITING, "waiting for job 2 (running)"),
    ([("afterany", (1,))], {1: [S.FAILED]}, READY, None),
    ([("afterany", (1,))], {1: [S.LOST]}, READY, None),
    ([("afterany", (1,))], {1: [S.RUNNING]}, WAITING, "waiting for job 1"),
    ([("afternotok", (1,))], {1: [S.FAILED]}, READY, None),
    ([("afternotok", (1,))], {1: [S.COMPLETED]}, NEVER, "afternotok:1 can never be met: job 1 completed"),
    ([("afternotok", (1,))], {1: [S.RUNNING]}, WAITING, "waiting for job 1"),
    # an array: every task
    ([("afterok", (5,))], {5: [S.COMPLETED, S.RUNNING, S.QUEUED]}, WAITING, "waiting for job 5 (running)"),
    ([("afterok", (5,))], {5: [S.COMPLETED, S.FAILED, S.RUNNING]}, NEVER, "job 5 ended failed"),
    ([("afterok", (5,))], {5: [S.FAILED, S.CANCELLED]}, NEVER, "job 5 had 2 tasks end cancelled, failed"),
    ([("afternotok", (5,))], {5: [S.COMPLETED, S.FAILED]}, READY, None),
    ([("afternotok", (5,))], {5: [S.FAILED, S.RUNNING]}, WAITING, "waiting for job 5"),
    # every dependency must hold; one that never can decides
    ([("afterany", (1,)), ("afterok", (2,))], {1: [S.RUNNING], 2: [S.FAILED]}, NEVER, "afterok:2"),
    ([("afterany", (1,)), ("afterok", (2,))], {1: [S.FAILED], 2: [S.COMPLETED]}, READY, None),
    ([("afterok", (9,))], {}, NEVER, "there is no job 9"),
    ([], {}, READY, None),
])
def test_verdict(after, table, state, reason):
    v = verdict(after, states(table))
    assert v.state == state
    if reason is None:
        assert v.reason is None
    else:
        assert reason in v.reason, v.reason


def test_parse_and_render():
    assert parse_after("afterok:12:13,afterany:14") == (("afterok", (12, 13)), ("afterany", (14,)))
    assert parse_after("AfterOK:12:12") == (("afterok", (12,)),)
    assert render_after(parse_after("afterok:12:13,afternotok:2")) == "afterok:12:13,afternotok:2"


@pytest.mark.parametrize("text, says", [
    ("after:12", "'after' is not a dependency kind we have; use afterok, afternotok, afterany"),
    ("afterok", "afterok: needs job ids"), ("afterok:x", "needs job ids (whole numbers), not 'x'"),
    ("afterok:12?afterany:13", "either-or dependencies ('?') are not available"),
    ("afterok:12+5", "a delay after the job ('+MINUTES') is not available"),
    ("singleton", "'singleton' is not a dependency kind"), ("afterok:0", "needs job ids"),
])
def test_parse_refuses_saying_what_is_allowed(text, says):
    with pytest.raises(ValueError) as e:
        parse_after(text)
    assert says in str(e.value)

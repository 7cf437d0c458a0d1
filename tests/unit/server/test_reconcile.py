"""The agent's pure decision (server/member/reconcile.py): what a member starts, stops
and reports, given the committed placements and the runs on the machine."""

from mtgpu.agent.runners.base import ExitInfo, LocalRun
from mtgpu.server.member.reconcile import Forget, LateReport, PlacedRank, Report, Start, Stop, reconcile

NOW = 1000.0


def placed(job_id=1, attempt=0, rank=0, ranks=1, started_at=900.0, time_limit_s=None, requeue=True, master_port=None,
           rank_done=False) -> PlacedRank:
    return PlacedRank(job_id, attempt, rank, ranks, started_at, time_limit_s, requeue, master_port, rank_done)


def run(job_id=1, attempt=0, ended=None) -> dict[int, LocalRun]:
    return {job_id: LocalRun(job_id, attempt, ended)}


def decide(p=(), runs=None, unsent=(), late=(), in_sync=True, now=NOW, refused=()):
    return reconcile(list(p), runs or {}, set(unsent), set(late), in_sync, now, "m0", frozenset(refused))


EXIT0 = ExitInfo(0, None, "exited with code 0")
FENCED = ExitInfo(None, 9, "fenced: this node's agent lost contact", fenced=True)
LOST = ExitInfo(None, None, "the machine restarted while it ran (boot 1111, now 2222), which killed its processes; "
                            "no exit record", lost=True)
UNKNOWN = ExitInfo(None, None, "its supervisor (the job's shim) was killed in this boot of the machine and its "
                               "processes ran on without it until 2026-12-02 09:00:00 UTC; its exit status is unknown "
                               "(it may have run to its end)", unknown=True)
STOPPED = ExitInfo(None, 15, "killed by SIGTERM (stopped)", stopped=True)


def test_a_placed_rank_with_no_run_is_started():
    assert decide([placed()]) == [Start(placed())]


def test_nothing_starts_while_the_member_reads_a_stale_state():
    assert decide([placed()], in_sync=False) == []


def test_a_gang_rank_waits_for_rank_zero_to_publish_the_port():
    assert decide([placed(rank=1, ranks=2)]) == []
    assert decide([placed(rank=0, ranks=2)]) == [Start(placed(rank=0, ranks=2))]
    assert decide([placed(rank=1, ranks=2, master_port=4242)]) == [Start(placed(rank=1, ranks=2, master_port=4242))]


def test_a_gang_rank_that_already_ended_well_is_not_started_again():
    assert decide([placed(rank=1, ranks=2, master_port=1, rank_done=True)]) == []


def test_an_ended_run_of_the_placed_attempt_is_reported():
    assert decide([placed()], run(ended=EXIT0)) == [Report(1, 0, 0, "finish", {"exit_code": 0, "reason": ""})]


def test_nothing_is_decided_out_of_sync_not_even_an_end_report():
    """A stale replica may still place an attempt the cluster requeued: reporting its end
    as that attempt's would be refused, and the run must be reported late instead."""
    assert decide([placed()], run(ended=EXIT0), in_sync=False) == []
    assert decide([placed(started_at=NOW - 61, time_limit_s=60)], run(), in_sync=False) == []


def test_a_refused_end_report_is_not_sent_again_and_the_run_is_kept():
    assert decide([placed()], run(ended=EXIT0), refused=[(1, 0)]) == []
    # once the state shows the attempt requeued off this member, it is reported late
    assert decide([], run(ended=EXIT0), late=[(1, 0)], refused=[(1, 0)]) == [LateReport(1, 0, EXIT0)]


def test_a_failed_exit_is_reported_with_its_reason():
    ended = ExitInfo(3, None, "exited with code 3")
    assert decide([placed()], run(ended=ended)) == [Report(1, 0, 0, "finish", {"exit_code": 3,
                                                                             "reason": "exited with code 3"})]


def test_a_fenced_single_job_is_requeued_not_failed():
    [r] = decide([placed()], run(ended=FENCED))
    assert r.command == "requeue" and r.attempt == 0 and "fenced" in r.args["reason"]


def test_a_job_killed_by_a_restart_of_its_machine_is_requeued_unless_it_asked_not_to_be():
    [r] = decide([placed()], run(ended=LOST))
    assert r.command == "requeue" and r.args["reason"].startswith("on m0: the machine restarted")
    [r] = decide([placed(requeue=False)], run(ended=LOST))
    assert r.command == "finish" and r.args["state"] == "lost" and "asked not to be requeued" in r.args["reason"]


def test_a_job_whose_supervisor_died_and_whose_processes_ended_unrecorded_fails_and_is_never_requeued():
    # It may have run to its end: run again, a finished job would run twice (issue 23).
    for p in (placed(), placed(requeue=False)):
        [r] = decide([p], run(ended=UNKNOWN))
        assert r.command == "finish" and r.args["state"] == "failed" and "exit_code" not in r.args
        assert r.args["reason"] == f"on m0: {UNKNOWN.reason}; not requeued, so that it does not run twice"
    [r] = decide([placed(rank=1, ranks=2, master_port=1)], run(ended=UNKNOWN))
    assert (r.command, r.rank, r.args["state"]) == ("finish", 1, "failed")


def test_a_requeued_attempt_whose_end_is_unknown_is_not_reported_late():
    assert decide([placed(attempt=1)], run(attempt=0, ended=UNKNOWN), late=[(1, 0)]) == [Forget(1)]


def test_a_fenced_gang_rank_fails_the_gang():
    [r] = decide([placed(rank=1, ranks=2, master_port=1)], run(ended=FENCED))
    assert r.command == "finish" and r.args["state"] == "failed" and r.rank == 1


def test_a_run_past_its_time_limit_is_stopped_and_reported_failed():
    p = placed(started_at=NOW - 61, time_limit_s=60)
    stop, report = decide([p], run())
    assert stop == Stop(1, "time limit 00:01:00 reached")
    assert report.command == "finish" and report.args["state"] == "failed" and "time limit" in report.args["reason"]
    assert decide([placed(started_at=NOW - 59, time_limit_s=60)], run()) == []


def test_a_time_limit_counts_on_the_monotonic_clock_from_the_local_start_whatever_the_wall_clock_says():
    started_here = {1: LocalRun(1, 0, None, started_mono=500.0)}
    # the wall clock jumped an hour forward: the recorded start looks an hour old, the run is 30 s old
    jumped = reconcile([placed(started_at=NOW - 30, time_limit_s=60)], started_here, set(), set(), True,
                       NOW + 3600, "m0", mono_now=530.0)
    assert jumped == []
    # and back: the recorded start looks in the future, yet the run has gone on for 61 s
    back = reconcile([placed(started_at=NOW - 61, time_limit_s=60)], started_here, set(), set(), True,
                     NOW - 3600, "m0", mono_now=561.0)
    assert back[0] == Stop(1, "time limit 00:01:00 reached")


def test_a_run_of_another_attempt_is_stopped_then_forgotten_once_stopped():
    assert decide([placed(attempt=1)], run(attempt=0)) == [Stop(1, "attempt 0 is no longer placed here")]
    assert decide([placed(attempt=1)], run(attempt=0, ended=STOPPED)) == [Forget(1)]


def test_a_run_no_longer_placed_here_is_left_alone_while_out_of_sync():
    assert decide([], run(), in_sync=False) == []
    assert decide([], run(ended=EXIT0), late=[(1, 0)], in_sync=False) == []


def test_a_requeued_attempt_that_ended_here_by_itself_is_reported_late():
    assert decide([], run(ended=EXIT0), late=[(1, 0)]) == [LateReport(1, 0, EXIT0)]
    # ...also while its copy runs elsewhere
    assert decide([placed(job_id=2)], {1: LocalRun(1, 0, EXIT0), 2: LocalRun(2, 0, None)}, late=[(1, 0)]) == [
        LateReport(1, 0, EXIT0)]


def test_a_requeued_attempt_that_was_fenced_or_stopped_is_only_forgotten():
    assert decide([], run(ended=FENCED), late=[(1, 0)]) == [Forget(1)]
    assert decide([], run(ended=STOPPED), late=[(1, 0)]) == [Forget(1)]


def test_an_ended_run_of_a_cancelled_job_is_forgotten_without_a_report():
    assert decide([], run(ended=STOPPED)) == [Forget(1)]


def test_a_job_whose_report_is_being_sent_is_left_alone():
    assert decide([placed()], run(ended=EXIT0), unsent=[1]) == []
    assert decide([placed()], unsent=[1]) == []


def test_a_preempted_run_is_signalled_and_its_end_reported_as_any_end():
    from mtgpu.server.member.reconcile import Preempt
    p = PlacedRank(1, 0, 0, 1, 900.0, None, True, None, False, 30.0)
    assert decide([p], run()) == [Preempt(1, 0, 30.0)]
    # it exited by itself within the grace: its status, for the state machine to requeue it
    assert decide([p], run(ended=EXIT0)) == [Report(1, 0, 0, "finish", {"exit_code": 0, "reason": ""})]
    # killed after the grace (the agent stopped it): said so, not taken for a failure of its member
    assert decide([p], run(ended=STOPPED)) == [Report(1, 0, 0, "finish", {
        "state": "failed", "reason": "it did not end within the 30s grace period: killed"})]
    # a time limit reached meanwhile still stops it
    late = PlacedRank(1, 0, 0, 1, 0.0, 60.0, True, None, False, 30.0)
    assert isinstance(decide([late], run())[0], Stop)

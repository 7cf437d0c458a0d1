"""`mt-job show` and `mt-container show` print a job's history the same way (cli/common.py),
with the note of an attempt its member reported later to have run to the end."""

from mtgpu.cli.common import history_line, print_fields


def test_an_attempt_says_where_it_ran_and_how_it_ended():
    assert history_line({"attempt": 0, "nodes": ["a", "b"], "outcome": "requeued: node a lost"}) == \
        "attempt 0 on a,b: requeued: node a lost"
    assert history_line({"attempt": 1, "nodes": [], "outcome": "cancelled"}) == "attempt 1 on -: cancelled"


def test_a_late_report_is_noted_unless_it_was_taken():
    h = {"attempt": 0, "nodes": ["a"], "outcome": "requeued: node a lost",
         "late": {"state": "completed", "exit_code": 0, "reason": "", "at": 1.0, "taken": False}}
    assert history_line(h) == ("attempt 0 on a: requeued: node a lost; its member reported later that it also "
                               "ran there to the end (completed, exit 0)")
    assert history_line({**h, "late": {**h["late"], "exit_code": None, "state": "failed"}}).endswith("(failed)")
    assert history_line({**h, "late": {**h["late"], "taken": True}}) == "attempt 0 on a: requeued: node a lost"


def test_show_prints_the_fields_then_the_history(capsys):
    print_fields([("id", 7), ("state", "running")], [{"attempt": 0, "nodes": ["a"], "outcome": "requeued"}])
    assert capsys.readouterr().out.splitlines() == ["        id  7", "     state  running",
                                                    "   history  attempt 0 on a: requeued"]

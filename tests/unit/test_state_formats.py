"""State formats (issue 29 point 1): a member never applies, and never proposes, what some
member of its cluster cannot apply. A command or snapshot of a newer format than this
mtgpu knows is refused (nothing of it applied), naming both formats, by the state machine,
the standalone journal (at start) and the Raft replica (which stops at that entry and
tells the server once); a command of a format above the cluster's floor is not proposed.
A command of the next format is made here by raising an existing command's format (the
monkeypatch stands for the next mtgpu), then lowering STATE_FORMAT back (this one)."""

from __future__ import annotations

import time

import pytest

from mtgpu.server.cluster.formats import SILENT_S, StateFormats
from mtgpu.state import commands as C
from mtgpu.state.journal import JournalCorrupt, JournaledState
from mtgpu.state.machine import StateMachine
from mtgpu.state.raft import format_gate
from mtgpu.state.store import ReplicationError
from tests.unit.test_raft_files import _free_address, _lone_replica, _wait


NEXT = C.STATE_FORMAT + 1  # the next mtgpu's format
THIS = C.STATE_FORMAT


def _newer(monkeypatch):
    """This process as the next mtgpu: state format NEXT, tenant.seen.v1 one of its commands."""
    monkeypatch.setattr(C, "STATE_FORMAT", NEXT)
    monkeypatch.setitem(C.FORMAT_OF, C.TENANT_SEEN, NEXT)


def _older(monkeypatch):
    """... and back as this one."""
    monkeypatch.setattr(C, "STATE_FORMAT", THIS)
    monkeypatch.setitem(C.FORMAT_OF, C.TENANT_SEEN, 1)


def _machine_with_a_tenant() -> StateMachine:
    sm = StateMachine()
    assert sm.apply(C.command(C.TENANT_ENSURE, name="alice", uid=2001, gid=2001, at=1.0))["ok"]
    return sm


def test_format_1_commands_are_written_as_before_and_a_newer_one_carries_its_format(monkeypatch):
    assert C.command(C.TENANT_SEEN, name="alice", at=2.0) == {"cmd": C.TENANT_SEEN, "args": {"name": "alice", "at": 2.0}}
    assert set(C.FORMAT_OF) == set(C.ALL_COMMANDS) and max(C.FORMAT_OF.values()) == C.STATE_FORMAT
    _newer(monkeypatch)
    assert C.command(C.TENANT_SEEN, name="alice", at=2.0)["format"] == NEXT


def test_the_machine_refuses_a_command_of_a_newer_format_and_changes_nothing(monkeypatch):
    sm = _machine_with_a_tenant()
    _newer(monkeypatch)
    newer = C.command(C.TENANT_SEEN, name="alice", at=2.0)
    _older(monkeypatch)
    before = (sm.applied, sm.to_dict())
    with pytest.raises(C.NewerFormat) as e:
        sm.apply(newer)
    assert (sm.applied, sm.to_dict()) == before
    why = str(e.value)
    assert "'tenant.seen.v1'" in why and f"state format {NEXT}" in why and f"applies state format {THIS} at most" in why, why
    assert "mtgpu-setup upgrade" in why, why
    # an unknown name without a format is answered as before (damage or a foreign command, not a newer mtgpu)
    assert sm.apply({"cmd": "no.such.v1", "args": {}}) == {"ok": False, "error": "unknown command 'no.such.v1'"}


def test_a_snapshot_says_the_newest_format_in_it_and_an_older_mtgpu_refuses_it(monkeypatch):
    sm = _machine_with_a_tenant()
    assert sm.to_dict()["version"] == 1  # nothing newer applied: an older member reads it as before
    _newer(monkeypatch)
    assert sm.apply(C.command(C.TENANT_SEEN, name="alice", at=2.0))["ok"]
    snap = sm.to_dict()
    assert snap["version"] == NEXT and StateMachine.from_dict(snap).to_dict()["version"] == NEXT
    _older(monkeypatch)
    with pytest.raises(C.NewerFormat) as e:
        StateMachine.from_dict(snap)
    assert f"the state snapshot is of state format {NEXT}" in str(e.value) and f"applies state format {THIS}" in str(e.value)


def test_a_standalone_journal_with_a_newer_entry_refuses_the_start_naming_file_entry_and_formats(tmp_path,
                                                                                                 monkeypatch):
    js = JournaledState(tmp_path)
    assert js.apply(C.command(C.TENANT_ENSURE, name="alice", uid=2001, gid=2001, at=1.0))["ok"]
    _newer(monkeypatch)
    assert js.apply(C.command(C.TENANT_SEEN, name="alice", at=2.0))["ok"]
    js.close()
    assert JournaledState(tmp_path).machine.applied == 2  # the newer mtgpu reads it
    _older(monkeypatch)
    with pytest.raises(JournalCorrupt) as e:
        JournaledState(tmp_path)
    why = str(e.value)
    assert f"the journal {tmp_path / 'journal.jsonl'}, entry 2 (tenant.seen.v1) at line 2" in why, why
    assert f"state format {NEXT}" in why and f"applies state format {THIS} at most" in why, why


def test_a_command_of_a_format_above_the_floor_is_not_proposed(monkeypatch):
    _newer(monkeypatch)
    newer = C.command(C.TENANT_SEEN, name="alice", at=2.0)
    assert format_gate(newer, NEXT) == ""
    why = format_gate(newer, 1)
    assert f"tenant.seen.v1 is of state format {NEXT}" in why and "applies state format 1 at most" in why, why
    assert format_gate(C.command(C.TENANT_ENSURE, name="a", uid=1, gid=1, at=1.0), 1) == ""


def test_the_floor_is_the_oldest_format_of_every_member_the_cluster_lists(monkeypatch):
    _newer(monkeypatch)
    now = [100.0]
    f = StateFormats("m1", clock=lambda: now[0])
    members = ["m1", "m2", "m3"]
    assert f.floor_of(members) == 1  # m2 and m3 not heard: they may run an older mtgpu
    f.heard("m2", {"state_format": NEXT, "mtgpu_version": "0.9.1"})
    assert f.floor_of(members) == 1
    f.heard("m3", {"node": "m3"})  # an mtgpu from before formats says none
    assert f.floor_of(members) == 1 and f.versions()["m3"]["state_format"] == 1
    f.heard("m3", {"state_format": NEXT})
    assert f.floor_of(members) == NEXT and f.floor(True, members) == NEXT
    now[0] += SILENT_S + 0.1  # both silent (restarting, perhaps with another version): the oldest again
    assert f.floor_of(members) == 1
    f.heard("m2", {"state_format": NEXT})
    f.heard("m3", {"state_format": NEXT})
    assert f.floor_of(members) == NEXT
    f.heard("m3", {"state_format": True})  # not a format: counted as the oldest
    assert f.floor_of(members) == 1
    # a member that does not lead uses what the scheduler told it; an old scheduler tells nothing
    assert f.floor(False, members) == 1
    f.told(NEXT)
    assert f.floor(False, members) == NEXT
    now[0] += SILENT_S + 0.1  # no answer since: the scheduler may have changed
    assert f.floor(False, members) == 1
    f.told(NEXT)
    assert f.floor(False, members) == NEXT
    f.told(None)
    assert f.floor(False, members) == 1
    _older(monkeypatch)
    f.told(NEXT + 3)
    assert f.floor(False, members) == THIS  # never above what this mtgpu writes


def test_a_replica_does_not_propose_above_its_floor_and_stops_at_a_newer_entry(tmp_path, monkeypatch):
    told: list[str] = []
    address = _free_address()
    from mtgpu.state.raft import RaftState
    monkeypatch.setattr(RaftState, "__init__", _with(RaftState.__init__, on_newer=told.append,
                                                     format_floor=lambda: 1))
    rs = _lone_replica(tmp_path, address)
    try:
        assert rs.apply(C.command(C.TENANT_ENSURE, name="alice", uid=2001, gid=2001, at=1.0))["ok"]
        _newer(monkeypatch)
        with pytest.raises(ReplicationError) as e:
            rs.apply(C.command(C.TENANT_SEEN, name="alice", at=2.0))
        assert f"state format {NEXT}" in str(e.value) and not e.value.proposed, str(e.value)
        _older(monkeypatch)
        applied = rs.machine.applied
        # what a newer member wrote into the log (past this one's gate: its floor was 2)
        with pytest.raises(ReplicationError):
            rs.apply({"cmd": C.TENANT_SEEN, "args": {"name": "alice", "at": 3.0}, "format": NEXT}, timeout_s=3)
        _wait("the replica to tell the server", lambda: told)
        assert len(told) == 1 and f"state format {NEXT}" in told[0] and f"applies state format {THIS}" in told[0], told
        with pytest.raises(ReplicationError):  # nothing after it is applied either
            rs.apply(C.command(C.TENANT_ENSURE, name="bob", uid=2002, gid=2002, at=4.0), timeout_s=2)
        time.sleep(0.5)
        assert rs.machine.applied == applied and "bob" not in rs.machine.tenants and len(told) == 1
    finally:
        rs.close()


def _with(init, **extra):
    def patched(self, *args, **kwargs):
        init(self, *args, **{**extra, **kwargs})
    return patched

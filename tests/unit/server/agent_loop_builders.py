"""Builders for the agent loop's tests: member m1's loop over a store of its own, and the
loop's monotonic clock moved by hand.

    def test_x(tmp_path, monkeypatch):
        clock = hand_moved_clock(monkeypatch)
        loop, store = agent_loop(tmp_path, agent)
        clock[0] += 1.0
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

from mtgpu.server.member import agent_loop as agent_loop_mod
from mtgpu.server.member.agent_loop import AgentLoop
from mtgpu.state import commands as C


class FakeStore:
    """The part of a Store the loop uses here: its jobs, its lock, and commits."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.machine = SimpleNamespace(jobs={})
        self.committed: list[dict] = []

    def apply(self, command: dict) -> dict:
        self.committed.append(command)
        if command["cmd"] == C.JOB_ANNOTATE and "ws" in command["args"]:
            self.machine.jobs[command["args"]["job_id"]].ws.update(command["args"]["ws"])
        return {"ok": True}


def agent_loop(tmp_path, agent, lease=None) -> tuple[AgentLoop, FakeStore]:
    """Member m1's loop (homes under /homes, STATE_DIR tmp_path, the wall clock at 0) over an
    empty FakeStore, with `agent` and, in a cluster, the member's `lease`."""
    store = FakeStore()
    return AgentLoop(store, agent, "m1", "/homes", tmp_path, clock=lambda: 0.0, lease=lease), store


def hand_moved_clock(monkeypatch) -> list[float]:
    """The loop's monotonic clock (time.monotonic() in agent_loop), at 1000.0 until a test
    moves it by hand: clock[0] = ... (the wall clock is the loop's `clock`)."""
    now = [1000.0]
    monkeypatch.setattr(agent_loop_mod, "time", SimpleNamespace(monotonic=lambda: now[0]))
    return now

"""pysyncobj's Raft thread, woken when something is due rather than on a fixed beat.

pysyncobj's thread runs a tick, then waits in poll for `autoTickPeriod` or until a message
arrives. Its timers are checked only in ticks: the leader's next heartbeat
(`appendEntriesPeriod`) and a follower's election deadline. With the default 50 ms period
every member woke 20 times a second even when nothing was due, and that was most of what
an idle member cost (bench/idle_member.py, issue 28 target 5). Here the wait ends when the
next of those timers is due, so the period is only an upper bound (IDLE_TICK_S) for
pysyncobj's slow chores: reconnecting to a member (every `connectionRetryTime`), its
journal's metadata, log compaction. Work handed to the thread from outside (RaftState's
tick jobs) wakes it through pysyncobj's own notifier, as a proposed command does.

pysyncobj also ends its thread, without a word, once the thread that built the replica has
ended (it means the program's main thread). A replica reopened in a new role is built on
the thread of the API call that asked for it, a worker that AnyIO ends after 10 s idle:
the Raft thread of a member just promoted or demoted stopped some seconds later, and a
cluster whose only voter it was committed nothing more (seen in a rolling upgrade, where a
2-member cluster had moved its one vote). The program's main thread is the one that counts.
"""

from __future__ import annotations

import threading

from pysyncobj import SyncObj
from pysyncobj.monotonic import monotonic

IDLE_TICK_S = 0.5  # the longest wait between two ticks when nothing is due
OVERDUE_TICK_S = 0.05  # a timer due but not acted on (a follower connected to nobody): pysyncobj's old beat
SLACK_S = 0.001  # wake just after a timer is due, not just before it


class TimedSyncObj(SyncObj):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Read by the Raft thread at each tick; its first tick comes 0.1 s after the start,
        # while the thread building this one is still in here.
        self._SyncObj__mainThread = threading.main_thread()
        poll = self._poller.poll  # the wait at the end of every tick, after its work

        def timed_poll(timeout):
            return poll(self._wait_s(timeout))

        self._poller.poll = timed_poll

    def _wait_s(self, timeout: float) -> float:
        if timeout <= 0:
            return timeout
        wait = self._next_due() - monotonic() + SLACK_S
        if wait <= 0:
            # A leader's heartbeat fell due during this tick: the next tick sends it. Anything
            # else the tick did not act on (no one to stand against): the old beat, not a spin.
            return 0.0 if self._isLeader() else min(timeout, OVERDUE_TICK_S)
        return min(timeout, wait)

    def _next_due(self) -> float:
        if self._isLeader():
            return self._SyncObj__newAppendEntriesTime
        if self.selfNode is not None:  # a voter: its election deadline
            return self._SyncObj__raftElectionDeadline
        return float("inf")

    def wake(self) -> None:
        """From any thread: end the Raft thread's current wait (work was handed to it)."""
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)
        if notifier is not None:
            notifier.notify()

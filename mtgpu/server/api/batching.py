"""Group commit: concurrent submissions share one state-machine command.

Each durable command costs a Raft round trip (or an fsync standalone); when many
clients submit at once, the submissions waiting at that moment are committed
together as one `job.submit-batch.v1`, and each caller gets its own answer. A lone
submission goes out at once: batching never adds a wait. Batches are proposed
without waiting for the previous one, so replication is pipelined.

A proposal that fails while the leader changes has an unknown outcome: the old
leader may have replicated it, and the new one may commit it. Every submission
carries a key the state machine remembers, so the batch is proposed again (for up
to RETRY_FOR_S) and a submission that did get in answers with its jobs instead of
adding copies: a submit during a failover or a scheduler move gets one answer.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import secrets
import threading
import time

from ...state import commands as C
from ...state.store import ReplicationError, Store

MAX_BATCH = 256
RETRY_FOR_S = 12.0

log = logging.getLogger(__name__)


class _Pending:
    __slots__ = ("args", "loop", "future")

    def __init__(self, args: dict, loop: asyncio.AbstractEventLoop, future: asyncio.Future) -> None:
        self.args = args
        self.loop = loop
        self.future = future

    def resolve(self, result: dict | None, error: Exception | None) -> None:
        def set_it():
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        self.loop.call_soon_threadsafe(set_it)


class SubmitBatcher:
    def __init__(self, store: Store, clock) -> None:
        self.store = store
        self.clock = clock
        self._queue: queue.Queue[_Pending] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="mtgpu-submit-batcher", daemon=True)
        self._thread.start()

    async def submit(self, **args) -> dict:
        """Commit one submission (tenant, uid, gid, spec); returns its own answer."""
        loop = asyncio.get_running_loop()
        pending = _Pending({**args, "key": secrets.token_hex(16)}, loop, loop.create_future())
        self._queue.put(pending)
        return await pending.future

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if len(batch) == 1:
                p = batch[0]
                cmd = C.command(C.JOB_SUBMIT, at=self.clock(), **p.args)
                callback = p.resolve
            else:
                cmd = C.command(C.JOB_SUBMIT_BATCH, at=self.clock(), submissions=[p.args for p in batch])
                callback = _fan_out(batch)
            propose_until_decided(self.store, cmd, callback)


async def commit_until_decided(store: Store, cmd: dict) -> dict:
    """Await `cmd` (keyed or idempotent) committed, riding through a leader change."""
    loop = asyncio.get_running_loop()
    pending = _Pending({}, loop, loop.create_future())
    propose_until_decided(store, cmd, pending.resolve)
    return await pending.future


def propose_until_decided(store: Store, cmd: dict, callback, retry_for_s: float | None = None) -> None:
    """Propose `cmd` (which must be safe to apply twice: keyed or idempotent) and
    propose it again while the cluster answers that its leader changed under it (the
    outcome unknown: ReplicationError.in_flux); callback(result, error) runs once, with
    the last error after `retry_for_s`."""
    retry_for_s = RETRY_FOR_S if retry_for_s is None else retry_for_s
    deadline = time.monotonic() + retry_for_s
    tries = [0]
    answered = threading.Lock()

    def answer(result, error) -> None:
        if answered.acquire(blocking=False):
            watchdog.cancel()
            callback(result, error)

    def attempt() -> None:
        try:
            store.apply_async(cmd, done)
        except Exception as e:  # the store refused to even propose it
            done(None, e)

    def done(result, error) -> None:
        if error is None or not getattr(error, "in_flux", False):
            answer(result, error)
            return
        tries[0] += 1
        pause = min(0.2 * tries[0], 1.0)
        if time.monotonic() + pause > deadline:
            answer(None, ReplicationError(f"{error} (proposed {tries[0]} times in {retry_for_s:g} s)", in_flux=True))
            return
        log.info("proposing %s again in %.1f s: %s", cmd.get("cmd"), pause, error)
        timer = threading.Timer(pause, attempt)
        timer.daemon = True
        timer.start()

    # pysyncobj holds a proposal while it waits for a leader: answer anyway, in time
    watchdog = threading.Timer(retry_for_s, lambda: answer(None, ReplicationError(
        f"the cluster did not commit the change in {retry_for_s:g} s (no quorum reachable?); it may still be "
        "recorded once a majority is back: look before you repeat it")))
    watchdog.daemon = True
    watchdog.start()
    attempt()


def _fan_out(batch: list[_Pending]):
    def callback(result: dict | None, error: Exception | None) -> None:
        if error is not None or result is None:
            for p in batch:
                p.resolve(None, error)
            return
        answers = result["results"] if result.get("ok") else [result] * len(batch)
        for p, answer in zip(batch, answers):
            p.resolve(answer, None)

    return callback

"""Group commit: concurrent submissions share one state-machine command.

Each durable command costs a Raft round trip (or an fsync standalone); when many
clients submit at once, the submissions waiting at that moment are committed
together as one `job.submit-batch.v1`, and each caller gets its own answer. A lone
submission goes out at once: batching never adds a wait. Batches are proposed
without waiting for the previous one, so replication is pipelined.
"""

from __future__ import annotations

import asyncio
import queue
import threading

from ...state import commands as C
from ...state.store import Store

MAX_BATCH = 256


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
        pending = _Pending(args, loop, loop.create_future())
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
            try:
                self.store.apply_async(cmd, callback)
            except Exception as e:  # the store refused to even propose it
                callback(None, e)


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

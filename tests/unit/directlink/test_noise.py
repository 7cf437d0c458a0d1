"""What asyncio reports about a DirectLink loop becomes one log line (directlink/noise.py,
issue 26): a task whose exception nobody retrieved, a callback that raised, a task
destroyed while pending. Each gives exactly one line, at the level the loop's owner
installed, naming the coroutine (or callback) and the exception's type, with no
traceback: nothing of it may reach a user's terminal or fill a member's log."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from mtgpu.directlink import noise


class Lines(logging.Handler):
    """Every record any logger emits, formatted as a real handler would write it (a
    record with exc_info gets its traceback appended by the formatter)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
        self.records: list[logging.LogRecord] = []
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "asyncio" and record.getMessage().startswith("Using selector"):
            return  # a new loop's note (at DEBUG), not a report
        self.records.append(record)
        self.lines.append(self.format(record))


@pytest.fixture
def logged():
    handler, root = Lines(), logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def on_a_loop(level: int, body) -> None:
    """Run `body()` on a fresh loop with noise installed at `level`, then collect garbage
    (asyncio reports a lost task when the task is destroyed)."""
    loop = asyncio.new_event_loop()
    noise.install(loop, level)
    try:
        loop.run_until_complete(body())
        gc.collect()
        loop.run_until_complete(asyncio.sleep(0))  # reports made from __del__ are called soon
    finally:
        loop.close()
    gc.collect()


def the_one_line(logged: Lines, level: int) -> str:
    assert len(logged.lines) == 1, logged.lines
    record, line = logged.records[0], logged.lines[0]
    assert record.levelno == level and record.name == "mtgpu.directlink", (record.levelname, record.name)
    assert record.exc_info is None and "Traceback" not in line and "\n" not in line, line
    return line


async def fails_on_the_wire() -> None:
    await asyncio.sleep(0)
    raise ConnectionResetError("the peer went away")


def test_a_task_whose_exception_is_never_retrieved_is_one_line_naming_the_coroutine_and_the_error(logged):
    async def body():
        task = asyncio.ensure_future(fails_on_the_wire())
        await asyncio.sleep(0.05)
        assert task.done()
        del task  # nobody looked at its exception

    on_a_loop(logging.WARNING, body)
    line = the_one_line(logged, logging.WARNING)
    assert "Task exception was never retrieved" in line and "in fails_on_the_wire" in line, line
    assert "(ConnectionResetError: the peer went away)" in line, line


def test_a_callback_that_raises_is_one_line_naming_the_callback_and_the_error(logged):
    def send_keepalive() -> None:
        raise OSError(101, "Network is unreachable")

    async def body():
        asyncio.get_running_loop().call_soon(send_keepalive)
        await asyncio.sleep(0.05)

    on_a_loop(logging.INFO, body)
    line = the_one_line(logged, logging.INFO)
    assert "Exception in callback" in line and "send_keepalive" in line, line
    assert "(OSError: [Errno 101] Network is unreachable)" in line, line


def test_a_task_destroyed_while_pending_is_one_line_naming_the_coroutine(logged):
    async def waits_for_an_answer(answer: asyncio.Future) -> None:
        await answer

    async def body():
        task = asyncio.ensure_future(waits_for_an_answer(asyncio.get_running_loop().create_future()))
        await asyncio.sleep(0.05)
        assert not task.done()
        del task  # it and the future it waits on are now unreachable: destroyed while pending

    on_a_loop(logging.DEBUG, body)
    line = the_one_line(logged, logging.DEBUG)
    assert "Task was destroyed but it is pending!" in line and "in " in line and "waits_for_an_answer" in line, line


def test_without_it_asyncio_writes_a_traceback_which_is_what_it_turns_into_one_line(logged):
    """The same failure on a loop without noise: the default handler's record carries the
    traceback (so the tests above can fail)."""
    loop = asyncio.new_event_loop()
    try:
        async def body():
            task = asyncio.ensure_future(fails_on_the_wire())
            await asyncio.sleep(0.05)
            del task
        loop.run_until_complete(body())
        gc.collect()
    finally:
        loop.close()
    assert any("Traceback" in line for line in logged.lines), logged.lines

"""The terminal app in this process, driven by Textual's Pilot (`app.run_test()`):

    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, "the node's row", lambda: app.table("servers").row_of(key))
"""

from __future__ import annotations

import time
from typing import Callable


async def until(pilot, what: str, check: Callable[[], object], timeout_s: float = 20.0) -> None:
    """Let the app run until `check()` is true; an AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        await pilot.pause(0.1)
    raise AssertionError(f"waited {timeout_s} s for {what}")

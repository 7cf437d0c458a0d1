"""The real `remotegpu-cli` terminal app in a tmux session, driven as a person would:
keys in with `send-keys`, the screen out with `capture-pane`.

    with app_in_tmux(laptop_home) as app:
        app.wait("the servers view", lambda s: "node-a" in s)
        app.keys("3"); app.type("create template web"); app.keys("Enter")
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from tests.support.node import wait_for

REPO = Path(__file__).resolve().parents[2]


class TmuxApp:
    def __init__(self, session: str) -> None:
        self.session = session

    def screen(self) -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", self.session], capture_output=True,
                              text=True).stdout

    def alive(self) -> bool:
        return subprocess.run(["tmux", "has-session", "-t", self.session], capture_output=True).returncode == 0

    def keys(self, *keys: str) -> None:
        """tmux key names: "q", "Enter", "Escape", "C-c"."""
        subprocess.run(["tmux", "send-keys", "-t", self.session, *keys], check=True)

    def type(self, text: str) -> None:
        """Literal text, typed."""
        subprocess.run(["tmux", "send-keys", "-t", self.session, "-l", text], check=True)

    def wait(self, what: str, check: Callable[[str], object], timeout_s: float = 30.0):
        """Poll the screen until check(screen) is truthy; on a timeout the last screen is in the error."""
        try:
            return wait_for(what, lambda: check(self.screen()), timeout_s=timeout_s, interval_s=0.2)
        except AssertionError as e:
            raise AssertionError(f"{e}; the screen:\n{self.screen()}") from None


@contextmanager
def app_in_tmux(laptop_home: Path, refresh_s: float = 0.5) -> Iterator[TmuxApp]:
    """The app (python -m mtgpu.cli.remotegpu, this checkout) for the client folder laptop_home,
    in a 200x50 tmux session; the session is killed afterwards if the app did not end."""
    session = f"tui{os.getpid()}-{os.urandom(2).hex()}"
    cmd = f"REMOTEGPU_HOME={laptop_home} {sys.executable} -m mtgpu.cli.remotegpu --refresh {refresh_s}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "50", cmd], check=True,
                   env={**os.environ, "TERM": "xterm-256color"}, cwd=str(REPO))
    app = TmuxApp(session)
    try:
        yield app
    finally:
        if app.alive():
            print(app.screen())
            subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)

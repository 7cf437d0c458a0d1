"""The app's pop-up screens: every key (`?`), a notice too long for the status line, a
yes/no question before something that cannot be undone, and a job's log followed live."""

from __future__ import annotations

import threading

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Log, Static

from ..client.logs import copy_log


class HelpScreen(ModalScreen[None]):
    """Every key of the app and of each view, and the `:` commands."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Static(self.text, id="help-text", markup=False)


class NoticeScreen(HelpScreen):
    """What does not fit the status line: why a workspace could not start, with the end of
    its output. Esc or q closes it."""


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question: `y` answers yes, `n` or Escape no."""

    BINDINGS = [Binding("y", "answer(True)", "yes"), Binding("n,escape", "answer(False)", "no")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Static(f"{self.question}  [y/n]", id="question", markup=False)

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class _Closed(Exception):
    """The log screen was closed: stop following."""


class LogScreen(Screen[None]):
    """A job's log, followed until the job has ended (or the screen is closed)."""

    BINDINGS = [Binding("escape,q", "close", "back")]

    def __init__(self, cluster, job_id: int) -> None:
        super().__init__()
        self.cluster, self.job_id = cluster, job_id
        self._stop_following = threading.Event()

    def compose(self) -> ComposeResult:
        yield Static(f"log of job {self.job_id} on {self.cluster.name} (Esc: back)", id="log-title", markup=False)
        yield Log(id="log", highlight=False)
        yield Footer()

    def on_mount(self) -> None:
        self.run_worker(self._follow, thread=True, group="log")

    def _sleep(self, seconds: float) -> None:
        if self._stop_following.wait(seconds):
            raise _Closed()

    def _write(self, text: str) -> None:
        if not self._stop_following.is_set():
            self.app.call_from_thread(self.query_one("#log", Log).write, text)

    def _follow(self) -> None:
        try:
            part = self.cluster.call(lambda c: copy_log(c, self.job_id, lambda b: self._write(b.decode(errors="replace")),
                                                        follow=True, sleep=self._sleep,
                                                        notice=lambda t: self._write(f"\n[{t}]\n")))
            self._write(f"\n[job {self.job_id} {part.state}: end of log]\n")
        except _Closed:
            pass
        except Exception as e:  # noqa: BLE001 - shown in the log, the app keeps running
            self._write(f"\n[the log of job {self.job_id} cannot be read: {e}]\n")

    def action_close(self) -> None:
        self._stop_following.set()
        self.dismiss(None)

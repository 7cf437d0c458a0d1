"""The app's pop-up screens: every key (`?`), a notice too long for the status line (or
a row whole, `i`), a yes/no question before something that cannot be undone, and a job's
log followed live; and the key bar at the foot of the app."""

from __future__ import annotations

import threading
from typing import Callable

from rich.text import Text

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Log, Static

from ..client.logs import copy_log


class HelpScreen(ModalScreen[None]):
    """Every key of the app and of each view, and the `:` commands: a box that scrolls
    (arrows, j/k, PageUp/PageDown, Home/End) when they do not all fit. `text` is the text,
    or makes it for a width (it is made again when the terminal is resized)."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close"),
                Binding("j", "scroll('down')", "down", show=False), Binding("k", "scroll('up')", "up", show=False)]

    def __init__(self, text: str | Callable[[int], str]) -> None:
        super().__init__()
        self._make = text if callable(text) else None
        self.text = text if isinstance(text, str) else ""

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(self.text, id="help-text", markup=False)

    def on_mount(self) -> None:
        self.query_one("#help").focus()
        self._fill()

    def on_resize(self) -> None:
        self._fill()

    def _fill(self) -> None:
        if self._make is not None:
            # the box is 90% of the screen, less its border, padding and scrollbar
            self.text = self._make(max(30, int(self.app.size.width * 0.9) - 7))
            self.query_one("#help-text", Static).update(self.text)

    def action_scroll(self, where: str) -> None:
        box = self.query_one("#help", VerticalScroll)
        box.scroll_down(animate=False) if where == "down" else box.scroll_up(animate=False)


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


class KeyBar(Static):
    """The foot of the app: `key what` for as many keys as fit its width, in the order
    given, `? keys` (every key) always among them."""

    DEFAULT_CSS = "KeyBar { height: 1; background: $panel; }"
    KEY = "bold reverse"

    def __init__(self, **kw) -> None:
        super().__init__("", markup=False, **kw)
        self._items: list[tuple[str, str]] = []

    def show(self, items: list[tuple[str, str]]) -> None:
        self._items = items
        self.update(self.fit(items, self.app.size.width))

    def on_resize(self) -> None:
        self.update(self.fit(self._items, self.size.width or self.app.size.width))

    @classmethod
    def fit(cls, items: list[tuple[str, str]], width: int) -> Text:
        """As many items as fit `width`, `?` and `q` first; two spaces between them, or
        one when that shows more."""
        best: list[tuple[str, str]] = []
        for gap in (2, 1):
            must = [i for i in items if i[0] in ("?", "q")]
            room = width - 1 - sum(len(k) + len(d) + 1 + gap for k, d in must)
            kept = []
            for key, what in items:
                if (key, what) in must:
                    kept.append((key, what))
                elif len(key) + len(what) + 1 + gap <= room:
                    kept.append((key, what))
                    room -= len(key) + len(what) + 1 + gap
            if len(kept) > len(best):
                best, best_gap = kept, gap
        text = Text(" ")
        for key, what in best:
            text.append(key, cls.KEY)
            text.append(f" {what}" + " " * best_gap)
        return text


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
        yield KeyBar(id="log-keys")

    def on_show(self) -> None:
        self.query_one("#log-keys", KeyBar).show([("Esc", "back to the jobs"), ("?", "keys")])

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

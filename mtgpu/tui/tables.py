"""The three views' tables: a scrolling table of view-model rows that renders only the
lines on screen (textual's line API), so that a live refresh of thousands of rows costs
the visible lines, and the cursor stays on the same row (by key) across refreshes."""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from .rows import JOB_COLUMNS, SERVER_COLUMNS, WORKSPACE_COLUMNS, Row

GAP = 2
MAX_WIDTH = 60  # a longer cell (an error message) is cut on screen; `servers --live` has it whole
HEADER = Style(bold=True, reverse=True)
CURSOR = Style(reverse=True)
CURSOR_UNFOCUSED = Style(underline=True)


class RowTable(ScrollView, can_focus=True):
    """A view's table; `view` names it, `headings` are its columns' headings."""

    view = ""
    headings: tuple[str, ...] = ()
    BINDINGS = [
        Binding("up,k", "cursor(-1)", "up", show=False), Binding("down,j", "cursor(1)", "down", show=False),
        Binding("pageup", "page(-1)", "page up", show=False), Binding("pagedown", "page(1)", "page down", show=False),
        Binding("home", "cursor(-1000000000)", "first", show=False),
        Binding("end", "cursor(1000000000)", "last", show=False),
        Binding("enter", "select", "select", show=False),
    ]

    class RowSelected(Message):
        """Enter on a row."""

        def __init__(self, table: "RowTable", row: Row) -> None:
            super().__init__()
            self.table, self.row = table, row

    def __init__(self, **kw) -> None:
        super().__init__(id=self.view, **kw)
        self._rows: list[Row] = []
        self._index: dict[str, int] = {}
        self._widths = [len(h) for h in self.headings]
        self.cursor_row = 0

    # ------------------------------------------------------------ data
    def show(self, rows: list[Row]) -> None:
        """Show exactly these rows, in this order; the cursor follows its row."""
        selected = self.selected_key()
        self._rows = rows
        self._index = {r.key: i for i, r in enumerate(rows)}
        widths = [len(h) for h in self.headings]
        for r in rows:
            for i, c in enumerate(r.cells):
                if len(c) > widths[i]:
                    widths[i] = len(c)
        self._widths = [min(w, MAX_WIDTH) for w in widths]
        if selected in self._index:
            self.cursor_row = self._index[selected]
        self.cursor_row = max(0, min(self.cursor_row, len(rows) - 1))
        self.virtual_size = Size(sum(self._widths) + GAP * len(self._widths), len(rows) + 1)
        self.refresh()

    def selected_key(self) -> str | None:
        row = self.selected()
        return row.key if row is not None else None

    def selected(self) -> Row | None:
        return self._rows[self.cursor_row] if 0 <= self.cursor_row < len(self._rows) else None

    def row_of(self, key: str) -> Row | None:
        i = self._index.get(key)
        return self._rows[i] if i is not None else None

    def shown(self) -> list[Row]:
        return list(self._rows)

    # ------------------------------------------------------------ drawing
    def _line(self, cells: tuple[str, ...]) -> str:
        return "".join((c[:w - 1] + "~" if len(c) > w else c).ljust(w + GAP) for c, w in zip(cells, self._widths))

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        if y == 0:
            text, style = self._line(self.headings), HEADER
        else:
            index = scroll_y + y - 1
            if index >= len(self._rows):
                return Strip.blank(width)
            text = self._line(self._rows[index].cells)
            style = (CURSOR if self.has_focus else CURSOR_UNFOCUSED) if index == self.cursor_row else None
        text = text[scroll_x:scroll_x + width].ljust(width)
        return Strip([Segment(text, style)], width)

    # ------------------------------------------------------------ keys
    def _visible_rows(self) -> int:
        return max(1, self.size.height - 1)

    def action_cursor(self, delta: int) -> None:
        if not self._rows:
            return
        self.cursor_row = max(0, min(len(self._rows) - 1, self.cursor_row + delta))
        top = self.scroll_offset.y
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False)
        elif self.cursor_row >= top + self._visible_rows():
            self.scroll_to(y=self.cursor_row - self._visible_rows() + 1, animate=False)
        self.refresh()

    def action_page(self, direction: int) -> None:
        self.action_cursor(direction * self._visible_rows())

    def action_select(self) -> None:
        row = self.selected()
        if row is not None:
            self.post_message(self.RowSelected(self, row))

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()


class ServersTable(RowTable):
    view = "servers"
    headings = SERVER_COLUMNS
    BINDINGS = [Binding("t", "app.terminal", "terminal on the node"), Binding("v", "app.vscode", "VS Code (the node)")]


class JobsTable(RowTable):
    view = "jobs"
    headings = JOB_COLUMNS
    BINDINGS = [
        Binding("l", "app.logs", "follow logs"),
        Binding("c", "app.cancel_job", "cancel job"),
    ]


class WorkspacesTable(RowTable):
    view = "workspaces"
    headings = WORKSPACE_COLUMNS
    BINDINGS = [
        Binding("n", "app.create_workspace", "create"),
        Binding("s", "app.workspace('start')", "start"),
        Binding("x", "app.workspace('stop')", "stop"),
        Binding("d", "app.workspace('rm')", "remove"),
        Binding("t", "app.terminal", "terminal"),
        Binding("f", "app.forward", "forward ports"),
        Binding("v", "app.vscode", "VS Code (inside, or its node)"),
    ]


TABLES = (ServersTable, JobsTable, WorkspacesTable)

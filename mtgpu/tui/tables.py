"""The three views' tables: a scrolling table of view-model rows that renders only the
lines on screen (textual's line API), so that a live refresh of thousands of rows costs
the visible lines, and the cursor stays on the same row (by key) across refreshes.

Each table fits its width (docs/TUI.md, "Narrow screens"): when every column fits whole it
shows them all; otherwise it shows the rows' short cells (Row.short) with each column cut
to its narrow width, leaves out the columns that matter least (`drop`, in order) until its
last column has `flex_min` characters, and gives the last column what is left (cut with
'…'; `i` shows a row whole). Nothing scrolls sideways unless even that does not fit."""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from .rows import JOB_COLUMNS, SERVER_COLUMNS, SERVER_SHORT_COLUMNS, WORKSPACE_COLUMNS, Row

GAP = 2
MAX_WIDTH = 60  # a longer cell (an error message) is cut on screen; `i` and `servers --live` have it whole
CUT = "…"
HEADER = Style(bold=True, reverse=True)
CURSOR = Style(reverse=True)
CURSOR_UNFOCUSED = Style(underline=True)


class RowTable(ScrollView, can_focus=True):
    """A view's table; `view` names it, `headings` are its columns' headings."""

    view = ""
    headings: tuple[str, ...] = ()
    short_headings: tuple[str, ...] = ()  # on a narrow screen (empty: the headings)
    narrow: tuple[int, ...] = ()  # each column's most characters on a narrow screen (0: no limit)
    drop: tuple[int, ...] = ()  # the columns left out first when narrow, in order
    flex_min = 12  # the last column's least width before another column is left out
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
        self._natural = [len(h) for h in self.headings]  # every column whole (capped at MAX_WIDTH)
        self._natural_short = [len(h) for h in self.short_headings or self.headings]
        self._columns = list(range(len(self.headings)))  # the columns shown, and their widths
        self._widths = list(self._natural)
        self.is_short = False  # the short cells shown
        self.cursor_row = 0

    # ------------------------------------------------------------ data
    def show(self, rows: list[Row]) -> None:
        """Show exactly these rows, in this order; the cursor follows its row."""
        selected = self.selected_key()
        self._rows = rows
        self._index = {r.key: i for i, r in enumerate(rows)}
        widths = [len(h) for h in self.headings]
        short = [len(h) for h in self.short_headings or self.headings]
        for r in rows:
            for i, c in enumerate(r.cells):
                if len(c) > widths[i]:
                    widths[i] = len(c)
            for i, c in enumerate(r.short or r.cells):
                if len(c) > short[i]:
                    short[i] = len(c)
        # the last column has the room left, whole when it fits (a queued job's reason)
        self._natural = [min(w, MAX_WIDTH) for w in widths[:-1]] + widths[-1:]
        self._natural_short = [min(w, MAX_WIDTH) for w in short[:-1]] + short[-1:]
        if selected in self._index:
            self.cursor_row = self._index[selected]
        self.cursor_row = max(0, min(self.cursor_row, len(rows) - 1))
        self._lay_out()

    def _lay_out(self) -> None:
        """Which columns show, how wide, whole or short, for the width there is."""
        width = self.size.width - (1 if len(self._rows) + 1 > self.size.height else 0)  # the scrollbar's column
        columns, widths, self.is_short = self.fit(self._natural, self._natural_short, width)
        self._columns, self._widths = columns, widths
        size = Size(sum(widths) + GAP * (len(widths) - 1), len(self._rows) + 1)
        old, room = self.virtual_size, self.size.width
        # a refresh that changes a cell's width changes only the width: told only when it
        # scrolls sideways (a live refresh stays cheap, bench/tui_frame.py)
        changed = size.height != old.height or (size.width != old.width and max(size.width, old.width) > room)
        if changed:
            # setting it lays the whole screen out again (~10 ms at 1,000 rows), also when only
            # a width changed that nothing scrolls by: then it is left as it was
            self.virtual_size = size
            # the scrollbar and scrolling are told (textual's layout sees no change once the
            # size is set): without it, PageDown moved the cursor out of sight
            self._scroll_update(size)
        self.refresh()

    def fit(self, natural: list[int], natural_short: list[int], width: int) -> tuple[list[int], list[int], bool]:
        """(columns shown, their widths, short cells) for `width` characters (<= 0: not laid
        out yet, every column whole)."""
        every = list(range(len(natural)))
        whole = sum(natural[:-1]) + GAP * (len(natural) - 1)
        if width <= 0 or whole + min(natural[-1], max(self.flex_min, 30)) <= width:
            return every, [*natural[:-1], min(natural[-1], max(width - whole, 0) if width > 0 else natural[-1])], False
        caps = self.narrow or (0,) * len(natural)
        widths = [min(w, c) if c else w for w, c in zip(natural_short, caps)]
        heads = self.short_headings or self.headings
        widths = [max(w, len(h)) for w, h in zip(widths, heads)]
        last = every[-1]
        shown = every[:]
        for column in (None, *self.drop):
            if column is not None:
                shown.remove(column)
            fixed = sum(widths[i] for i in shown if i != last) + GAP * (len(shown) - 1)
            if fixed + min(self.flex_min, natural_short[last]) <= width:
                break
        widths[last] = max(min(natural_short[last], width - fixed), min(self.flex_min, natural_short[last]))
        return shown, [widths[i] for i in shown], True

    def on_resize(self) -> None:
        self._lay_out()
        if self._rows:
            self._follow_cursor()  # the table got shorter (the title wrapped): its row stays in sight

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
        return (" " * GAP).join((cells[i][:w - 1] + CUT if len(cells[i]) > w else cells[i]).ljust(w)
                                for i, w in zip(self._columns, self._widths))

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        if y == 0:
            heads = self.short_headings if self.is_short and self.short_headings else self.headings
            text, style = self._line(heads), HEADER
        else:
            index = scroll_y + y - 1
            if index >= len(self._rows):
                return Strip.blank(width)
            row = self._rows[index]
            text = self._line(row.short or row.cells if self.is_short else row.cells)
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
        self._follow_cursor()

    def _follow_cursor(self) -> None:
        """Scroll so that the cursor's row is on screen."""
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
    short_headings = SERVER_SHORT_COLUMNS
    # CLUSTER NODE STATE GPUS UTIL% VRAM FREE MY JOBS PATH
    narrow = (10, 16, 12, 12, 0, 0, 0, 10, 0)
    drop = (5, 4, 3, 0)  # VRAM (FREE says what is left), UTIL%, GPUS, CLUSTER
    flex_min = 7  # "relayed"
    BINDINGS = [Binding("t", "app.terminal", "terminal", tooltip="terminal on the node"),
                Binding("v", "app.vscode", "VS Code", tooltip="VS Code (the node)")]


class JobsTable(RowTable):
    view = "jobs"
    headings = JOB_COLUMNS
    # CLUSTER ID NAME STATE NODES GPUS EXIT REASON
    narrow = (10, 0, 16, 0, 12, 0, 0, 0)
    drop = (5, 0, 4)  # GPUS, CLUSTER, NODES
    flex_min = 20
    BINDINGS = [
        Binding("l", "app.logs", "logs", tooltip="follow logs"),
        Binding("c", "app.cancel_job", "cancel", tooltip="cancel job"),
    ]


class WorkspacesTable(RowTable):
    view = "workspaces"
    headings = WORKSPACE_COLUMNS
    # CLUSTER NAME STATE NODE IMAGE PORTS REASON
    narrow = (10, 16, 0, 12, 20, 12, 0)
    drop = (4, 0)  # IMAGE, CLUSTER
    flex_min = 20
    BINDINGS = [
        Binding("n", "app.create_workspace", "create"),
        Binding("s", "app.workspace('start')", "start"),
        Binding("x", "app.workspace('stop')", "stop"),
        Binding("d", "app.workspace('rm')", "remove"),
        Binding("t", "app.terminal", "terminal"),
        Binding("f", "app.forward", "forward", tooltip="forward ports"),
        Binding("v", "app.vscode", "VS Code", tooltip="VS Code (inside, or its node)"),
    ]


TABLES = (ServersTable, JobsTable, WorkspacesTable)

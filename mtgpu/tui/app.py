"""The terminal app behind `remotegpu-cli` (no subcommand): servers, jobs and workspaces
of every cluster joined, refreshed live. Keys are listed by `?` (docs/TUI.md)."""

from __future__ import annotations

import gc
import shlex
import socket
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any, Callable

from textual.app import App, ComposeResult, SuspendNotSupported
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.widgets import ContentSwitcher, Input, Static

from ..cli.workspace_wait import WorkspaceEnded, WorkspaceNotUp, not_up_message, view, wait_until_up
from . import vscode
from .commands import COMMANDS, Command, CommandError, devcontainer_command, parse_command, workspace_body
from .rows import ClusterSnapshot, Row, filter_rows, job_rows, server_rows, sort_rows, workspace_rows
from .screens import ConfirmScreen, HelpScreen, KeyBar, LogScreen, NoticeScreen
from .source import Cluster, group_by_cluster, merge
from .tables import TABLES, RowTable

VIEWS = {"servers": server_rows, "jobs": job_rows, "workspaces": workspace_rows}
VIEW_KEYS = ("1", "2", "3")  # the title shows them: `[2] jobs`
CLI = [sys.executable, "-m", "mtgpu.cli.remotegpu"]  # the scriptable twin, for terminals and forwards


class RemoteGpuApp(App):
    CSS = """
    #title { height: auto; max-height: 3; background: $primary; color: $text; padding: 0 1; }
    #status { height: auto; max-height: 4; padding: 0 1; }
    ContentSwitcher { height: 1fr; }
    RowTable { height: 1fr; scrollbar-size-horizontal: 0; scrollbar-size-vertical: 1; }
    Input { display: none; }
    Input.shown { display: block; }
    #help, #confirm { width: 90%; height: auto; max-height: 90%; border: thick $primary; background: $surface;
                      padding: 1 2; scrollbar-size-vertical: 1; }
    HelpScreen, ConfirmScreen { align: center middle; }
    #log-title { height: 1; background: $primary; padding: 0 1; }
    """
    BINDINGS = [
        Binding("1", "view('servers')", "servers"),
        Binding("2", "view('jobs')", "jobs"),
        Binding("3", "view('workspaces')", "workspaces"),
        Binding("slash", "filter", "filter"),
        Binding("colon", "command", "command"),
        Binding("question_mark", "help", "keys"),
        Binding("i", "details", "details", tooltip="the selected row whole (a long reason, an error)"),
        Binding("o", "sort", "sort", tooltip="sort by the next column"),
        Binding("O", "reverse", "reverse", tooltip="reverse the order"),
        Binding("r", "refresh_now", "refresh"),
        Binding("q", "quit", "quit"),
        Binding("escape", "close_input", "close", show=False),
    ]

    def __init__(self, entries: list[dict], connect: Callable[[dict], Any], refresh_s: float = 1.5,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.clusters = {name: Cluster(name, es, connect, clock) for name, es in group_by_cluster(entries).items()}
        self.snapshots: dict[str, ClusterSnapshot] = {}
        self.refresh_s = refresh_s
        self.current = "servers"
        self.filters = {v: "" for v in VIEWS}
        self.sorting = {v: (0, False) for v in VIEWS}
        self._in_flight: set[str] = set()
        self._input_mode = ""
        self.forwards: dict[tuple[str, str, int], subprocess.Popen] = {}
        self._app_ending = threading.Event()  # set when the app ends: a workspace's wait stops

    # ------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield Static("", id="title", markup=False)
        with ContentSwitcher(initial="servers"):
            for table in TABLES:
                yield table()
        yield Input(id="prompt", select_on_focus=False)
        yield Static("", id="status", markup=False)
        yield KeyBar(id="keys")

    def on_mount(self) -> None:
        # The app's own objects (textual's widgets, styles, caches) live as long as it does:
        # out of the collector's full passes, which otherwise scan them during a refresh of a
        # big cluster and make its slowest frames (bench/tui_frame.py).
        gc.freeze()
        self._show_title()
        self.table().focus()
        self._show_keys()
        self.action_refresh_now()
        self.set_interval(self.refresh_s, self.action_refresh_now)

    def table(self, view: str | None = None) -> RowTable:
        return self.query_one(f"#{view or self.current}", RowTable)

    STATUS_LINES = 4  # the status line wraps to as many; a longer text is a notice too

    def say(self, text: str) -> None:
        try:
            self.query_one("#status", Static).update(text)
        except NoMatches:  # the app is closing (a worker's answer came late): nothing to show it on
            return
        if len(textwrap.wrap(text, max(20, self.size.width - 2))) > self.STATUS_LINES:
            self.push_screen(NoticeScreen(text))

    def _show_title(self) -> None:
        """The views, the filter, then each cluster and its path; wraps rather than cuts."""
        parts = []
        for name in self.clusters:
            s = self.snapshots.get(name)
            parts.append(f"{name}: " + ("..." if s is None else "unreachable" if s.error else s.path))
        views = "  ".join(f"[{i}] {v}" if v != self.current else f"<{i} {v}>" for i, v in enumerate(VIEWS, 1))
        f = self.filters[self.current]
        head, clusters = f"remotegpu  {views}" + (f"   filter: {f}" if f else ""), " | ".join(parts)
        room = self.size.width - 2  # its padding
        text = f"{head}   {clusters}" if len(head) + 3 + len(clusters) <= room else f"{head}\n{clusters}"
        if text != getattr(self, "_title_text", None):  # an update lays the whole screen out again (~15 ms)
            self._title_text = text
            self.query_one("#title", Static).update(text)

    def _show_keys(self) -> None:
        """The key bar: the view's keys, then the app's, as many as fit; `? keys` always."""
        first = ("slash", "colon", "question_mark", "i", "q")  # then the rest; 1 2 3 are in the title
        app = sorted(self.BINDINGS, key=lambda b: first.index(b.key) if b.key in first else len(first))
        bindings = [*type(self.table()).BINDINGS, *app]
        self.query_one("#keys", KeyBar).show([(_key(b.key), b.description) for b in bindings
                                              if b.show and b.key not in VIEW_KEYS])

    def on_resize(self) -> None:
        self._show_keys()
        self._show_title()

    def rows(self, view: str) -> list[Row]:
        """What the view shows now: its rows, filtered and sorted."""
        snapshots = [self.snapshots[n] for n in self.clusters if n in self.snapshots]
        column, reverse = self.sorting[view]
        return sort_rows(filter_rows(VIEWS[view](snapshots), self.filters[view]), column, reverse)

    def render_view(self) -> None:
        self.table().show(self.rows(self.current))
        self._show_title()

    # ------------------------------------------------------------ refresh
    def action_refresh_now(self) -> None:
        for name, cluster in self.clusters.items():
            if name not in self._in_flight:
                self._in_flight.add(name)
                self.run_worker(lambda c=cluster: self._fetch(c), thread=True, group="fetch")

    def _fetch(self, cluster: Cluster) -> None:
        snapshot = cluster.fetch()
        try:
            self.call_from_thread(self._arrived, snapshot)
        except RuntimeError:  # the app has ended meanwhile
            pass

    def _arrived(self, snapshot: ClusterSnapshot) -> None:
        self._in_flight.discard(snapshot.cluster)
        self.snapshots[snapshot.cluster] = merge(self.snapshots.get(snapshot.cluster), snapshot)
        try:
            self.render_view()
        except NoMatches:  # the app is closing (the answer came late): its tables are gone
            pass

    # ------------------------------------------------------------ views, filter, sort, help
    def action_view(self, view: str) -> None:
        self.current = view
        self.query_one(ContentSwitcher).current = view
        self.render_view()
        self.table().focus()
        self._show_keys()

    def action_filter(self) -> None:
        self._open_input("filter", self.filters[self.current], "filter: words every shown row contains")

    def action_command(self) -> None:
        self._open_input("command", "", "command (? lists them): e.g. cancel 12, create template web")

    def _open_input(self, mode: str, value: str, placeholder: str) -> None:
        prompt = self.query_one("#prompt", Input)
        self._input_mode = mode
        prompt.value, prompt.placeholder = value, placeholder
        prompt.cursor_position = len(value)
        prompt.add_class("shown")
        prompt.focus()

    def action_close_input(self) -> None:
        prompt = self.query_one("#prompt", Input)
        if self._input_mode:
            self._input_mode = ""
            prompt.remove_class("shown")
            self.table().focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if self._input_mode == "filter":
            self.filters[self.current] = event.value
            self.render_view()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        mode = self._input_mode
        self.action_close_input()
        if mode == "command" and event.value.strip():
            try:
                self.run_command(parse_command(event.value))
            except CommandError as e:
                self.say(str(e))

    def action_sort(self) -> None:
        column, reverse = self.sorting[self.current]
        columns = self.table().headings
        self.sorting[self.current] = ((column + 1) % len(columns), False)
        self.say(f"sorted by {columns[self.sorting[self.current][0]]}")
        self.render_view()

    def action_reverse(self) -> None:
        column, reverse = self.sorting[self.current]
        self.sorting[self.current] = (column, not reverse)
        self.say(f"sorted by {self.table().headings[column]}, {'descending' if not reverse else 'ascending'}")
        self.render_view()

    def action_help(self) -> None:
        self.push_screen(HelpScreen(help_text))

    def action_details(self) -> None:
        """`i`: the selected row, every column whole (what a narrow screen cuts)."""
        row = self.table().selected()
        if row is None:
            self.say(f"no {self.current[:-1]} selected")
            return
        self.push_screen(NoticeScreen(lambda width: row_details(self.table().headings, row, width)))

    # ------------------------------------------------------------ jobs
    def _selected(self, view: str) -> Row | None:
        if self.current != view:
            return None
        row = self.table().selected()
        if row is None:
            self.say(f"no {view[:-1]} selected")
        return row

    def on_row_table_row_selected(self, event: RowTable.RowSelected) -> None:
        if self.current == "jobs":
            self.action_logs()

    def action_logs(self, row: Row | None = None) -> None:
        row = row or self._selected("jobs")
        if row is not None:
            self.push_screen(LogScreen(self.clusters[row.ref["cluster"]], row.ref["job_id"]))

    def action_cancel_job(self, row: Row | None = None) -> None:
        row = row or self._selected("jobs")
        if row is None:
            return
        cluster, job_id = row.ref["cluster"], row.ref["job_id"]

        def answered(yes: bool | None) -> None:
            if yes:
                self._act(cluster, lambda c: c.cancel(job_id), f"cancelled job {job_id} on {cluster}",
                          f"could not cancel job {job_id} on {cluster}")
            else:
                self.say(f"job {job_id} left as it is")
        self.push_screen(ConfirmScreen(f"cancel job {job_id} on {cluster}?"), answered)

    def _act(self, cluster: str, what: Callable[[Any], Any], done: str, failed: str) -> None:
        """Run an action in a thread; say how it went and refresh."""
        def work() -> None:
            try:
                self.clusters[cluster].call(what)
                text = done
            except Exception as e:  # noqa: BLE001 - shown, the app keeps running
                text = f"{failed}: {e}"
            self.call_from_thread(self.say, text)
            self.call_from_thread(self.action_refresh_now)
        self.say("working...")
        self.run_worker(work, thread=True, group="act")

    # ------------------------------------------------------------ workspaces
    def action_create_workspace(self) -> None:
        self._open_input("command", "create template ",
                         "create template NAME | create image REF | create devcontainer PATH  [name=WS]")

    def action_workspace(self, action: str, row: Row | None = None) -> None:
        row = row or self._selected("workspaces")
        if row is None:
            return
        cluster, name = row.ref["cluster"], row.ref["name"]
        verb = {"start": "started", "stop": "stopped", "rm": "removed"}[action]
        run = lambda: self._act(cluster, lambda c: c.workspace_action(name, action),  # noqa: E731
                                f"{verb} workspace {name} on {cluster}", f"could not {action} workspace {name}")
        if action == "start":
            self._act_until_up(cluster, lambda c: c.workspace_action(name, "start"), f"start workspace {name}")
        elif action == "rm":
            self.push_screen(ConfirmScreen(f"remove workspace {name} on {cluster} (its container goes)?"),
                             lambda yes: run() if yes else self.say(f"workspace {name} kept"))
        else:
            run()

    def _act_until_up(self, cluster: str, begin: Callable[[Any], dict], what: str) -> None:
        """Create or start a workspace, then wait as `mt-container create` and `start` do, with
        the same code (cli/workspace_wait.py): until it runs; until it has stayed queued a while
        (it keeps its place, and the status line says why); or until it stopped or ended
        instead, which a notice says with its reason and the end of its output."""
        def work() -> None:
            try:
                text = self.clusters[cluster].call(lambda c: self._until_up(c, cluster, begin))
            except _Closing:
                return
            except Exception as e:  # noqa: BLE001 - shown, the app keeps running
                text = f"could not {what}: {e}"
            self._from_thread(self.say, text)
            self._from_thread(self.action_refresh_now)
        self.say(f"{what} on {cluster}...")
        self.run_worker(work, thread=True, group="act")

    def _until_up(self, c: Any, cluster: str, begin: Callable[[Any], dict]) -> str:
        r = begin(c)  # create answers the name and job id, start the workspace itself
        ws = view(c, r["name"], r["job_id"]) if "job_id" in r else r
        name = ws["workspace"]["name"]
        warning = f" (warning: {r['warning']})" if r.get("warning") else ""
        self._from_thread(self.say, f"workspace {name} is {ws['state']} on {cluster}: waiting until it runs{warning}")
        try:
            ws = wait_until_up(c, ws, sleep=self._sleep)
        except (WorkspaceEnded, WorkspaceNotUp) as e:
            message = not_up_message(c, e) if isinstance(e, WorkspaceEnded) else str(e)
            self._from_thread(self.push_screen, NoticeScreen(message))
            return message.splitlines()[0]
        w = ws["workspace"]
        if ws["state"] == "running" and w.get("container"):
            return f"workspace {name} runs on {w['node']} ({cluster}){warning}"
        if ws["state"] == "running":
            return f"workspace {name} is still being prepared on {w['node']} (its image is staged): see it in 3"
        return (f"workspace {name} is {ws['state']}" + (f": {ws['reason']}" if ws.get("reason") else "")
                + "; it keeps its place and starts when it can")

    def _sleep(self, seconds: float) -> None:
        if self._app_ending.wait(seconds):
            raise _Closing()

    def _from_thread(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            self.call_from_thread(fn, *args)
        except RuntimeError:  # the app has ended meanwhile
            pass

    def _running_workspace(self) -> Row | None:
        row = self._selected("workspaces")
        if row is not None and row.ref["state"] != "running":
            self.say(f"workspace {row.ref['name']} is {row.ref['state']}: start it first (s)")
            return None
        return row

    def action_terminal(self) -> None:
        """`t`: a terminal inside the selected running workspace, or on the selected node."""
        if self.current == "servers":
            row = self._selected("servers")
            if row is None or not row.ref.get("node"):
                self.say("no node selected" if row is None else f"cluster {row.ref['cluster']} did not answer")
                return
            entry = self.clusters[row.ref["cluster"]].entry
            self.hand_over(CLI + ["ssh", "--server", entry["server"], row.ref["node"]], f"node {row.ref['node']}")
            return
        row = self._running_workspace()
        if row is not None:
            entry = self.clusters[row.ref["cluster"]].entry
            self.hand_over(CLI + ["shell", "--server", entry["server"], row.ref["name"]],
                           f"workspace {row.ref['name']}")

    def hand_over(self, argv: list[str], what: str, then_wait: bool = False) -> None:
        """Suspend the app and give the terminal to argv; back when it ends (after Enter, with
        then_wait, so that its last words can be read)."""
        try:
            with self.suspend():
                code = subprocess.run(argv).returncode
                if then_wait:
                    print(f"\n[{what}: exit {code}] press Enter to go back to the app", flush=True)
                    try:
                        input()
                    except EOFError:
                        pass
        except SuspendNotSupported:
            self.say(f"this terminal cannot hand itself over: run remotegpu-cli {shlex.join(argv[3:])} yourself")
            return
        self.say(f"back from {what} (exit {code})")
        self.action_refresh_now()

    def action_forward(self) -> None:
        row = self._running_workspace()
        if row is None:
            return
        if not row.ref["ports"]:
            self.say(f"workspace {row.ref['name']} publishes no port (create it with ports=PORT)")
            return
        entry = self.clusters[row.ref["cluster"]].entry
        started = []
        for port in row.ref["ports"]:
            key = (row.ref["cluster"], row.ref["name"], port)
            if key in self.forwards and self.forwards[key].poll() is None:
                started.append(f"{port} (already)")
                continue
            local = local_port_for(port)
            self.forwards[key] = subprocess.Popen(
                CLI + ["forward", row.ref["name"], str(port), "--local-port", str(local), "--server", entry["server"]],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            started.append(f"http://localhost:{local}" + (f" (its {port} is taken here)" if local != port else ""))
        self.say(f"forwarding {', '.join(started)} to {row.ref['name']} until you quit")
        self.set_timer(3.0, self._check_forwards)

    def _check_forwards(self) -> None:
        for (cluster, name, port), proc in list(self.forwards.items()):
            if proc.poll() is not None:
                why = (proc.stderr.read() if proc.stderr else "").strip().splitlines()
                self.say(f"forward of {name} port {port} ended: {why[-1] if why else f'exit {proc.returncode}'}")
                del self.forwards[(cluster, name, port)]

    def action_vscode(self) -> None:
        """`v` on a node (servers view) or a running workspace: `remotegpu-cli ssh-config`,
        then `code --folder-uri` (vscode.target says which URI); refuses, saying why, when
        `code` is not on PATH or ssh-config wrote no Host for the node (no DirectLink)."""
        if self.current == "workspaces":
            row = self._running_workspace()
            if row is None:
                return
            node, workspace = row.ref.get("node"), {"name": row.ref["name"], "container": row.ref.get("container")}
            if not node:
                self.say(f"workspace {row.ref['name']} has no node yet: wait until it is placed")
                return
        elif self.current == "servers":
            row = self._selected("servers")
            if row is None:
                return
            node, workspace = row.ref.get("node"), None
            if not node:
                self.say(f"cluster {row.ref['cluster']} did not answer: no node to open (r asks again)")
                return
        else:
            self.say("v opens a node (1: servers) or a workspace (3: workspaces) in VS Code")
            return
        code = vscode.code_path()
        if code is None:
            self.say("VS Code's `code` command is not on PATH: in VS Code run \"Shell Command: Install 'code' "
                     "command in PATH\" (or add it to PATH), then press v again")
            return
        cluster = row.ref["cluster"]
        host = vscode.host_alias(node, cluster)

        def work() -> None:
            try:
                hosts = vscode.write_ssh_config(CLI)
                if host not in hosts:
                    raise vscode.VSCodeError(
                        f"`remotegpu-cli ssh-config` wrote no Host {host}: cluster {cluster} has no DirectLink "
                        f"relay (a standalone node), so VS Code cannot reach {node} by name; use Remote-SSH to "
                        "its sshd yourself (docs/SSH.md), or `t` for a terminal in a workspace")
                docker_path = vscode.docker_path_setting() if workspace else None
                goal = vscode.target(node, cluster, vscode.remote_home(host), workspace, docker_path)
                vscode.open_folder_uri(code, goal.uri)
                text = goal.said
            except (vscode.VSCodeError, ValueError) as e:
                text = f"could not open VS Code: {e}"
            try:
                self.call_from_thread(self.say, text)
            except RuntimeError:  # the app has ended meanwhile
                pass
        self.say(f"remotegpu-cli ssh-config, then VS Code on {host}...")
        self.run_worker(work, thread=True, group="vscode")

    def on_unmount(self) -> None:
        self._app_ending.set()
        for proc in self.forwards.values():
            if proc.poll() is None:
                proc.terminate()
        for cluster in self.clusters.values():
            cluster.drop()

    # ------------------------------------------------------------ the command line
    def _cluster_for(self, cmd: Command) -> str:
        name = cmd.options.get("cluster")
        if name is None:
            row = self.table().selected()
            name = row.ref.get("cluster") if row else next(iter(self.clusters))
        if name not in self.clusters:
            raise CommandError(f"no joined cluster {name!r}; joined: {', '.join(self.clusters)}")
        return name

    def run_command(self, cmd: Command) -> None:
        if cmd.name in VIEWS:
            self.action_view(cmd.name)
        elif cmd.name == "quit":
            self.exit()
        elif cmd.name == "help":
            self.action_help()
        elif cmd.name == "refresh":
            self.action_refresh_now()
            self.say("asking every cluster")
        elif cmd.name == "filter":
            self.filters[self.current] = " ".join(cmd.args)
            self.render_view()
        elif cmd.name == "sort":
            self._sort_by(cmd)
        elif cmd.name in ("cancel", "logs"):
            cluster, job_id = self._cluster_for(cmd), int(cmd.args[0])
            row = Row(f"{cluster}/{job_id}", (), {"cluster": cluster, "job_id": job_id})
            (self.action_cancel_job if cmd.name == "cancel" else self.action_logs)(row)
        elif cmd.name in ("start", "stop", "rm"):
            cluster = self._cluster_for(cmd)
            self.action_workspace(cmd.name, Row(f"{cluster}/{cmd.args[0]}", (),
                                                {"cluster": cluster, "name": cmd.args[0]}))
        elif cmd.name == "create" and cmd.args[0] == "devcontainer":
            cluster = self._cluster_for(cmd)
            node = cmd.options.get("node") or self._node_for(cluster)
            entry = self.clusters[cluster].entry
            self.hand_over(CLI + ["ssh", "--server", entry["server"], node, "--", devcontainer_command(cmd)],
                           f"mt-container create on {node}", then_wait=True)
        elif cmd.name == "create":
            cluster = self._cluster_for(cmd)
            body = workspace_body(cmd)
            self._act_until_up(cluster, lambda c: c.create_workspace(body),
                               f"create a workspace from {cmd.args[0]} {cmd.args[1]}")

    def _node_for(self, cluster: str) -> str:
        """The selected node of the servers view, else the node this cluster was joined at."""
        row = self.table("servers").selected()
        if row is not None and row.ref.get("cluster") == cluster and row.ref.get("node"):
            return row.ref["node"]
        return self.clusters[cluster].entry["node"]

    def _sort_by(self, cmd: Command) -> None:
        columns = [c.lower() for c in self.table().headings]
        wanted = cmd.args[0].lower()
        match = [i for i, c in enumerate(columns) if c.startswith(wanted)]
        if not match:
            raise CommandError(f"no column {cmd.args[0]!r} here; the columns: {', '.join(columns)}")
        self.sorting[self.current] = (match[0], "desc" in cmd.args[1:])
        self.render_view()


class _Closing(Exception):
    """The app is ending: a workspace's wait stops."""


def local_port_for(port: int) -> int:
    """The same port on this computer when it is free here, else one the system gives."""
    for wanted in (port, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", wanted))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError("no free local port")


def help_text(width: int = 120) -> str:
    """Every key of the app and its views, and the commands of `:`, for `width` characters:
    a long description wraps under itself; narrower than 100, a command's description
    goes on the lines below it."""
    def item(name: str, text: str, column: int) -> list[str]:
        if column + 20 > width or len(name) > column - 3:
            return [f"  {name}"] + textwrap.wrap(text, width, initial_indent=" " * 6, subsequent_indent=" " * 6)
        return textwrap.wrap(f"  {name:{column - 3}} {text}", width, subsequent_indent=" " * column)

    lines = ["Keys everywhere (arrows, j/k, PageUp/PageDown, Home/End move; here too)"]
    for b in RemoteGpuApp.BINDINGS:
        if b.show or b.key == "escape":
            lines += item(_key(b.key), b.tooltip or b.description, 11)
    for table in TABLES:
        if table.BINDINGS:
            lines += ["", f"In {table.view} (Enter on a job: follow its log)" if table.view == "jobs"
                      else f"In {table.view}"]
            for b in table.BINDINGS:
                lines += item(_key(b.key), b.tooltip or b.description, 11)
    lines += ["", "Commands (:)"]
    for k, v in COMMANDS.items():
        lines += item(k, v, 49 if width >= 100 else width)
    lines += ["", "Esc or ? closes this."]
    return "\n".join(lines)


def row_details(headings: tuple[str, ...], row: Row, width: int = 120) -> str:
    """A row of a view, each column whole on its own line(s), wrapped to `width`."""
    column = max(len(h) for h in headings) + 2
    lines = []
    for h, cell in zip(headings, row.cells):
        lines += textwrap.wrap(f"{h + ':':{column}}{cell or '-'}", max(column + 10, width),
                               subsequent_indent=" " * column)
    return "\n".join(lines + ["", "Esc closes this."])


def _key(key: str) -> str:
    return {"slash": "/", "colon": ":", "question_mark": "?", "escape": "Esc"}.get(key, key)


def run(entries: list[dict], connect: Callable[[dict], Any], refresh_s: float = 1.5) -> None:
    RemoteGpuApp(entries, connect, refresh_s).run()

"""The terminal app on small and big terminals (issue 27): every view at 80x24 and 200x50
against its golden screen (tests/unit/tui/golden/), and what an 80-column screen must
show: every help section by scrolling, the servers' FREE, MY JOBS and PATH without
sideways scrolling, the key bar and the filter whole, no stray scrollbar glyph, a long
reason whole in the row's details, a long refusal wrapped on the status line.

A golden screen is the screen's text. After a change that means to alter one, regenerate
them with `MTGPU_UPDATE_GOLDEN=1 python -m pytest tests/unit/tui/test_tui_screens.py`:
that run writes the files and fails (so that it never passes silently, in CI or
elsewhere); review `git diff tests/unit/tui/golden` and run again without it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from mtgpu.tui import vscode
from mtgpu.tui.commands import COMMANDS
from tests.unit.tui.test_tui_app import FakeClient, app_with, cells, until
from tests.unit.tui.tui_builders import make_job, make_node, make_workspace, screen_text

GOLDEN = Path(__file__).parent / "golden"
SIZES = [(80, 24), (200, 50)]
LONG_REASON = ("waiting for 4 free GPUs on one node: the largest has 2 free (gpu-node-02); "
               "it keeps its place in the queue")
SCROLLBAR_GLYPHS = set("▁▂▃▄▅▆▇█▉▊▋▌▍▎▏▔▕")


def cluster() -> FakeClient:
    """A cluster as a user sees it: real model names, 8 GPUs a node, a queued job's long
    reason, a workspace with a long image name."""
    client = FakeClient(
        [make_node("gpu-node-01", gpus=8, model="NVIDIA H100 80GB HBM3", util=37.0, used_gib=12),
         make_node("gpu-node-02", gpus=2, model="Tesla T4", total_gib=16, committed=1.0)],
        [make_job(5, nodes=("gpu-node-01",), name="train-resnet"), make_job(6, state="queued", nodes=(),
                                                                            reason=LONG_REASON)],
        [make_workspace("web", node="gpu-node-01"), make_workspace("notebook", state="stopped", ports=())])
    client._ws[1]["workspace"]["image"] = "ghcr.io/example-lab/pytorch-notebook:2.3.1-cuda12.1"
    client.log[5] = b"epoch 1 loss 0.93\nepoch 2 loss 0.71\n"
    return client


def run_app(size, keys=(), check=None, client=None):
    """The app at `size`, after its clusters answered and `keys` were pressed: its screen's
    text (after `check(app)` held, when given)."""
    out = {}

    async def go():
        app = app_with(client or cluster())
        app.animation_level = "none"  # a scroll lands at once: the screen is the same each run
        async with app.run_test(size=size) as pilot:
            await until(pilot, "both clusters", lambda: len(cells(app, "servers")) == 3
                        and "unreachable" in str(app.query_one("#title").render()))
            for key in keys:
                await pilot.press(*key) if isinstance(key, tuple) else await pilot.press(key)
                await pilot.pause()
            if check is not None:
                await until(pilot, "the screen", lambda: check(app))
            await pilot.pause(0.1)
            out["text"], out["app"] = screen_text(app), app
    asyncio.run(go())
    return out["text"]


# ------------------------------------------------------------ golden screens
VIEWS = {
    "servers": ((), None),
    "jobs": (("2",), None),
    "workspaces": (("3",), None),
    "filter": (("slash", tuple("h100")), None),
    "command": (("colon", tuple("cancel 6")), None),
    "help": (("question_mark",), None),
    "help-end": (("question_mark", "end"), None),
    "details": (("2", "down", "i"), None),
    "confirm": (("2", "c"), None),
    "log": (("2", "l"), lambda app: "end of log" in "\n".join(map(str, app.screen.query_one("#log").lines))),
}


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("view", VIEWS)
def test_every_view_matches_its_golden_screen(view, size):
    keys, check = VIEWS[view]
    text = run_app(size, keys, check)
    path = GOLDEN / f"{view}-{size[0]}x{size[1]}.txt"
    if os.environ.get("MTGPU_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        pytest.fail(f"wrote {path}: review `git diff {GOLDEN}`, then run again without MTGPU_UPDATE_GOLDEN")
    assert path.exists(), f"no golden screen {path}: make it with MTGPU_UPDATE_GOLDEN=1 (module docstring)"
    assert text == path.read_text(), (f"the {view} screen at {size[0]}x{size[1]} changed; if meant, regenerate "
                                      f"with MTGPU_UPDATE_GOLDEN=1 (module docstring). Now:\n{text}")


# ------------------------------------------------------------ what 80x24 must show
def lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]


def inside_box(line: str) -> str:
    """The text of a line of a pop-up box (between its borders), without its scrollbar."""
    parts = line.split("█")
    return parts[1].strip(" " + "".join(SCROLLBAR_GLYPHS)) if len(parts) >= 3 else ""


def test_help_scrolls_to_every_section_and_every_command_at_80x24():
    seen: list[str] = []
    pages = [("question_mark",)] + [("question_mark", *["pagedown"] * n) for n in range(1, 8)]
    for keys in pages:
        seen += lines(run_app((80, 24), keys))
    text = "\n".join(seen)
    for section in ("Keys everywhere", "In servers", "In jobs", "In workspaces", "Commands (:)", "Esc or ? closes"):
        assert section in text, section
    for command in COMMANDS:  # each whole, on its own line
        assert command in [inside_box(line) for line in seen], command


def test_servers_view_at_80_columns_shows_free_my_jobs_and_path_without_scrolling_sideways():
    screen = lines(run_app((80, 24)))
    heading = next(line for line in screen if line.startswith("CLUSTER"))
    for column in ("NODE", "STATE", "GPUS", "FREE", "MY JOBS", "PATH"):
        assert column in heading.split("  ") or f" {column}" in heading, (column, heading)
    row = next(line for line in screen if "gpu-node-01" in line)
    assert "8x H100" in row and "8/8 544G" in row and row.split()[-2:] == ["5", "direct"], row
    assert all(len(line) <= 80 for line in screen)


def test_no_stray_scrollbar_glyph_on_any_view_at_80x24():
    """The tables do not scroll sideways at 80 columns, so no horizontal scrollbar's thumb
    (a lone `▎` above the status line) is drawn."""
    for keys in ((), ("2",), ("3",)):
        screen = lines(run_app((80, 24), keys))
        assert not SCROLLBAR_GLYPHS & set("".join(screen[:-1])), "\n".join(screen)


def test_the_key_bar_is_whole_and_offers_every_key_on_every_view_at_80x24():
    for keys in ((), ("2",), ("3",)):
        bar = lines(run_app((80, 24), keys))[-1]
        assert "? keys" in bar and "q quit" in bar and not bar.endswith(("▏", "…", "palette")), bar


def test_a_text_too_long_for_the_status_line_is_a_notice_too():
    said = "the node answered: " + "a long explanation " * 30

    async def go():
        app = app_with(cluster())
        async with app.run_test(size=(80, 24)) as pilot:
            app.say("short enough")
            await pilot.pause()
            assert type(app.screen).__name__ == "Screen"
            app.say(said)
            await until(pilot, "the notice", lambda: type(app.screen).__name__ == "NoticeScreen"
                        and app.screen.query("#help-text"))
            assert str(app.screen.query_one("#help-text").render()) == said
    asyncio.run(go())


def test_the_filter_text_shows_whole_in_the_title_at_80_columns():
    screen = lines(run_app((80, 24), [("slash", *"gpu-node-02"), "enter"]))
    assert any("filter: gpu-node-02" in line for line in screen[:3]), "\n".join(screen)
    assert any("far: unreachable" in line for line in screen[:3]), "\n".join(screen)


def test_a_long_reason_is_cut_in_the_row_and_whole_in_its_details():
    screen = lines(run_app((80, 24), ["2"]))
    row = next(line for line in screen if " queued " in line)
    assert row.startswith("lab") and row.endswith("…") and "waiting for 4 free GPUs" in row, row
    details = " ".join(inside_box(line) for line in lines(run_app((80, 24), ["2", "down", "i"])) if inside_box(line))
    assert LONG_REASON in details, details


def test_the_vs_code_refusal_is_whole_on_the_status_line_at_80_columns(monkeypatch):
    monkeypatch.setattr(vscode, "code_path", lambda: None)
    screen = lines(run_app((80, 24), ["v"]))
    said = " ".join(line.strip() for line in screen[-6:-1] if line.strip())
    assert ("VS Code's `code` command is not on PATH: in VS Code run \"Shell Command: Install 'code' command in "
            "PATH\" (or add it to PATH), then press v again") in said, "\n".join(screen)


def test_page_down_keeps_the_selected_row_on_an_80x24_screen():
    client = FakeClient([make_node(f"gpu-node-{i:02d}", gpus=8, model="NVIDIA H100 80GB HBM3") for i in range(60)], [])

    async def go():
        app = app_with(client)
        app.animation_level = "none"
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, "the nodes", lambda: len(cells(app, "servers")) == 61)
            for _ in range(2):
                before = app.table().selected().cells[1]
                await pilot.press("pagedown")
                node = app.table().selected().cells[1]
                assert node > before
                await until(pilot, f"{node} on the screen", lambda: node in screen_text(app))
    asyncio.run(go())

"""`mtgpu-admin nodes`: the members' table and the notes under it, laid out for a terminal
of 80 columns. The table holds short cells (a state, not why); why a member is down,
drained, unknown or degraded follows it, once per reason, and a member cut off from its
cluster says what still works on it and what does not (the node's `standing`)."""

from __future__ import annotations

import textwrap

from rich.table import Table

from .common import size


def nodes_table(nodes: list[dict]) -> Table:
    """One row per GPU of every member (one row for a member without GPUs)."""
    table = Table(box=None, pad_edge=False)
    table.add_column("NODE", overflow="fold")
    table.add_column("ROLE", no_wrap=True)
    table.add_column("STATE", no_wrap=True)
    table.add_column("CPUS", no_wrap=True)
    table.add_column("MEM", no_wrap=True)
    table.add_column("GPU", overflow="fold")
    table.add_column("VRAM", no_wrap=True)
    table.add_column("UTIL", no_wrap=True)
    table.add_column("COMMITTED", overflow="fold")
    for n in nodes:
        first = True
        for g in n["gpus"] or [None]:
            # "scheduler (no majority)": the mark on a line of its own
            head = (n["name"], n["role"].replace(" (", "\n("), n["state"], f"{n['cpus_committed']:g}/{n['cpus']:g}",
                    f"{size(n['mem_committed_bytes'])}/{size(n['mem_total_bytes'])}")
            row = head if first else ("",) * 5
            if g is None:
                table.add_row(*row, "-", "-", "-", "-")
            else:
                table.add_row(*row, f"{g['index']} {g['model']}",
                              f"{size(g['vram_used_bytes'])}/{size(g['vram_total_bytes'])}",
                              f"{g['utilization_pct']:.0f}%",
                              "exclusive" if g["exclusive"] else
                              f"{g['committed_fraction']:g} ({size(g['committed_vram_bytes'])})")
            first = False
    return table


def node_notes(nodes: list[dict], width: int = 80) -> list[str]:
    """Why members are not plainly up (one line per distinct reason, naming its members),
    then what works and what does not on a member cut off from the cluster; wrapped to
    `width`."""
    groups: dict[tuple[str, str], list[str]] = {}
    for n in nodes:
        if n.get("reason"):
            groups.setdefault((n["state"], n["reason"]), []).append(n["name"])
    lines: list[str] = []
    for (state, reason), names in groups.items():
        lines += _wrap(f"{', '.join(names)} ({state}): {reason}", width)
    for n in nodes:
        standing = n.get("standing") or {}
        if standing.get("in_touch", True):
            continue
        lines += _wrap(f"{n['name']} still serves:", width)
        for item in standing.get("works", ()):
            lines += _wrap(item, width, "  - ", "    ")
        lines += _wrap(f"{n['name']} cannot do now:", width)
        for item in standing.get("fails", ()):
            lines += _wrap(item, width, "  - ", "    ")
    return lines


def _wrap(text: str, width: int, first: str = "", rest: str = "  ") -> list[str]:
    return textwrap.wrap(text, width=width, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False) or [first.rstrip()]

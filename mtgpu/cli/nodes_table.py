"""`mtgpu-admin nodes`: the members' table and the notes under it, laid out for a terminal
of 80 columns. The table holds short cells (a state, not why); why a member is down,
drained, unknown or degraded follows it, once per reason, and a member cut off from its
cluster says what still works on it and what does not (the node's `standing`)."""

from __future__ import annotations

import re
import textwrap

from .common import UNLIMITED, Col, dropped_note, fit_table, plain, size, wrapped

NODE_COLS = (Col("NODE"), Col("ROLE"), Col("STATE"), Col("CPUS", drop=3), Col("MEM", drop=2), Col("GPU"),
             Col("VRAM"), Col("UTIL", drop=1, right=True), Col("COMMITTED"))
_VENDOR = re.compile(r"^(NVIDIA|AMD|Intel\(R\)|Intel)\s+|\b(GeForce|Radeon|Tesla|Quadro)\s+")


def short_model(model: str) -> str:
    """A GPU model without its vendor's words: 'NVIDIA GeForce RTX 4090' -> 'RTX 4090',
    'NVIDIA H100 80GB HBM3' -> 'H100 80GB HBM3' (the table's GPU column when narrow)."""
    return _VENDOR.sub("", model).strip() or model


def node_rows(nodes: list[dict], short: bool = False) -> list[tuple[str, ...]]:
    """One row per GPU of every member (one row for a member without GPUs); the member's
    own cells on its first row. A role keeps its mark whole ('voter?', 'scheduler' with
    '(no majority)' on a line of its own); why a member is not up follows the table."""
    rows = []
    for n in nodes:
        first = True
        for g in n["gpus"] or [None]:
            head = (n["name"], n["role"].replace(" (", "\n("), n["state"], f"{n['cpus_committed']:g}/{n['cpus']:g}",
                    f"{size(n['mem_committed_bytes'])}/{size(n['mem_total_bytes'])}")
            row = head if first else ("",) * 5
            if g is None:
                rows.append((*row, "-", "-", "-", "-"))
            else:
                rows.append((*row, f"{g['index']} {short_model(g['model']) if short else g['model']}",
                             f"{size(g['vram_used_bytes'])}/{size(g['vram_total_bytes'])}",
                             f"{g['utilization_pct']:.0f}%",
                             "exclusive" if g["exclusive"] else
                             f"{g['committed_fraction']:g} ({size(g['committed_vram_bytes'])})"))
            first = False
    return rows


def nodes_table(nodes: list[dict], width: int | None = 80):
    """The members' table for `width` columns (None: no limit) and the columns it left out.
    Narrow, GPU models lose their vendor's words first, then UTIL, MEM and CPUS go (in that
    order) until the rest fit; no cell is cut."""
    table, dropped = fit_table(NODE_COLS, node_rows(nodes), width)
    if dropped:
        table, dropped = fit_table(NODE_COLS, node_rows(nodes, short=True), width)
    return table, dropped


def nodes_text(nodes: list[dict], width: int | None) -> str:
    """What `mtgpu-admin nodes` prints at `width` (None: a pipe), without colour: the
    table, what it left out, and the notes under it (the golden tests compare it)."""
    table, dropped = nodes_table(nodes, width)
    return "\n".join([plain(table, width)] + ([wrapped(dropped_note(dropped), width)] if dropped else [])
                     + node_notes(nodes, width or UNLIMITED))


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
    lines += _versions_note(nodes, width)
    return lines


def _versions_note(nodes: list[dict], width: int) -> list[str]:
    """While members run different mtgpu versions (a rolling upgrade), which runs which, and
    the state format they all apply (newer commands wait for it); nothing when all agree."""
    versions: dict[str, list[str]] = {}
    formats = []
    for n in nodes:
        if n.get("mtgpu_version"):
            versions.setdefault(f"{n['mtgpu_version']} (state format {n.get('state_format', 1)})", []).append(n["name"])
            formats.append(n.get("state_format", 1))
    if len(versions) < 2:
        return []
    text = "mixed versions: " + "; ".join(f"{v} on {', '.join(names)}" for v, names in sorted(versions.items()))
    return _wrap(f"{text}. Commands newer than state format {min(formats)} wait until every member is "
                 "upgraded (docs/INSTALL.md).", width)


def _wrap(text: str, width: int, first: str = "", rest: str = "  ") -> list[str]:
    return textwrap.wrap(text, width=width, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False) or [first.rstrip()]

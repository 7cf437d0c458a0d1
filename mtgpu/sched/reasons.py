"""Per-node reasons, joined into the one line `mt-job show` prints.

Nodes that refuse for the same reason are named together, and a long list is cut
("nodes a, b, c and 997 more: no GPU of model h200"), so the line stays readable
on a 10,000-node cluster.
"""

from __future__ import annotations

from mtgpu.model.units import format_size

MAX_NAMES_PER_REASON = 3
MAX_REASONS = 8


def join_node_reasons(per_node: list[tuple[str, str]]) -> str:
    """"node a: r1; nodes b, c: r2" from (node, reason) pairs, in first-seen order."""
    groups: dict[str, list[str]] = {}
    for node, reason in per_node:
        groups.setdefault(reason, []).append(node)
    parts = []
    for i, (reason, nodes) in enumerate(groups.items()):
        if i == MAX_REASONS:
            rest = sum(len(v) for v in list(groups.values())[i:])
            parts.append(f"{rest} more node{'s' if rest != 1 else ''} for other reasons")
            break
        parts.append(f"{_names(nodes)}: {reason}")
    return "; ".join(parts)


def _names(nodes: list[str]) -> str:
    if len(nodes) == 1:
        return f"node {nodes[0]}"
    shown = ", ".join(nodes[:MAX_NAMES_PER_REASON])
    more = len(nodes) - MAX_NAMES_PER_REASON
    return f"nodes {shown}" + (f" and {more} more" if more > 0 else "")


def gpus_of(n: int, kind: str) -> str:
    """"2 GPUs", "1 rtx4090 GPU"."""
    noun = "GPU" if n == 1 else "GPUs"
    return f"{n} {noun}" if kind == "GPU" else f"{n} {kind} {noun}"


def gpu_capacity_reason(kind: str, model: str | None, vendor: str | None, matching_totals: list[int],
                        gpu_count: int, vram_bytes: int | None) -> str | None:
    """Why a node's GPUs of the asked kind can never hold the request, whatever runs
    there (none of that kind, too few, too little memory); None when they could.
    `matching_totals` are the total VRAM of the node's GPUs that match the request."""
    if not matching_totals:
        if model:
            return f"no GPU of model {kind}"
        return f"no GPU of vendor {kind}" if vendor else "no GPU"
    if len(matching_totals) < gpu_count:
        return f"only {gpus_of(len(matching_totals), kind)} ({gpu_count} asked)"
    if vram_bytes is not None and sum(1 for t in matching_totals if t >= vram_bytes) < gpu_count:
        most = max(matching_totals)
        return f"no {kind} with {format_size(vram_bytes)} VRAM ({format_size(most)} total < {format_size(vram_bytes)})"
    return None

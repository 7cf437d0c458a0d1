"""The third verdict: a request that no node of the cluster could ever satisfy.

Judged against each node's totals as if it were empty. Drained or down nodes
still count (they may come back); only what the hardware could never give refuses.
"""

from __future__ import annotations

from mtgpu.model.cluster import ClusterSnapshot, NodeView
from mtgpu.model.gpu import model_matches
from mtgpu.model.job import JobSpec
from mtgpu.model.units import format_size

from .containers import cluster_refusal, container_reason, offered_images
from .reasons import gpu_capacity_reason, join_node_reasons
from .request import EPS, RankRequest, rank_requests


def never_reason(node: NodeView, req: RankRequest) -> str | None:
    """Why an empty `node` could never host one rank of `req`, or None if it could."""
    if req.cpus > 0 and float(node.cpus_total) + EPS < req.cpus:
        return f"has {node.cpus_total:g} CPUs ({req.cpus:g} asked)"
    if req.mem_bytes > 0 and node.mem_total_bytes < req.mem_bytes:
        return f"has {format_size(node.mem_total_bytes)} memory ({format_size(req.mem_bytes)} asked)"
    if not req.gpu_count:
        return None
    kind = req.kind()
    if not node.gpus:
        return "no GPU (CPU-only node)"
    matching = [
        g for g in node.gpus
        if (req.vendor is None or g.vendor == req.vendor) and (req.model is None or model_matches(req.model, g.model))
    ]
    return gpu_capacity_reason(kind, req.model, req.vendor, [g.vram_total_bytes for g in matching],
                               req.gpu_count, req.vram_bytes)


def hardware_ids(nodes: list[NodeView]) -> dict[str, int]:
    """Node name -> an id equal for nodes whose `never_reason` is the same for every request
    (the same CPUs, memory and GPUs: vendor, model, VRAM, in order)."""
    ids: dict[tuple, int] = {}
    out = {}
    for n in nodes:
        key = (float(n.cpus_total), int(n.mem_total_bytes), tuple((g.vendor, g.model, int(g.vram_total_bytes))
                                                                  for g in n.gpus))
        out[n.name] = ids.setdefault(key, len(ids))
    return out


def check_satisfiable(spec: JobSpec, snapshot: ClusterSnapshot, hardware: dict[str, int] | None = None) -> str | None:
    """The reason no node of the cluster could ever run `spec`, even empty; else None.
    `hardware`: `hardware_ids` of the snapshot's nodes, so that each kind of node is judged once."""
    reqs = rank_requests(spec)
    nodes = snapshot.nodes
    if spec.nodes < 1:
        return f"nodes={spec.nodes} is not a node count (use 1 or more)"
    if spec.server is not None:
        nodes = [n for n in nodes if n.name == spec.server]
        if not nodes:
            return f"server={spec.server}: no node of that name in the cluster"
        if spec.nodes > 1:
            return f"nodes={spec.nodes} cannot run on the single node server={spec.server}"
    if not nodes:
        return "the cluster has no nodes"
    if spec.exclude:
        nodes = [n for n in nodes if n.name not in spec.exclude]
        if not nodes:
            return f"exclude={','.join(spec.exclude)} leaves no node of the cluster"
    per_node: list[tuple[str, str]] = []
    if spec.container is not None:
        refusal = cluster_refusal(spec.container, snapshot)
        if refusal:
            return refusal
        offered = offered_images(snapshot)
        kept = []
        for n in nodes:
            why = container_reason(spec.container, n, offered)
            if why:
                per_node.append((n.name, why))
            else:
                kept.append(n)
        nodes = kept
    able = 0
    judged: dict[int, str | None] = {}  # hardware id -> the node's reason (None: it could)
    for n in nodes:
        hw = hardware.get(n.name) if hardware is not None else None
        if hw is not None and hw in judged:
            why = judged[hw]
        else:
            reasons = [never_reason(n, r) for r in reqs]
            if any(r is None for r in reasons):
                why = None
            elif len(reqs) == 1:
                why = reasons[0]
            else:
                why = " / ".join(f"{q.label}: {r}" for q, r in zip(reqs, reasons))
            if hw is not None:
                judged[hw] = why
        if why is None:
            able += 1
        else:
            per_node.append((n.name, why))
    if able >= spec.nodes:
        return None
    if able == 0:
        return join_node_reasons(per_node)
    head = f"nodes={spec.nodes} but only {able} node{'s' if able != 1 else ''} could ever run one rank"
    return head + ("; " + join_node_reasons(per_node) if per_node else "")

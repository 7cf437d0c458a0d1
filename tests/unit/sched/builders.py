"""Builders for scheduler tests: a node, a GPU, a job in one readable line."""

from __future__ import annotations

from mtgpu.model.cluster import ClusterSnapshot, GpuView, NodeContainers, NodeView, PendingJob
from mtgpu.model.gpu import normalize_model
from mtgpu.model.job import ArraySpec, GpuAlternative, GpuMode, JobSpec
from mtgpu.model.units import parse_size

G = 1024**3

_VENDOR_OF = {"rtx": "nvidia", "a1": "nvidia", "h1": "nvidia", "h2": "nvidia", "t4": "nvidia", "v1": "nvidia",
              "mi": "amd", "ar": "intel", "ma": "intel"}


def _vendor_for(model: str) -> str:
    return next((v for p, v in _VENDOR_OF.items() if model.startswith(p)), "nvidia")


def make_gpu(index: int = 0, model: str = "rtx4090", vram: str | int = "24G", *, vendor: str | None = None,
             used: str | int = 0, util: float = 0.0, committed_fraction: float = 0.0, committed_vram: str | int = 0,
             exclusive: bool = False, shared_jobs: int = 0, oversubscribed_jobs: int = 0) -> GpuView:
    m = normalize_model(model)
    return GpuView(
        index=index, vendor=vendor or _vendor_for(m), model=m, vram_total_bytes=parse_size(vram),
        vram_used_measured_bytes=parse_size(used), utilization_pct=util, committed_fraction=committed_fraction,
        committed_vram_bytes=parse_size(committed_vram), exclusive=exclusive, shared_jobs=shared_jobs,
        oversubscribed_jobs=oversubscribed_jobs,
    )


def make_node(name: str = "a", gpus: int | list[GpuView] = 0, model: str = "rtx4090", vram: str | int = "24G", *,
              cpus: float = 32, mem: str | int = "128G", cpus_committed: float = 0, mem_committed: str | int = 0,
              mem_available: str | int | None = None, schedulable: bool = True, reason: str = "",
              containers: NodeContainers | None = None) -> NodeView:
    gpu_list = gpus if isinstance(gpus, list) else [make_gpu(i, model, vram) for i in range(gpus)]
    return NodeView(
        name=name, gpus=gpu_list, cpus_total=cpus, mem_total_bytes=parse_size(mem), cpus_committed=cpus_committed,
        mem_committed_bytes=parse_size(mem_committed),
        mem_available_measured_bytes=None if mem_available is None else parse_size(mem_available),
        schedulable=schedulable, unschedulable_reason=reason, containers=containers,
    )


def parse_gpus(text: str | None) -> tuple[GpuAlternative, ...]:
    """`gpus=` as a tenant types it: "2", "nvidia:1", "a100:1|h100:1", "t4:0.25"."""
    if not text:
        return ()
    alts = []
    for part in text.split("|"):
        kind, _, n = part.rpartition(":")
        vendor = model = None
        if kind in ("nvidia", "amd", "intel"):
            vendor = kind
        elif kind:
            model = normalize_model(kind)
        alts.append(GpuAlternative(float(n), vendor, model))
    return tuple(alts)


def make_spec(gpus: str | None = None, *, vram: str | None = None, cpus: float | None = None, mem: str | None = None,
              mode: str = "exclusive", server: str | None = None, nodes: int = 1, priority: float = 0.0,
              time: float | None = None, array_max: int | None = None, array_n: int = 0,
              container: str | None = None) -> JobSpec:
    return JobSpec(
        gpus=parse_gpus(gpus), vram_bytes=parse_size(vram) if vram else None, cpus=cpus,
        mem_bytes=parse_size(mem) if mem else None, gpu_mode=GpuMode(mode), server=server, nodes=nodes,
        priority=priority, time_limit_s=time,
        array=ArraySpec(tuple(range(array_n)), array_max) if (array_max or array_n) else None, container=container,
    )


def make_job(job_id: int = 1, gpus: str | None = None, *, tenant: str = "alice", submitted_at: float = 0.0,
             array_parent: int | None = None, running_in_array: int = 0, **spec_kw) -> PendingJob:
    return PendingJob(job_id=job_id, tenant=tenant, spec=make_spec(gpus, **spec_kw), submitted_at=submitted_at,
                      array_parent=array_parent, running_in_array=running_in_array)


def cluster(*nodes: NodeView) -> ClusterSnapshot:
    return ClusterSnapshot(nodes=list(nodes))

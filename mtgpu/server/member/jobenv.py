"""The environment a job sees: clean, plus the DESIGN §3 variables.

Nothing of the server's own environment leaks into a job. Every GPU vendor present
on the node gets its visibility variable set, to the job's GPUs of that vendor or
to nothing, so a CPU-only job on a GPU node sees no GPU at all.
"""

from __future__ import annotations

from ...model.gpu import VISIBILITY_VARS
from ...model.job import GpuMode, Job, NodeAllocation

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def visibility_env(alloc: NodeAllocation, node_vendors: set[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    mine = ",".join(str(g.index) for g in alloc.gpus)
    for vendor in sorted(node_vendors | ({alloc.vendor} if alloc.vendor else set())):
        value = mine if vendor == alloc.vendor else ""
        for var in VISIBILITY_VARS.get(vendor, ()):
            env[var] = value
    return env


def mps_memory_limits(alloc: NodeAllocation) -> str:
    """NVIDIA MPS's per-client memory limit for the job's shared slots that reserve VRAM,
    by the device ordinals the job sees (0..k-1 in its CUDA_VISIBLE_DEVICES order)."""
    return ",".join(f"{i}={max(1, g.vram_bytes >> 20)}M" for i, g in enumerate(alloc.gpus)
                    if g.mode is GpuMode.SHARED and g.vram_bytes > 0)


def job_env(job: Job, rank: int, node_name: str, user: str, home: str,
            node_vendors: set[str], master: tuple[str, int] | None = None, mps: bool = False) -> dict[str, str]:
    alloc = job.allocations[rank]
    env = {
        "PATH": DEFAULT_PATH,
        "HOME": home,
        "USER": user,
        "LOGNAME": user,
        "SHELL": "/bin/bash",
        "LANG": "C.UTF-8",
        "MTGPU_JOB_ID": str(job.id),
        "MTGPU_NODE": node_name,
        "MTGPU_JOB_NAME": job.spec.name or f"job-{job.id}",
        "MTGPU_TENANT": job.tenant,
        "MTGPU_GPU_MODE": job.spec.gpu_mode.value,
        # how many times the job was requeued before this run (Slurm's SLURM_RESTART_COUNT)
        "MTGPU_RESTART_COUNT": str(job.attempt),
    }
    if job.array_index is not None:
        env["MTGPU_ARRAY_INDEX"] = str(job.array_index)
        env["MTGPU_ARRAY_JOB_ID"] = str(job.array_parent)
    if alloc.cpus:
        env["MTGPU_CPUS"] = f"{alloc.cpus:g}"
        env["OMP_NUM_THREADS"] = str(max(1, int(alloc.cpus)))
    env.update(visibility_env(alloc, node_vendors))
    if mps and alloc.vendor == "nvidia" and mps_memory_limits(alloc):
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = mps_memory_limits(alloc)
    if len(job.allocations) > 1 and master is not None:
        nnodes, host, port = str(len(job.allocations)), master[0], str(master[1])
        for prefix in ("MTGPU_", "PET_"):
            env[prefix + "NNODES"] = nnodes
            env[prefix + "NODE_RANK"] = str(rank)
        env["MASTER_ADDR"] = env["PET_MASTER_ADDR"] = host
        env["MASTER_PORT"] = env["PET_MASTER_PORT"] = port
    return env

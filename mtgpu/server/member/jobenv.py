"""The environment a job sees: clean, plus the DESIGN §3 variables and Slurm's.

Nothing of the server's own environment leaks into a job. Every GPU vendor present
on the node gets its visibility variable set, to the job's GPUs of that vendor or
to nothing, so a CPU-only job on a GPU node sees no GPU at all. A Slurm script (its
#SBATCH lines, or sbatch options given) also sees the SLURM_* variables batch scripts
read (docs/SLURM.md), and our `srun` first on its PATH; an #MTGPU job sees neither, so
that Slurm-aware tools (OpenMPI's mpirun) do not take it for a Slurm allocation.
"""

from __future__ import annotations

import math

from ...agent.runners.base import SLURM_BIN_DIR
from ...jobfile.patterns import PatternValues, expand_pattern
from ...model.job import GpuMode, Job, NodeAllocation
from ...model.gpu import VISIBILITY_VARS

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
JOB_PATH = f"{SLURM_BIN_DIR}:{DEFAULT_PATH}"  # srun (agent/runners/slurm_bin) before anything else


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
        "PATH": JOB_PATH if job.spec.slurm else DEFAULT_PATH,
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
    if job.spec.slurm:  # not for #MTGPU jobs: Slurm-aware tools (mpirun) would take it for a Slurm allocation
        env.update(slurm_env(job, rank, node_name, user, home))
        env.update(step_output_env(job, rank, user, home))
    if len(job.allocations) > 1 and master is not None:
        nnodes, host, port = str(len(job.allocations)), master[0], str(master[1])
        for prefix in ("MTGPU_", "PET_"):
            env[prefix + "NNODES"] = nnodes
            env[prefix + "NODE_RANK"] = str(rank)
        env["MASTER_ADDR"] = env["PET_MASTER_ADDR"] = host
        env["MASTER_PORT"] = env["PET_MASTER_PORT"] = port
    return env


def slurm_env(job: Job, rank: int, node_name: str, user: str, home: str) -> dict[str, str]:
    """Slurm's variables, as a batch script under sbatch sees them. One task runs per node
    here, so the task's rank is the node's and there are as many tasks as nodes."""
    alloc = job.allocations[rank]
    nodes = [a.node for a in job.allocations]
    nnodes = str(len(nodes))
    env = {
        "SLURM_JOB_ID": str(job.id), "SLURM_JOBID": str(job.id),
        "SLURM_JOB_NAME": job.spec.name or f"job-{job.id}",
        "SLURM_JOB_USER": user, "SLURM_JOB_UID": str(job.uid), "SLURM_JOB_GID": str(job.gid),
        "SLURM_NNODES": nnodes, "SLURM_JOB_NUM_NODES": nnodes,
        "SLURM_NODEID": str(rank), "SLURM_PROCID": str(rank), "SLURM_LOCALID": "0",
        "SLURM_NTASKS": nnodes, "SLURM_NPROCS": nnodes, "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_TASKS_PER_NODE": "1" if len(nodes) == 1 else f"1(x{len(nodes)})",
        "SLURM_JOB_NODELIST": ",".join(nodes), "SLURM_NODELIST": ",".join(nodes),
        "SLURMD_NODENAME": node_name,
        "SLURM_SUBMIT_DIR": job.spec.submit_dir or job.spec.workdir or home,
        "SLURM_GPUS_ON_NODE": str(len(alloc.gpus)),
        "SLURM_RESTART_COUNT": str(job.attempt),
    }
    if alloc.gpus:
        env["SLURM_GPUS_PER_NODE"] = str(len(alloc.gpus))
        env["SLURM_JOB_GPUS"] = ",".join(str(g.index) for g in alloc.gpus)
    if alloc.cpus:
        cpus = str(max(1, math.ceil(alloc.cpus - 1e-9)))
        env["SLURM_CPUS_PER_TASK"] = env["SLURM_CPUS_ON_NODE"] = env["SLURM_JOB_CPUS_PER_NODE"] = cpus
    if alloc.mem_bytes:
        env["SLURM_MEM_PER_NODE"] = str(max(1, alloc.mem_bytes >> 20))  # megabytes, as Slurm's
    if job.array_index is not None:
        env["SLURM_ARRAY_JOB_ID"] = str(job.array_parent)
        env["SLURM_ARRAY_TASK_ID"] = str(job.array_index)
        indices = job.spec.array.indices if job.spec.array else (job.array_index,)
        env["SLURM_ARRAY_TASK_COUNT"] = str(len(indices))
        env["SLURM_ARRAY_TASK_MIN"] = str(min(indices))
        env["SLURM_ARRAY_TASK_MAX"] = str(max(indices))
        steps = {b - a for a, b in zip(indices, indices[1:])}
        env["SLURM_ARRAY_TASK_STEP"] = str(steps.pop() if len(steps) == 1 else 1)
    return env


def step_output_env(job: Job, rank: int, user: str, home: str) -> dict[str, str]:
    """For the other ranks of a Slurm job on several nodes: rank 0's output file, absolute
    (MTGPU_STEP_OUTPUT), which their `srun` steps append to, as Slurm gathers every task's
    output into the batch step's --output. Not when the job has a separate error= file:
    then their steps' output stays in their own logs."""
    if rank == 0 or len(job.allocations) < 2:
        return {}
    out, err = output_paths(job, 0, job.allocations[0].node, user)
    if out is None or err is not None:
        return {}
    workdir = job.spec.workdir or home
    return {"MTGPU_STEP_OUTPUT": out if out.startswith("/") else f"{workdir.rstrip('/')}/{out}"}


def output_paths(job: Job, rank: int, node_name: str, user: str) -> tuple[str | None, str | None]:
    """Where the job's output= and error= files are, on this node (None: not asked). Only
    rank 0 writes them, as only the batch step writes sbatch's --output: the other ranks of
    a job on several nodes keep their output in their own logs."""
    if rank != 0 or not (job.spec.output or job.spec.error):
        return None, None
    values = PatternValues(job_id=job.id, array_job_id=job.array_parent, array_index=job.array_index,
                           name=job.spec.name or f"job-{job.id}", user=user, node=node_name, node_rank=rank)
    out = expand_pattern(job.spec.output, values) if job.spec.output else None
    err = expand_pattern(job.spec.error, values) if job.spec.error else None
    return out, (err if err != out else None)

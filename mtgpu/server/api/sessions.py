"""A tenant's session joins one of its running jobs (`mt-job attach`, an SSH login with
`MTGPU_JOB`), Slurm's pam_slurm_adopt and `srun --jobid --overlap`; and the GPUs of this
member with their device nodes, for `mt-job gpus` (the nvidia-smi-style view).

Attaching moves the calling process, the socket's peer (SO_PEERCRED; its real and effective
uid checked to be the caller's just before), into every cgroup of the job on this member,
devices first: what it then runs is born there, opens exactly the job's GPUs, counts
against the job's CPU, memory and pids, is measured as the job's by the GPU telemetry
(the job's pids are its cgroups'), and ends with the job (docs/ISOLATION.md).
"""

from __future__ import annotations

import os

from ...accounts.lookup import tenant_home_of
from ...model.job import Job, JobState
from ..member.jobenv import job_env
from .identity import Caller
from .service import MemberService, ServiceError

# What the attached session keeps of its own: where it is, who it is, its shell and locale.
SESSION_OWN = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG")


def attach(service: MemberService, caller: Caller, job_id: int) -> dict:
    """Move the caller's process into job `job_id`'s cgroups on this member; returns the
    job's id, this member's name, the job's GPUs here and the environment the job has
    (its visibility variables, MTGPU_* and, for a Slurm script, SLURM_*). Refuses another
    tenant's job, one not running, and one running on other members only, saying how."""
    node = service.node_name
    job = service.store.machine.jobs.get(job_id)
    if job is None or not (caller.is_admin or job.uid == caller.uid):
        raise ServiceError(404, f"no job {job_id} of yours; `mt-job list` shows your jobs")
    if job.uid != caller.uid:
        raise ServiceError(403, f"job {job_id} is {job.tenant}'s: a session joins only its own tenant's jobs (an "
                                f"admin sees it with `mtgpu-admin jobs`)")
    if job.state is JobState.QUEUED or job.state is JobState.STOPPED:
        raise ServiceError(409, f"job {job_id} is {job.state.value}, not running: attach once it runs "
                                f"(`mt-job show {job_id}` says why it waits)")
    if job.state.final:
        raise ServiceError(409, f"job {job_id} is {job.state.value}: only a running job can be attached to; "
                                "`mt-job submit` starts a new one")
    rank = next((r for r, a in enumerate(job.allocations) if a.node == node), None)
    if rank is None:
        where = ", ".join(a.node for a in job.allocations) or "no member"
        raise ServiceError(409, f"job {job_id} runs on {where}, not on {node}: log in to "
                                f"{job.allocations[0].node if job.allocations else 'its member'} and run "
                                f"`mt-job attach {job_id}` there")
    cgroups = getattr(service.member.agent.runner, "cgroups", None)
    if cgroups is None or cgroups.get(job_id) is None:
        raise ServiceError(409, f"job {job_id} has no cgroup on {node} (it is starting, or this member cannot make "
                                "cgroups: `mt-job show` lists what is enforced), so a session cannot join its GPUs; "
                                "try again in a moment")
    service._check_peer(caller)
    try:
        cgroups.enter(job_id, caller.pid)
    except OSError as e:
        raise ServiceError(500, f"job {job_id}: this session could not be put into the job's cgroup "
                                f"({e.strerror or e}), so it would not hold the job's GPUs") from None
    return {"job_id": job_id, "node": node, "gpus": [g.index for g in job.allocations[rank].gpus],
            "env": attached_env(service, job, rank)}


def attached_env(service: MemberService, job: Job, rank: int) -> dict[str, str]:
    """The job's own variables, as its processes on this member have them (jobenv.job_env),
    less what the session keeps of its own (SESSION_OWN)."""
    agent = service.member.agent
    vendors = {g.vendor for g in agent.last_gpus()}
    master = None
    if len(job.allocations) > 1 and job.master_port is not None:
        rank0 = service.store.machine.nodes.get(job.allocations[0].node)
        if rank0 is not None and rank0.address:
            host = rank0.address.rsplit(":", 1)[0].strip("[]")
            master = ("127.0.0.1" if host in ("0.0.0.0", "", "::") else host, job.master_port)
    home = tenant_home_of(service.config.TENANT_HOME_ROOT, job.tenant, job.uid)
    mps = bool(getattr(getattr(service.member, "agent_loop", None), "mps", False))
    env = job_env(job, rank, service.node_name, job.tenant, home, vendors, master, mps=mps)
    return {k: v for k, v in env.items() if k not in SESSION_OWN}


def local_gpus(service: MemberService, caller: Caller) -> list[dict]:
    """This member's GPUs as last measured, each with its device nodes (which the caller's
    CLI tries to open: what its process can open is the view) and the caller's job that
    holds it here, if any."""
    agent = service.member.agent
    held: dict[int, list[int]] = {}
    for job in service.store.machine.running_jobs():
        if job.uid != caller.uid:
            continue
        for a in job.allocations:
            if a.node == service.node_name:
                for g in a.gpus:
                    held.setdefault(g.index, []).append(job.id)
    out = []
    for g in agent.last_gpus():
        out.append({"index": g.index, "vendor": g.vendor, "model": g.model, "uuid": g.uuid,
                    "vram_total_bytes": g.vram_total_bytes, "vram_used_bytes": g.vram_used_bytes,
                    "utilization_pct": g.utilization_pct,
                    "devices": [p for p in agent.gpu_devices.get(g.index, ()) if os.path.isabs(p)],
                    "your_jobs": sorted(held.get(g.index, []))})
    return out

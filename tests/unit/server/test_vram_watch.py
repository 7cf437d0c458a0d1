"""VRAM reservations in shared mode: the decision, with time passed in."""

from mtgpu.model.gpu import GpuInfo, GpuProcess
from mtgpu.model.job import GpuMode, GpuSlot, Job, JobSpec, JobState, NodeAllocation
from mtgpu.server.member.jobenv import mps_memory_limits
from mtgpu.server.member.vram_watch import VramWatch, overuse

G = 1 << 30


def shared_job(job_id: int, gpu: int = 0, vram: int = 8 * G, node: str = "n1") -> Job:
    slot = GpuSlot(gpu, 0.5, vram, GpuMode.SHARED)
    return Job(job_id, "t", 2000 + job_id, 2000 + job_id, JobSpec(), state=JobState.RUNNING,
               allocations=(NodeAllocation(node, (slot,), vendor="nvidia"),))


def sample(*procs: tuple[int, int]) -> list[GpuInfo]:
    return [GpuInfo(0, "nvidia", "RTX", "u", 24 * G, processes=[GpuProcess(p, b, "") for p, b in procs])]


def test_overuse_remembers_since_when_and_forgets_once_back_within():
    since, over = overuse(10.0, {1: {0: 9 * G}}, {1: {0: 8 * G}}, {})
    assert over == [(1, 0, 10.0)] and since == {(1, 0): 10.0}
    since, over = overuse(12.0, {1: {0: 9 * G}}, {1: {0: 8 * G}}, since)
    assert over == [(1, 0, 10.0)]
    since, over = overuse(13.0, {1: {0: 8 * G}}, {1: {0: 8 * G}}, since)  # at the reservation: fine
    assert over == [] and since == {}


def test_stop_only_after_the_grace_and_only_the_job_over_its_reservation():
    w = VramWatch("n1", "stop", grace_s=5.0)
    jobs = [shared_job(1), shared_job(2)]
    pids = {1: {101, 102}, 2: {201}}.get
    gpus = sample((101, 6 * G), (102, 4 * G), (201, 3 * G))  # job 1: 10G in two processes
    assert w.check(0.0, jobs, pids, gpus) == []
    assert w.check(4.9, jobs, pids, gpus) == []
    [(o, why)] = w.check(5.0, jobs, pids, gpus)
    assert (o.job_id, o.gpu, o.used_bytes, o.reserved_bytes) == (1, 0, 10 * G, 8 * G)
    assert why.startswith("used 10G of VRAM on GPU 0, above the 8G it reserved") and "more than 5s" in why


def test_a_dip_below_the_reservation_starts_the_grace_again():
    w = VramWatch("n1", "stop", grace_s=5.0)
    jobs, pids = [shared_job(1)], {1: {101}}.get
    w.check(0.0, jobs, pids, sample((101, 9 * G)))
    w.check(3.0, jobs, pids, sample((101, 7 * G)))
    assert w.check(6.0, jobs, pids, sample((101, 9 * G))) == []
    assert len(w.check(11.0, jobs, pids, sample((101, 9 * G)))) == 1


def test_warn_says_it_once_per_attempt_and_off_does_nothing():
    jobs, pids, gpus = [shared_job(1)], {1: {101}}.get, sample((101, 9 * G))
    w = VramWatch("n1", "warn", grace_s=5.0)
    [(_, why)] = w.check(0.0, jobs, pids, gpus)
    assert why.startswith("warning: used 9G") and 'vram_overuse = "warn"' in why
    assert w.check(1.0, jobs, pids, gpus) == []
    assert VramWatch("n1", "off", 5.0).check(100.0, jobs, pids, gpus) == []


def test_exclusive_jobs_and_other_members_slots_are_not_watched():
    excl = Job(3, "t", 2003, 2003, JobSpec(), state=JobState.RUNNING,
               allocations=(NodeAllocation("n1", (GpuSlot(0, 1.0, 0, GpuMode.EXCLUSIVE),)),))
    elsewhere = shared_job(4, node="n2")
    w = VramWatch("n1", "stop", grace_s=0.0)
    assert w.check(0.0, [excl, elsewhere], {3: {301}, 4: {401}}.get, sample((301, 20 * G), (401, 20 * G))) == []


def test_mps_gets_the_reservation_by_the_jobs_own_device_ordinals():
    alloc = NodeAllocation("n1", (GpuSlot(3, 0.5, 8 * G, GpuMode.SHARED), GpuSlot(5, 0.5, 512 << 20, GpuMode.SHARED)))
    assert mps_memory_limits(alloc) == "0=8192M,1=512M"

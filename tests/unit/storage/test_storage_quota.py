"""storage.quota: the refusal and warning figures, the measured backend's cache, backend choice."""

from __future__ import annotations

import errno
import os

from mtgpu.storage.quota import (
    Q_GETQUOTA,
    Q_SETQUOTA,
    FsQuotaUsage,
    MeasuredUsage,
    check_submission,
    detect_quota_backend,
    measure_tree,
    qcmd,
    quota_warning,
)

GIB = 1024**3


def test_over_the_limit_submission_is_refused_with_the_figures_and_the_fix():
    msg = check_submission("alice", 212 * GIB, 200 * GIB, "/home/mtgpu/alice")
    assert msg == ("disk quota exceeded: 212G used of 200G (USER_DISK_LIMIT); "
                   "delete files under /home/mtgpu/alice to submit again")


def test_exactly_at_the_limit_is_refused_and_one_byte_under_is_accepted_with_a_warning():
    assert check_submission("alice", 200 * GIB, 200 * GIB) is not None
    assert check_submission("alice", 200 * GIB - 1, 200 * GIB) is None
    assert "200G used of 200G (99%" in quota_warning("alice", 200 * GIB - 1, 200 * GIB)
    assert quota_warning("alice", 200 * GIB, 200 * GIB) is None  # refused, not warned


def test_warning_starts_at_90_percent():
    limit = 100 * GIB
    assert quota_warning("alice", 89 * GIB, limit) is None
    warning = quota_warning("alice", 90 * GIB, limit, "/home/mtgpu/alice")
    assert warning is not None and "90G used of 100G (90%" in warning and "/home/mtgpu/alice" in warning


def test_no_limit_means_nothing_is_refused_or_warned():
    assert check_submission("alice", 10**15, None) is None
    assert quota_warning("alice", 10**15, None) is None


def test_measured_usage_is_cached_for_max_age_and_remeasured_after(tmp_path):
    home = tmp_path / "alice"
    home.mkdir()
    (home / "a").write_bytes(b"x" * 100_000)
    usage = MeasuredUsage(tmp_path, max_age_s=60)
    first = usage.usage("alice", 1, now=1000.0)
    assert first.used_bytes >= 100_000 and first.complete and first.source == "measured"
    (home / "b").write_bytes(b"y" * 200_000)
    assert usage.usage("alice", 1, now=1059.0) == first  # cached
    later = usage.usage("alice", 1, now=1060.0)
    assert later.used_bytes >= first.used_bytes + 200_000
    usage.invalidate("alice")
    assert usage.usage("alice", 1, now=1061.0).measured_at == 1061.0


def test_measuring_stops_at_the_time_budget_and_says_so(tmp_path):
    for i in range(5):
        (tmp_path / f"d{i}").mkdir()
    ticks = iter(range(0, 1000, 10))
    used, complete, _ = measure_tree(tmp_path, time_budget_s=15, clock=lambda: float(next(ticks)))
    assert not complete and used > 0


def test_hard_links_count_once_and_symlinks_are_not_followed(tmp_path):
    (tmp_path / "big").write_bytes(b"z" * 1_000_000)
    os.link(tmp_path / "big", tmp_path / "big2")
    outside = tmp_path.parent / (tmp_path.name + "-outside")
    outside.mkdir()
    (outside / "huge").write_bytes(b"q" * 3_000_000)
    os.symlink(outside, tmp_path / "link")
    used, complete, problems = measure_tree(tmp_path)
    assert complete and problems == []
    assert 1_000_000 <= used < 1_300_000


def test_missing_home_uses_nothing(tmp_path):
    assert MeasuredUsage(tmp_path).usage("ghost", 1, now=0.0).used_bytes == 0


def test_filesystem_quota_backend_reads_and_sets_through_quotactl():
    calls = []

    def quotactl(cmd, special, qid, dq):
        calls.append((cmd, special, qid))
        if cmd == qcmd(Q_GETQUOTA):
            dq.dqb_curspace = 5 * GIB
        else:
            assert dq.dqb_bhardlimit == 200 * GIB // 1024 and dq.dqb_valid == 1

    backend = FsQuotaUsage("/dev/sdz1", quotactl)
    reading = backend.usage("alice", 200_000, now=5.0)
    assert reading.used_bytes == 5 * GIB and reading.source == "quota" and reading.complete
    assert backend.set_limit(200_000, 200 * GIB) is None
    assert calls == [(qcmd(Q_GETQUOTA), b"/dev/sdz1", 200_000), (qcmd(Q_SETQUOTA), b"/dev/sdz1", 200_000)]


def test_detection_falls_back_to_measured_when_the_kernel_has_no_quotas(tmp_path):
    def no_quota(cmd, special, qid, dq):
        raise OSError(errno.ENOSYS, "Function not implemented")

    choice = detect_quota_backend(tmp_path, quotactl=no_quota)
    assert isinstance(choice.backend, MeasuredUsage)
    assert choice.reason.startswith("measured usage")


def test_detection_on_this_machine_gives_a_working_backend(tmp_path):
    choice = detect_quota_backend(tmp_path)  # no quota support here: measured, with a reason
    assert choice.backend.usage("nobody-here", 0, now=0.0).used_bytes >= 0
    assert choice.reason


def test_detection_picks_the_filesystem_quota_when_quotactl_answers(tmp_path):
    dev = os.stat(tmp_path).st_dev
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"36 35 {os.major(dev)}:{os.minor(dev)} / / rw,relatime shared:1 - ext4 /dev/sdq1 rw,usrquota\n")

    def quotactl(cmd, special, qid, dq):
        assert special == b"/dev/sdq1"

    choice = detect_quota_backend(tmp_path, quotactl=quotactl, mountinfo=str(mountinfo))
    assert isinstance(choice.backend, FsQuotaUsage) and choice.backend.device == "/dev/sdq1"

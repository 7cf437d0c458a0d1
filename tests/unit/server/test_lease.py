"""The jobs' lease file (server/cluster/lease.py) and how the shim reads it."""

import importlib.util
import os
import time
from pathlib import Path

from mtgpu.server.cluster.lease import Lease, lease_s

SHIM = Path(__file__).resolve().parents[3] / "mtgpu" / "agent" / "runners" / "shim.py"


def shim_module():
    spec = importlib.util.spec_from_file_location("shim_under_test", SHIM)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_new_lease_is_lapsed_until_renewed(tmp_path):
    lease = Lease(tmp_path / "lease", 7.0)
    assert lease.at == 0.0
    # lapsed: its moment is the monotonic clock's start (the machine's boot), older than any timeout
    age = shim_module()._lease_age(str(tmp_path / "lease"))
    assert age >= time.monotonic() - 1.0 and age > 7.0


def test_renewing_moves_the_lease_forward_only(tmp_path):
    lease = Lease(tmp_path / "lease", 7.0)
    now = time.monotonic()
    lease.renew(now - 1.0)
    lease.renew(now - 5.0)  # an older moment (a late answer, a leader's stale record): ignored
    assert lease.at == now - 1.0
    age = shim_module()._lease_age(str(tmp_path / "lease"))
    assert 1.0 <= age < 60.0


def test_the_file_follows_once_the_moment_moved_a_twentieth_of_the_timeout(tmp_path):
    lease = Lease(tmp_path / "lease", 7.0)  # a step of 0.35 s
    at = time.monotonic() - 3.0
    lease.renew(at)
    lease.renew(at + 0.2)  # the next tick: not written, the file keeps the older moment
    assert lease.at == at and abs(Lease(tmp_path / "lease", 7.0).at - at) < 1e-5
    lease.renew(at + 0.4)
    assert lease.at == at + 0.4 and abs(Lease(tmp_path / "lease", 7.0).at - (at + 0.4)) < 1e-5
    long = Lease(tmp_path / "long", 60.0)  # at most half a second, whatever the timeout
    long.renew(at)
    long.renew(at + 0.5)
    assert long.at == at + 0.5


def test_a_restart_keeps_the_lease_of_the_jobs_it_reattaches(tmp_path):
    first = Lease(tmp_path / "lease", 7.0)
    at = time.monotonic() - 2.0
    first.renew(at)
    assert abs(Lease(tmp_path / "lease", 7.0).at - at) < 1e-5


def test_a_lease_from_before_a_reboot_counts_as_lapsed(tmp_path):
    (tmp_path / "lease").write_text(f"{time.monotonic() + 10_000:.6f}\n")  # the monotonic clock restarted
    assert Lease(tmp_path / "lease", 7.0).at == 0.0


def test_the_shim_takes_a_lease_in_the_future_for_lapsed_and_an_old_empty_file_by_its_mtime(tmp_path):
    shim = shim_module()
    path = tmp_path / "lease"
    path.write_text(f"{time.monotonic() + 100:.6f}\n")
    assert shim._lease_age(str(path)) == float("inf")
    path.write_text("")
    os.utime(path, (time.time() - 30, time.time() - 30))
    assert 29 < shim._lease_age(str(path)) < 60
    assert shim._lease_age(str(tmp_path / "missing")) == float("inf")


def test_the_lease_lapses_a_second_before_the_member_is_marked_down():
    assert lease_s(10.0) == 9.0 and lease_s(3.0) == 2.0


def test_a_refused_lease_write_names_its_file(tmp_path, monkeypatch):
    import errno
    import pathlib

    import pytest

    from mtgpu.server.cluster.lease import Lease
    lease = Lease(tmp_path / "lease", 10.0)

    def full(self, *a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")  # as a write's error: no file named
    monkeypatch.setattr(pathlib.Path, "write_text", full)
    with pytest.raises(OSError) as e:
        lease.renew(1e9)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "lease.tmp")

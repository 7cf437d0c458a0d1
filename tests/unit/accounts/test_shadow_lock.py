"""accounts.shadow_lock: FILE.lock taken as shadow-utils take it (pid and NUL, hard link),
and add_subordinate_ids choosing and writing under it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from mtgpu.accounts.apply import SubIdsRefused, add_subordinate_ids
from mtgpu.accounts.plan import SUBID_BASE, SUBID_COUNT
from mtgpu.accounts.shadow_lock import ShadowLockTimeout, shadow_lock, try_lock


@pytest.fixture
def etc(tmp_path):
    d = tmp_path / "etc"
    d.mkdir()
    (d / "subuid").write_text("")
    (d / "subgid").write_text("")
    return d


@pytest.fixture
def live_pid():
    """A live process that is not us, to name in a lock file; stopped by its pid."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield p.pid
    p.kill()
    p.wait()


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_the_lock_is_a_hard_link_holding_our_pid_and_is_gone_after(etc):
    path = etc / "subuid"
    with shadow_lock(path):
        assert (etc / "subuid.lock").read_bytes() == f"{os.getpid()}\0".encode()  # shadow's own format
        assert sorted(p.name for p in etc.iterdir()) == ["subgid", "subuid", "subuid.lock"]
    assert not (etc / "subuid.lock").exists()


def test_a_lock_held_by_a_live_process_is_waited_for_and_left_alone(etc, live_pid):
    lock = etc / "subuid.lock"
    lock.write_bytes(f"{live_pid}\0".encode())
    assert try_lock(etc / "subuid") == (False, f"pid {live_pid}")
    with pytest.raises(ShadowLockTimeout) as e:
        add_subordinate_ids("bob", SUBID_BASE, SUBID_COUNT, prefix_root=etc.parent, timeout_s=0.3)
    assert f"{lock} is held by pid {live_pid}" in str(e.value) and f"remove {lock}" in str(e.value)
    assert lock.read_bytes() == f"{live_pid}\0".encode()
    assert (etc / "subuid").read_text() == "" and (etc / "subgid").read_text() == ""
    assert not (etc / "subgid.lock").exists()  # subgid's lock is never taken before subuid's


def test_a_stale_lock_of_a_dead_process_is_taken_over_as_the_tools_do(etc):
    (etc / "subuid.lock").write_bytes(f"{dead_pid()}\0".encode())
    assert add_subordinate_ids("bob", SUBID_BASE, SUBID_COUNT, prefix_root=etc.parent) == ["uids", "gids"]
    assert not (etc / "subuid.lock").exists()


def test_a_lock_without_a_pid_is_never_removed(etc):
    (etc / "subuid.lock").write_bytes(b"garbage")
    with pytest.raises(ShadowLockTimeout, match="no valid pid"):
        add_subordinate_ids("bob", SUBID_BASE, SUBID_COUNT, prefix_root=etc.parent, timeout_s=0.2)
    assert (etc / "subuid.lock").read_bytes() == b"garbage"


def test_the_range_is_chosen_under_the_lock_seeing_what_its_holder_wrote(etc, live_pid):
    """A holder (an admin's useradd) adds a range while we wait: the check sees it."""
    lock = etc / "subuid.lock"
    lock.write_bytes(f"{live_pid}\0".encode())
    result: list[object] = []

    def add():
        try:
            result.append(add_subordinate_ids("bob", SUBID_BASE, SUBID_COUNT, prefix_root=etc.parent))
        except Exception as exc:  # handed to the test's thread
            result.append(exc)

    t = threading.Thread(target=add)
    t.start()
    t.join(0.5)
    assert t.is_alive() and result == []  # still waiting for the holder
    (etc / "subuid").write_text(f"admin:{SUBID_BASE + 100}:65536\n")
    lock.unlink()  # the holder is done
    t.join(60)
    assert not t.is_alive()
    assert isinstance(result[0], SubIdsRefused) and "overlap 'admin''s" in str(result[0])
    assert (etc / "subuid").read_text() == f"admin:{SUBID_BASE + 100}:65536\n"
    assert (etc / "subgid").read_text() == ""


def test_two_threads_of_one_process_take_the_lock_in_turn(etc):
    inside = []
    overlap = []

    def worker(i):
        for _ in range(20):
            with shadow_lock(etc / "subuid"):
                inside.append(i)
                if len(inside) > 1:
                    overlap.append(tuple(inside))
                inside.remove(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert overlap == [] and not (etc / "subuid.lock").exists()

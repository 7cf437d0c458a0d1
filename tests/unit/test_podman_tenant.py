"""A tenant's rootless podman setup (agent/podman/tenant.py): the node starts the pause
process only when the pid in pause.pid is not a live process of the tenant's, read through
psutil, and refuses subordinate ids that another account shares."""

import os
import pwd
import subprocess

import pytest

from mtgpu.agent.podman.tenant import PodmanHost, PodmanSetupError, TenantPodman, pause_running, subid_problem


class RecordingTenant(TenantPodman):
    """A tenant whose podman is not run: each call is recorded and answers `returncode`."""

    def run(self, args, **kw):
        self.calls.append(args)
        return subprocess.CompletedProcess([*args], self.returncode, b"", b"Error: no podman here\n")


def tenant(tmp_path, uid: int, pid: int | str | None, returncode: int = 0) -> RecordingTenant:
    t = RecordingTenant(uid, os.getgid(), str(tmp_path), tmp_path / "containers.conf", tmp_path / "storage.conf",
                        tmp_path / "storage", tmp_path / "run")
    object.__setattr__(t, "calls", [])
    object.__setattr__(t, "returncode", returncode)
    if pid is not None:
        (t.runtime_dir / "libpod" / "tmp").mkdir(parents=True)
        (t.runtime_dir / "libpod" / "tmp" / "pause.pid").write_text(f"{pid}\n")
    return t


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_the_pause_process_runs_when_its_pid_is_a_live_process_of_the_tenant(tmp_path):
    assert pause_running(tenant(tmp_path, os.getuid(), os.getpid()))


@pytest.mark.parametrize("case", ["another uid", "no file", "not a number", "gone"])
def test_a_stale_or_foreign_pause_pid_is_not_the_tenants_pause_process(tmp_path, case):
    uid, pid = {"another uid": (os.getuid() + 1, os.getpid()), "no file": (os.getuid(), None),
                "not a number": (os.getuid(), "x"), "gone": (os.getuid(), dead_pid())}[case]
    assert not pause_running(tenant(tmp_path, uid, pid))


def test_ensure_pause_starts_podman_only_when_the_pause_process_is_not_running(tmp_path):
    host = PodmanHost(tmp_path / "state")
    running = tenant(tmp_path / "a", os.getuid(), os.getpid())
    host.ensure_pause(running)
    assert running.calls == []
    stale = tenant(tmp_path / "b", os.getuid() + 1, os.getpid())
    host.ensure_pause(stale)
    assert stale.calls == [["unshare", "true"]]


def test_a_pause_process_that_cannot_start_names_the_uid_and_podmans_error(tmp_path):
    t = tenant(tmp_path, os.getuid(), None, returncode=125)
    with pytest.raises(PodmanSetupError, match=f"podman could not start for uid {os.getuid()}: Error: no podman here"):
        PodmanHost(tmp_path / "state").ensure_pause(t)


def _subid_root(tmp_path, subuid: str, subgid: str):
    (tmp_path / "etc").mkdir()
    for name in ("passwd", "group"):
        (tmp_path / "etc" / name).write_text(open(f"/etc/{name}").read())
    (tmp_path / "etc" / "subuid").write_text(subuid)
    (tmp_path / "etc" / "subgid").write_text(subgid)
    return str(tmp_path)


def test_a_subordinate_range_shared_with_another_account_is_refused_naming_both(tmp_path):
    me = pwd.getpwuid(os.getuid()).pw_name
    mine = f"{me}:1000000000:65536\n"
    root = _subid_root(tmp_path, mine + "other:1000065000:1000\n", mine)
    why = subid_problem(os.getuid(), root)
    assert why is not None and f"{me}'s subordinate uids 1000000000-1000065535 in /etc/subuid overlap 'other''s " \
                               "1000065000-1000065999" in why and "usermod --del-subuids" in why


def test_a_subordinate_range_of_its_own_is_no_problem(tmp_path):
    me = pwd.getpwuid(os.getuid()).pw_name
    mine = f"{me}:1000000000:65536\n"
    assert subid_problem(os.getuid(), _subid_root(tmp_path, mine + "other:1000065536:65536\n", mine)) is None

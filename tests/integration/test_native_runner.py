"""The native runner with real tenants, real processes and (where writable) real cgroups.

Every job is stopped and forgotten at teardown; every process a test starts itself is
killed by PID. Waits poll with deadlines and say what they waited for.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from mtgpu.agent import procs
from mtgpu.agent.local import LocalAgent
from mtgpu.agent.runners.base import ExitInfo, Launch, Runner
from mtgpu.agent.runners.native import NativeRunner, marked_pids

if sys.platform != "linux" or os.geteuid() != 0:
    pytest.skip("the native runner needs Linux and root", allow_module_level=True)


def wait_for(what: str, check, timeout_s: float = 10.0, interval_s: float = 0.02):
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def wait_exit(runner: NativeRunner, job_id: int, timeout_s: float = 20.0) -> ExitInfo:
    return wait_for(f"job {job_id} to end", lambda: runner.poll(job_id), timeout_s)


class Runners:
    """Makes runners on one state dir and leaves nothing behind: stops every job, reaps
    the shims they started, removes job dirs and the test's cgroup parent."""

    def __init__(self):
        self.state_dir = Path(tempfile.mkdtemp(prefix="mtgpu-runner-"))
        # logs live where other users could reach them, so that file modes are what is tested
        self.log_dir = Path(tempfile.mkdtemp(prefix="mtgpu-logs-"))
        os.chmod(self.log_dir, 0o755)
        self.cgroup_parent = f"mtgpu-test-{secrets.token_hex(4)}"
        self.made: list[NativeRunner] = []
        self.cgroup_bases: set[Path] = set()

    def new(self, *, cgroups: bool = True, **kw) -> NativeRunner:
        """A runner; with cgroups=False one that behaves as on a machine without writable
        cgroups (setrlimit, process group and /proc marker scan only)."""
        r = NativeRunner(self.state_dir, cgroup_parent=self.cgroup_parent, **kw)
        self.cgroup_bases |= set(r.cgroups.bases.values())
        if not cgroups:
            r.cgroups.unavailable.update({c: "disabled by the test" for c in r.cgroups.bases})
            r.cgroups.bases.clear()
        self.made.append(r)
        return r

    def close(self) -> None:
        for r in self.made:
            for job_id, run in list(r._runs.items()):
                try:
                    r.stop(job_id, grace_s=0)
                    r.forget(job_id)
                finally:
                    if run.shim is not None:
                        if run.shim.poll() is None:
                            run.shim.kill()
                        run.shim.wait(timeout=5)
        bases = set(self.cgroup_bases)
        bases |= {Path(p).parent for r in self.made for cg in r.cgroups._jobs.values() for p in cg.paths.values()}
        for base in bases:
            dirs = [d for d in base.glob("*") if d.is_dir()] + [base]
            # a killed process re-parented to a PID 1 that reaps slowly can hold a group briefly
            wait_for(f"{base} to be removable", lambda: all(rmdir_if_there(d) for d in dirs), timeout_s=10)
        shutil.rmtree(self.state_dir, ignore_errors=True)
        shutil.rmtree(self.log_dir, ignore_errors=True)


def rmdir_if_there(d: Path) -> bool:
    try:
        d.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


@pytest.fixture
def runners():
    rs = Runners()
    try:
        yield rs
    finally:
        rs.close()


@pytest.fixture
def runner(runners) -> NativeRunner:
    return runners.new()


@pytest.fixture(params=["cgroups", "no-cgroups"])
def any_runner(request, runners) -> NativeRunner:
    """The runner as configured here, and as on a machine without writable cgroups."""
    return runners.new(cgroups=request.param == "cgroups")


def make_launch(runners: Runners, user, script: str, job_id: int = 1, **kw) -> Launch:
    fields = dict(
        job_id=job_id, uid=user.uid, gid=user.gid, extra_gids=(), home=user.home, workdir=user.home,
        script=script, env={"MTGPU_JOB_ID": str(job_id), "CUDA_VISIBLE_DEVICES": "1"},
        log_path=str(runners.log_dir / f"job-{job_id}.log"), cpus=None, mem_bytes=None,
        gpu_vendor=None, gpu_indices=(), all_gpu_indices=(),
    )
    fields.update(kw)
    return Launch(**fields)


def log_of(launch: Launch) -> str:
    """The job's output so far ("" before the shim created the log)."""
    try:
        return Path(launch.log_path).read_text()
    except FileNotFoundError:
        return ""


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_native_runner_keeps_the_runner_contract(runner):
    assert isinstance(runner, Runner)


def test_job_runs_as_the_tenant_and_its_log_is_private_to_it(runners, runner, tenant):
    launch = make_launch(runners, tenant, "id -u\nid -g\npwd\n")
    runner.start(launch)
    assert wait_exit(runner, 1).exit_code == 0
    uid, gid, cwd = log_of(launch).split()
    assert (int(uid), int(gid), cwd) == (tenant.uid, tenant.gid, tenant.home)
    st = os.stat(launch.log_path)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (tenant.uid, tenant.gid, 0o600)


def test_job_sees_exactly_the_environment_it_was_given(runners, runner, tenant, monkeypatch):
    monkeypatch.setenv("MTGPU_TEST_SERVER_ONLY", "leaked")
    env = {"MTGPU_JOB_ID": "1", "MTGPU_NODE": "n1", "CUDA_VISIBLE_DEVICES": "2,3", "PATH": "/usr/bin:/bin"}
    launch = make_launch(runners, tenant, "tr '\\0' '\\n' < /proc/$$/environ\n", env=env)
    state = runner.start(launch)
    assert wait_exit(runner, 1).exit_code == 0
    got = dict(line.split("=", 1) for line in log_of(launch).splitlines())
    assert got == {
        **env, "HOME": tenant.home, "USER": tenant.name, "LOGNAME": tenant.name, "SHELL": "/bin/bash",
        "MTGPU_RUN_TOKEN": state["run_token"],
    }


def test_script_with_a_shebang_runs_under_its_interpreter(runners, runner, tenant):
    if not shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin"):
        pytest.skip("no system python3 a tenant can run")
    launch = make_launch(runners, tenant, "#!/usr/bin/env python3\nimport os\nprint('py', os.getuid())\n")
    runner.start(launch)
    assert wait_exit(runner, 1).exit_code == 0
    assert log_of(launch).split() == ["py", str(tenant.uid)]


def test_exit_code_is_recorded(runners, runner, tenant):
    runner.start(make_launch(runners, tenant, "echo bye\nexit 7\n"))
    info = wait_exit(runner, 1)
    assert (info.exit_code, info.signal) == (7, None)
    assert "7" in info.reason


def test_a_job_that_cannot_start_fails_with_the_reason(runners, runner, tenant):
    runner.start(make_launch(runners, tenant, "true\n", workdir="/nonexistent/dir"))
    info = wait_exit(runner, 1)
    assert info.exit_code == 127 and "/nonexistent/dir" in info.reason


def test_stop_leaves_no_process_of_the_job_behind(runners, any_runner, tenant):
    runner = any_runner
    script = """
sleep 300 &
(sleep 301 &)
setsid bash -c 'sleep 302 & wait' &
bash -c 'trap "" TERM; sleep 303' &
echo ready
wait
"""
    launch = make_launch(runners, tenant, script)
    state = runner.start(launch)
    token = state["run_token"]
    sleeps = {f"sleep\x00{n}\x00".encode() for n in (300, 301, 302, 303)}
    wait_for("the job's four sleeps", lambda: sleeps <= {cmdline(p) for p in marked_pids(1, token)})
    assert runner.poll(1) is None
    runner.stop(1, grace_s=0.5)  # the TERM-ignoring sleep needs the SIGKILL
    assert marked_pids(1, token) == set()
    assert runner.cgroups.pids(1) == set()
    info = runner.poll(1)
    assert info is not None and info.exit_code is None and info.signal in (signal.SIGTERM, signal.SIGKILL)


def test_enforced_says_what_is_enforced_here(runners, runner, tenant):
    runner.start(make_launch(runners, tenant, "true\n", cpus=0.5, mem_bytes=256 << 20))
    wait_exit(runner, 1)
    enf = runner.enforced(1)
    cg = runner.cgroups
    tag = f"cgroup-{cg.version}"
    assert enf["memory"] == (tag if "memory" in cg.bases or "unified" in cg.bases else "setrlimit(RLIMIT_AS)")
    assert enf["cpu"] == (tag if "cpu" in cg.bases or "unified" in cg.bases else "not enforced (cpu cgroup not writable)")
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        assert enf["devices"] == "not applicable (no GPU device nodes)"


def test_a_job_over_its_memory_limit_is_killed(runners, runner, tenant):
    if "memory" not in runner.cgroups.bases:
        pytest.skip(f"no writable v1 memory cgroup here: {runner.cgroups.unavailable.get('memory')}")
    if not Path("/usr/bin/python3").exists():
        pytest.skip("no /usr/bin/python3 to allocate memory with")
    script = "exec /usr/bin/python3 -c \"x = 'x' * (400 << 20); print('survived')\"\n"
    launch = make_launch(runners, tenant, script, mem_bytes=64 << 20)
    runner.start(launch)
    info = wait_exit(runner, 1, timeout_s=30)
    assert runner.enforced(1)["memory"] == "cgroup-v1"
    assert info.signal == signal.SIGKILL, info
    assert "survived" not in log_of(launch)


def test_without_cgroups_memory_falls_back_to_setrlimit(runners, tenant):
    if not Path("/usr/bin/python3").exists():
        pytest.skip("no /usr/bin/python3 to allocate memory with")
    runner = runners.new(cgroups=False)
    script = "exec /usr/bin/python3 -c \"x = 'x' * (400 << 20); print('survived')\"\n"
    launch = make_launch(runners, tenant, script, mem_bytes=128 << 20, cpus=1)
    runner.start(launch)
    info = wait_exit(runner, 1, timeout_s=30)
    assert info.exit_code == 1 and "MemoryError" in log_of(launch)
    enf = runner.enforced(1)
    assert (enf["memory"], enf["mem_fallback"]) == ("setrlimit(RLIMIT_AS)", "setrlimit")
    assert enf["cpu"].startswith("not enforced")
    assert enf["tree_kill"] == "process group + /proc marker scan"


def test_a_new_runner_reattaches_to_a_running_job(runners, tenant):
    first = runners.new()
    state = first.start(make_launch(runners, tenant, "sleep 2\nexit 3\n"))
    wait_for("the job to start", lambda: first.get_state(1).get("job_pid"))
    state = first.get_state(1)

    second = runners.new()  # the server restarted
    assert second.load_state(1, state) == "running"
    assert second.poll(1) is None
    info = wait_exit(second, 1)
    assert (info.exit_code, info.signal) == (3, None)
    first._runs[1].shim.wait(timeout=5)  # reap: the test process was the shim's parent
    del first._runs[1]


def start_two_sleeps(runner: NativeRunner, runners: Runners, tenant) -> dict:
    """Job 1 on `runner`: two sleeps, one in the background; its state once both run."""
    state = runner.start(make_launch(runners, tenant, "sleep 300 &\nsleep 301\n"))
    sleeps = {b"sleep\x00300\x00", b"sleep\x00301\x00"}
    wait_for("the job's sleeps", lambda: sleeps <= {cmdline(p) for p in marked_pids(1, state["run_token"])})
    return state


def test_reattach_without_the_persisted_state_still_finds_and_stops_the_job(runners, tenant):
    first = runners.new()
    state = start_two_sleeps(first, runners, tenant)

    second = runners.new()  # restarted, and the agent lost its copy of the state
    assert second.load_state(1, {}) == "running"
    assert second.poll(1) is None
    second.stop(1, grace_s=1)
    assert marked_pids(1, state["run_token"]) == set()
    assert second.poll(1) is not None
    first._runs[1].shim.wait(timeout=5)
    del first._runs[1]


def kill_shim_and_keeper(first: NativeRunner) -> dict:
    """SIGKILL a running job's shim, then its keeper (started.json's pid, the job's parent),
    as with the server down; returns the run's state."""
    state = first.get_state(1)
    os.kill(state["shim_pid"], signal.SIGKILL)
    first._runs[1].shim.wait(timeout=5)
    os.kill(state["job_pid"], signal.SIGKILL)
    wait_for("the keeper to die", lambda: not procs.alive(state["job_pid"]))
    del first._runs[1]
    return state


def killed_with_its_shim(runners, tenant) -> dict:
    """A job whose shim, keeper and process were SIGKILLed while the server was down: its state."""
    first = runners.new()
    state = first.start(make_launch(runners, tenant, "exec sleep 300\n"))
    wait_for("the job to exec sleep", lambda: b"sleep\x00300\x00" in {cmdline(p) for p in marked_pids(1, state["run_token"])})
    state = kill_shim_and_keeper(first)
    for pid in marked_pids(1, state["run_token"]):
        os.kill(pid, signal.SIGKILL)
    wait_for("the job's process to die", lambda: not marked_pids(1, state["run_token"]))
    return state


def test_a_job_whose_shim_and_process_were_killed_in_this_boot_ended_unknown(runners, tenant):
    state = killed_with_its_shim(runners, tenant)
    second = runners.new()
    assert second.load_state(1, state) == "lost"
    info = second.poll(1)
    assert info is not None and info.unknown and not info.lost and not info.natural and info.exit_code is None
    assert "was killed in this boot" in info.reason and "were gone too" in info.reason
    assert "exit status is unknown" in info.reason


def test_a_job_recorded_in_another_boot_was_killed_by_the_restart(runners, tenant):
    state = killed_with_its_shim(runners, tenant)
    second = runners.new(boot_id=lambda: "0" * 32)  # the machine restarted since the shim recorded its start
    assert second.load_state(1, state) == "lost"
    info = second.poll(1)
    assert info is not None and info.lost and not info.unknown and "the machine restarted while it ran" in info.reason


def test_a_job_that_outlived_its_killed_shim_ends_with_its_own_status_recorded_by_its_keeper(runners, tenant):
    flag = Path(tenant.home) / f"flag-{secrets.token_hex(4)}"
    first = runners.new()
    started = first.start(make_launch(runners, tenant, f"while [ ! -e {flag} ]; do sleep 0.05; done\nexit 3\n"))
    # its processes run (started.json alone is written before the shim's go: a shim killed
    # between the two leaves a job that never ran, which is not what this test is about)
    wait_for("the job to run", lambda: marked_pids(1, started["run_token"]))
    state = first.get_state(1)
    os.kill(state["shim_pid"], signal.SIGKILL)  # the supervisor dies, the job runs on
    first._runs[1].shim.wait(timeout=5)
    del first._runs[1]
    try:
        second = runners.new()  # the server restarted
        assert second.load_state(1, state) == "running-unsupervised"
        assert second.poll(1) is None
        flag.touch()
        info = wait_exit(second, 1)
        assert info.natural and (info.exit_code, info.signal) == (3, None), info
        assert runners.new().load_state(1, state) == "ended"  # and so it reads after another restart
    finally:
        flag.unlink(missing_ok=True)


def test_a_job_whose_shim_and_keeper_were_killed_is_watched_to_its_end_which_is_unknown(runners, tenant):
    flag = Path(tenant.home) / f"flag-{secrets.token_hex(4)}"
    first = runners.new()
    state = first.start(make_launch(runners, tenant, f"while [ ! -e {flag} ]; do sleep 0.05; done\nexit 0\n"))
    wait_for("the job to start", lambda: marked_pids(1, state["run_token"]))
    state = kill_shim_and_keeper(first)  # the job itself runs on
    try:
        second = runners.new()
        assert second.load_state(1, state) == "running-unsupervised"
        assert second.poll(1) is None
        flag.touch()
        info = wait_exit(second, 1)
        assert info.unknown and info.exit_code is None and "ran on without it until" in info.reason, info
    finally:
        flag.unlink(missing_ok=True)


def test_a_job_that_outlived_its_killed_shim_can_be_fenced_by_the_server_and_ends_fenced(runners, tenant):
    first = runners.new()
    start_two_sleeps(first, runners, tenant)
    state = first.get_state(1)
    os.kill(state["shim_pid"], signal.SIGKILL)
    first._runs[1].shim.wait(timeout=5)
    del first._runs[1]

    second = runners.new()
    assert second.load_state(1, state) == "running-unsupervised" and second.unsupervised(1)
    second.fence(1, "fenced: the lease lapsed")
    assert marked_pids(1, state["run_token"]) == set()
    info = second.poll(1)
    assert info.fenced and not info.natural and info.reason == "fenced: the lease lapsed" and not second.unsupervised(1)
    third = runners.new()  # and so it reads after another restart
    assert third.load_state(1, state) in ("lost", "ended") and third.poll(1).fenced  # its keeper may have seen it end
    del second._runs[1]


def test_a_tenant_cannot_read_another_tenants_log(runners, runner, temp_user_factory):
    alice, bob = temp_user_factory("mtta"), temp_user_factory("mttb")
    launch = make_launch(runners, alice, "echo alice-secret\n")
    runner.start(launch)
    wait_exit(runner, 1)
    as_bob = subprocess.run(["cat", launch.log_path], user=bob.uid, group=bob.gid, extra_groups=[],
                            capture_output=True, text=True, timeout=10)
    assert as_bob.returncode != 0 and "Permission denied" in as_bob.stderr
    as_alice = subprocess.run(["cat", launch.log_path], user=alice.uid, group=alice.gid, extra_groups=[],
                              capture_output=True, text=True, timeout=10)
    assert as_alice.stdout == "alice-secret\n"


def test_two_members_on_one_machine_never_share_or_kill_each_others_job_cgroups(runners, tenant):
    """Two ranks of one gang (the same job id) on two members of one machine: the rank
    that ends first kills what its job left behind, and only that (a flaky gang test
    found rank 0 killed when rank 1 ended, through a shared `mtgpu/job-1` cgroup)."""
    other = Runners()
    try:
        a = LocalAgent(runners.state_dir, runners.new(), backend=None)
        b = LocalAgent(other.state_dir, other.new(), backend=None)
        assert a.runner.cgroups.parent != b.runner.cgroups.parent
        a.start(make_launch(runners, tenant, "exec sleep 300\n"))
        b.start(make_launch(other, tenant, "sleep 0.5\n"))
        wait_exit(b.runner, 1)  # b's shim killed what b left behind before it recorded the end
        assert a.runner.poll(1) is None, "the other member's job was killed"
        assert set(a.runner.cgroups.pids(1)) & set(b.runner.cgroups.pids(1)) == set()
    finally:
        other.close()


def test_a_members_agent_puts_its_job_cgroups_under_its_own_name(tmp_path):
    agents = [LocalAgent.open(tmp_path / name, "simulated", [], name) for name in ("m0", "m1")]
    try:
        parents = [ag.runner.cgroups.parent for ag in agents]
        assert parents[0].startswith("mtgpu-m0-") and parents[1].startswith("mtgpu-m1-"), parents
        # another cluster's m0 on this machine (its own state directory) has its own parent
        again = LocalAgent.open(tmp_path / "other" / "m0", "simulated", [], "m0")
        try:
            assert again.runner.cgroups.parent.startswith("mtgpu-m0-") and again.runner.cgroups.parent != parents[0]
        finally:
            again.close()
        bases = list(again.runner.cgroups.bases.values())
        assert bases and not any(b.exists() for b in bases), bases  # an empty parent goes at close
    finally:
        for ag in agents:
            ag.close()

"""The native runner: a job runs as its tenant under a small root shim (shim.py) that
outlives the server, in per-job cgroups where the machine allows them.

Layout: `state_dir/<job_id>/` (state_dir and job dirs root, 0700; the agent passes
STATE_DIR/runs) holds launch.json, the script, and the
shim's started.json / exit.json. The state returned by start() is what the caller
persists; load_state() re-attaches from it after a server restart.
"""

from __future__ import annotations

import json
import marshal
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from mtgpu.agent import procs
from mtgpu.agent.runners.base import (ENDED, LOST, NEVER_STARTED, RUNNING, SLURM_BIN_DIR, UNSUPERVISED, ExitInfo,
                                      Launch, RunnerError)
from mtgpu.agent.runners.cgroups import CgroupManager, gpu_device_nodes

SHIM_PATH = str(Path(__file__).with_name("shim.py"))
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
STATE_VERSION = 1


def _alive(pid: int | None, ticks: int | None) -> bool:
    """The process `pid` that the shim recorded as started at `ticks` (clock ticks since
    boot) still runs: not a reused PID, not a zombie."""
    return ticks is not None and procs.same_process(pid, procs.ticks_to_since_boot(ticks))


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _read_json(path: Path) -> dict | None:
    try:
        with open(path, "rb") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _interpreter(script: str) -> list[str]:
    """argv prefix for the script: its `#!` line (as the kernel reads it), else /bin/bash."""
    if script.startswith("#!"):
        line = script[2:].split("\n", 1)[0].strip()
        if line:
            interp, _, arg = line.partition(" ")
            arg = arg.strip()
            return [interp] + ([arg] if arg else [])
    return ["/bin/bash"]


def _executable_by_all(path: Path) -> None:
    """Jobs run our srun (on their PATH); an install that lost its mode bits gets them back."""
    try:
        mode = path.stat().st_mode
        if mode & 0o555 != 0o555:
            os.chmod(path, mode | 0o555)
    except OSError:
        pass


def marked_pids(job_id: int, token: str) -> set[int]:
    """Processes whose environment carries this run's marker (MTGPU_JOB_ID and
    MTGPU_RUN_TOKEN): finds a job's processes that left its process group, and where
    cgroups are not available."""
    return procs.pids_with_env({"MTGPU_JOB_ID": str(job_id), "MTGPU_RUN_TOKEN": token})


@dataclass
class Command:
    """argv and environment the shim runs as the tenant; `script_arg`: append the script
    as /dev/fd/N; `state`: what the runner keeps in the run's state."""

    argv: list[str]
    env: dict[str, str]
    script_arg: bool = True
    state: dict = field(default_factory=dict)
    rlimit_as_ok: bool = True  # RLIMIT_AS may stand in for a missing memory cgroup


@dataclass
class _Run:
    state: dict
    shim: subprocess.Popen | None = None  # only when this instance started it
    exit: ExitInfo | None = None
    stopped: bool = False
    # when this runner first saw the job's processes run on without their shim (wall clock)
    unsupervised_since: float | None = None

    @property
    def job_dir(self) -> Path:
        return Path(self.state["job_dir"])


class NativeRunner:
    """Runner for native jobs (see base.Runner)."""

    def __init__(self, state_dir: Path, *, cgroup_parent: str = "mtgpu", pids_max: int = 4096,
                 cgroups: CgroupManager | None = None, boot_id: Callable[[], str] = procs.boot_id):
        """`boot_id`: this boot of the machine (procs.boot_id), compared with the one the
        shim recorded at the start: a run with no exit record was killed by a reboot only
        when they differ."""
        self.state_dir = Path(state_dir)
        self.boot_id = boot_id
        self.runs_dir = self.state_dir  # job dirs: state_dir/<job_id>
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.runs_dir, 0o700)
        self.cgroups = cgroups if cgroups is not None else CgroupManager(cgroup_parent, pids_max=pids_max)
        self._runs: dict[int, _Run] = {}
        for tool in ("srun", "scontrol"):
            _executable_by_all(Path(SLURM_BIN_DIR) / tool)

    # -- start -------------------------------------------------------------------
    def start(self, launch: Launch) -> dict:
        job_id = launch.job_id
        job_dir = self.runs_dir / str(job_id)
        old = self._runs.get(job_id)
        if old is not None and self.poll(job_id) is None:
            raise RunnerError(f"job {job_id} is already running on this node; stop it first")
        if job_dir.exists():
            prev = _read_json(job_dir / "started.json") or {}
            if _alive(prev.get("pid"), prev.get("starttime")):
                raise RunnerError(f"job {job_id}: a process of an earlier run is still alive ({job_dir})")
            shutil.rmtree(job_dir)
        job_dir.mkdir(mode=0o700)

        token = secrets.token_hex(16)
        env = dict(launch.env)
        try:
            user = pwd.getpwuid(launch.uid).pw_name
            env.setdefault("USER", user)
            env.setdefault("LOGNAME", user)
        except KeyError:
            pass
        env.setdefault("HOME", launch.home)
        env.setdefault("PATH", DEFAULT_PATH)
        env.setdefault("SHELL", "/bin/bash")
        env.setdefault("MTGPU_JOB_ID", str(job_id))
        env["MTGPU_RUN_TOKEN"] = token

        fd = os.open(job_dir / "script", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, launch.script.encode())
            os.fchown(fd, launch.uid, launch.gid)
        finally:
            os.close(fd)

        cg, cg_error = None, None
        try:
            cg = self.cgroups.create(job_id, cpus=launch.cpus, mem_bytes=launch.mem_bytes,
                                     deny_devices=self._denied_devices(launch),
                                     allow_devices=self._allowed_devices(launch))
        except OSError as e:  # run with the fallbacks, and say so in the record
            cg_error = f"could not create the job's cgroup: {e}"
        enforced = self._enforced(launch, cg)
        if cg_error:
            enforced["cgroup_error"] = cg_error
        rlimit_as = launch.mem_bytes if launch.mem_bytes and "memory" not in (cg.enforced if cg else {}) else None

        try:
            command = self._command(launch, job_dir, env, token, enforced)
        except RunnerError:
            if cg is not None:
                self.cgroups.remove(job_id)
            raise
        spec = {
            "job_id": job_id, "uid": launch.uid, "gid": launch.gid, "extra_gids": list(launch.extra_gids),
            "workdir": launch.workdir, "log_path": launch.log_path, "env": command.env,
            "argv": command.argv, "script_arg": command.script_arg, "cgroup_procs": cg.procs_files if cg else [],
            "rlimit_as": rlimit_as if command.rlimit_as_ok else None,
            "lease_path": launch.lease_path, "lease_s": launch.lease_s,
            "output_path": launch.output_path, "error_path": launch.error_path,
            "output_append": launch.output_append,
        }
        # launch.json for whoever reads the run later (a restarted server); launch.marshal for
        # the shim, which reads it without importing json (shim.py: its start is the job's)
        for name, data in (("launch.json", json.dumps(spec).encode()), ("launch.marshal", marshal.dumps(spec))):
            fd = os.open(job_dir / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)

        shim_log = os.open(job_dir / "shim.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            shim = subprocess.Popen(
                [sys.executable, "-I", "-S", SHIM_PATH, str(job_dir)],
                stdin=subprocess.DEVNULL, stdout=shim_log, stderr=shim_log, cwd="/",
                env={"PATH": DEFAULT_PATH}, start_new_session=True, close_fds=True,
            )
        except OSError as e:
            if cg is not None:
                self.cgroups.remove(job_id)
            raise RunnerError(f"job {job_id}: could not start the shim {SHIM_PATH}: {e}") from e
        finally:
            os.close(shim_log)
        state = {
            "version": STATE_VERSION, "runner": "native", "job_id": job_id, "job_dir": str(job_dir),
            "shim_pid": shim.pid, "shim_since_boot": procs.started_since_boot(shim.pid), "run_token": token,
            "started_at": time.time(), "cgroup_version": cg.version if cg else None,
            "cgroups": dict(cg.paths) if cg else {}, "enforced": enforced,
            "limits": {"cpus": launch.cpus, "mem_bytes": launch.mem_bytes, "pids_max": self.cgroups.pids_max if cg else None},
            **command.state,
        }
        self._runs[job_id] = _Run(state, shim)
        return dict(state)

    def _command(self, launch: Launch, job_dir: Path, env: dict[str, str], token: str, enforced: dict) -> "Command":
        """What the shim runs as the tenant: the script's interpreter, given the script as
        /dev/fd/N (a container runner runs podman instead)."""
        if launch.container is not None:  # never run a container job natively
            raise RunnerError(f"container={launch.container}: containers are off on this node "
                              "([CONTAINERS] enabled = false)")
        return Command(_interpreter(launch.script), env, script_arg=True)

    def _allowed_devices(self, launch: Launch) -> list[tuple[str, int, int | None]] | None:
        """Device nodes the job may open, all others denied; None: any but _denied_devices()
        (a native job; a container's is an allow-list, runners/podman.py)."""
        return None

    def _denied_devices(self, launch: Launch) -> list[tuple[str, int, int]]:
        """The device nodes of the node's GPUs this job was not given."""
        if not launch.gpu_devices:
            others = tuple(i for i in launch.all_gpu_indices if i not in launch.gpu_indices)
            return gpu_device_nodes(launch.gpu_vendor, others)
        denied = []
        for index, paths in sorted(launch.gpu_devices.items()):
            if index in launch.gpu_indices:
                continue
            for path in paths:
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                kind = "c" if stat.S_ISCHR(st.st_mode) else "b"
                denied.append((kind, os.major(st.st_rdev), os.minor(st.st_rdev)))
        return denied

    def _enforced(self, launch: Launch, cg) -> dict:
        got = dict(cg.enforced) if cg else {}
        v = self.cgroups.version
        out: dict[str, str] = {}
        if launch.mem_bytes:
            if "memory" in got:
                out["memory"] = got["memory"]
            else:
                out["memory"] = "setrlimit(RLIMIT_AS)"
                out["mem_fallback"] = "setrlimit"
        else:
            out["memory"] = "no limit requested"
        out["cpu"] = got.get("cpu") or ("not enforced (cpu cgroup not writable)" if launch.cpus else "no limit requested")
        out["pids"] = got.get("pids", "not enforced (pids cgroup not writable)")
        if "devices" in got:
            out["devices"] = got["devices"]
        elif cg is not None and "devices" in cg.not_enforced:
            out["devices"] = f"not enforced ({cg.not_enforced['devices']})"
        elif not launch.gpu_devices and not gpu_device_nodes(launch.gpu_vendor, tuple(launch.all_gpu_indices)):
            out["devices"] = "not applicable (no GPU device nodes)"
        elif not self._denied_devices(launch):
            out["devices"] = "not needed (the job has every GPU of the node)"
        elif v == "v2":
            why = getattr(self.cgroups, "unavailable", {}).get("devices") or "the job has no cgroup"
            out["devices"] = f"not enforced ({why})"
        else:
            out["devices"] = "not enforced (devices cgroup not writable)"
        kill = "process group + /proc marker scan"
        if cg is not None:
            kill = (f"cgroup-{cg.version} " + ("freezer + " if "freezer" in cg.paths else "")) + kill
        out["tree_kill"] = kill
        return out

    # -- poll / state ------------------------------------------------------------
    def _run(self, job_id: int) -> _Run:
        try:
            return self._runs[job_id]
        except KeyError:
            raise KeyError(f"job {job_id} is not known to this runner: start() or load_state() it first") from None

    def _exit_record(self, run: _Run, name: str = "exit.json") -> ExitInfo | None:
        """The shim's exit record, or (name="ended.json") the job's keeper's (shim.py)."""
        rec = _read_json(run.job_dir / name)
        if rec is None:
            return None
        code, sig, why, fenced = rec.get("exit_code"), rec.get("signal"), rec.get("reason") or "", bool(rec.get("fenced"))
        if not why:
            if sig is not None:
                try:
                    name = signal.Signals(sig).name
                except ValueError:
                    name = f"signal {sig}"
                why = f"killed by {name}" + (" (stopped)" if run.stopped else "")
            else:
                why = f"exited with code {code}"
        return ExitInfo(code, sig, why, fenced=fenced, stopped=run.stopped)

    def _child(self, run: _Run) -> dict:
        return _read_json(run.job_dir / "started.json") or {}

    def _shim_alive(self, run: _Run) -> bool:
        if run.shim is not None:
            return run.shim.poll() is None
        started = run.state.get("shim_since_boot")
        if started is None and run.state.get("shim_starttime") is not None:  # a record of an older version
            started = procs.ticks_to_since_boot(run.state["shim_starttime"])
        return procs.same_process(run.state.get("shim_pid"), started)

    def poll(self, job_id: int) -> ExitInfo | None:
        run = self._run(job_id)
        if run.exit is not None:
            return run.exit
        info = self._exit_record(run)
        if info is None:
            if self._shim_alive(run):
                return None
            info = self._exit_record(run)  # written just before the shim exited
        if info is None:
            child = self._child(run)
            if self._runs_on(run, child):
                if run.unsupervised_since is None:
                    run.unsupervised_since = time.time()
                return None  # the shim died, the job itself still runs
            info = self._no_exit_record(run, child)
        if run.shim is not None:
            run.shim.poll()
        run.exit = info
        return info

    def _runs_on(self, run: _Run, child: dict) -> bool:
        """Whether the job still runs, its shim gone: its keeper (started.json's pid) lives,
        or, were the keeper killed too, processes of the job do (a scan of /proc: only for
        such a run)."""
        if _alive(child.get("pid"), child.get("starttime")):
            return True
        return bool(child) and not (run.job_dir / "ended.json").exists() and bool(self._tree(run))

    def _no_exit_record(self, run: _Run, child: dict) -> ExitInfo:
        """How a run ended whose shim left no exit record, told from what is known: the
        server fenced it; the job's keeper recorded its end (the shim was killed, the job
        ran on); the agent stopped it; the shim died before the job's first instruction
        (no started.json); the machine restarted since it started (another boot id: the
        reboot killed it, an interruption); or, in the same boot, its shim and its keeper
        were killed and its processes are gone: they may have run to their end, their exit
        status is unknown."""
        try:  # fenced by the server, its shim gone (fence())
            return ExitInfo(None, signal.SIGKILL, (run.job_dir / "fenced").read_text(), fenced=True)
        except OSError:
            pass
        kept = self._exit_record(run, "ended.json")
        if kept is not None:  # the job's keeper saw it end: its own end, told as usual
            return kept
        if run.stopped:
            return ExitInfo(None, None, "stopped; the runner shim was killed before it recorded the exit", stopped=True)
        if not child:
            return ExitInfo(None, None, "its supervisor (the job's shim) ended before the job started: no instruction "
                                        "of the job ran", lost=True)
        then, now = child.get("boot"), self.boot_id()
        if then is None:  # recorded by an older shim: the boot is not known
            return ExitInfo(None, None, "its processes were gone with no exit record (the machine restarted?)",
                            lost=True)
        if then and now and then != now:
            return ExitInfo(None, None, f"the machine restarted while it ran (boot {then[:8]}, now {now[:8]}), which "
                                        "killed its processes; no exit record", lost=True)
        if run.unsupervised_since is not None:
            seen = "its processes ran on without it until " + _utc(time.time())
        else:
            seen = "its processes were gone too when its member looked"
        return ExitInfo(None, None, f"its supervisor (the job's shim) was killed in this boot of the machine and "
                                    f"{seen}; its exit status is unknown (it may have run to its end)", unknown=True)

    def get_state(self, job_id: int) -> dict:
        run = self._run(job_id)
        child = self._child(run)
        if child:
            run.state["job_pid"] = child.get("pid")
            run.state["job_starttime"] = child.get("starttime")
        return dict(run.state)

    def load_state(self, job_id: int, state: dict) -> str:
        job_dir = Path(state.get("job_dir") or self.runs_dir / str(job_id))
        state = dict(state, job_dir=str(job_dir), job_id=job_id)
        if "run_token" not in state:  # the persisted state was lost: rebuild it from launch.json
            spec = _read_json(job_dir / "launch.json") or {}
            state["run_token"] = spec.get("env", {}).get("MTGPU_RUN_TOKEN", "")
            state.setdefault("cgroups", {str(i): os.path.dirname(p) for i, p in enumerate(spec.get("cgroup_procs", []))})
            state.setdefault("cgroup_version", self.cgroups.version)
        if not state.get("shim_pid"):  # the server died before it recorded the shim: look for it
            shim = procs.find_by_cmdline([SHIM_PATH, str(job_dir)])
            if shim is not None:
                state["shim_pid"], state["shim_since_boot"] = shim
        known = self._runs.get(job_id)
        run = _Run(state, shim=known.shim if known is not None else None, stopped=(job_dir / "stopped").exists())
        self._runs[job_id] = run
        if state.get("cgroups"):
            self.cgroups.attach(job_id, state.get("cgroup_version") or "", state["cgroups"])
        if (job_dir / "exit.json").exists():
            return ENDED
        if self._shim_alive(run):
            return RUNNING
        child = self._child(run)
        if not child:
            # No started.json and no shim: the job never got past the shim's go (shim.py).
            return NEVER_STARTED
        if self._runs_on(run, child):
            run.unsupervised_since = time.time()
            return UNSUPERVISED
        return ENDED if (job_dir / "ended.json").exists() else LOST

    def enforced(self, job_id: int) -> dict:
        return dict(self._run(job_id).state.get("enforced", {}))

    # -- stop / cleanup ----------------------------------------------------------
    def job_pids(self, job_id: int) -> set[int]:
        """The live processes of a job this runner knows (empty when it knows none)."""
        run = self._runs.get(job_id)
        return self._tree(run) if run is not None else set()

    def _tree(self, run: _Run) -> set[int]:
        """Every live process of the job: its cgroups, its process group, its marker."""
        job_id = run.state["job_id"]
        pids = self.cgroups.pids(job_id)
        child = self._child(run)
        if _alive(child.get("pid"), child.get("starttime")):
            pids |= procs.pgroup_pids(child["pid"]) | {child["pid"]}
        if run.state.get("run_token") and self.cgroups.get(job_id) is None:
            # No group holds it (none could be made, or a restart lost them): the marker is
            # the way to find what it left. Where a group holds it, its processes cannot
            # leave (only root moves a process between groups), and reading every process's
            # environment took milliseconds of the member's loop at each job's end.
            pids |= marked_pids(job_id, run.state["run_token"])
        pids.discard(run.state.get("shim_pid"))
        pids.discard(os.getpid())
        return pids

    @staticmethod
    def _signal(pids: set[int], sig: int) -> None:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass

    def _wait_empty(self, run: _Run, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self._tree(run):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def terminate(self, job_id: int) -> None:
        """SIGTERM the job and return (preemption: it may checkpoint and end by itself; stop()
        kills what is left): through its shim, which forwards it to the job's process group,
        or, with the shim gone, to every process of the job."""
        run = self._runs.get(job_id)
        if run is None:
            return
        if self._shim_alive(run):
            self._signal({run.state["shim_pid"]}, signal.SIGTERM)
        else:
            self._signal(self._tree(run), signal.SIGTERM)

    def stop(self, job_id: int, grace_s: float = 5.0) -> None:
        """SIGTERM the job's whole tree (through the shim and directly), SIGKILL what is
        left after grace_s, then let the shim record the exit. Bounded: gives up after
        grace_s plus about 8 s, which only unkillable (D-state) processes can reach."""
        run = self._run(job_id)
        run.stopped = True
        try:  # remembered on disk: after a restart, this end is still known as ours, not the job's
            (run.job_dir / "stopped").touch()
        except OSError:
            pass
        job_id = run.state["job_id"]
        if grace_s > 0:
            if self._shim_alive(run):
                self._signal({run.state["shim_pid"]}, signal.SIGTERM)
            self._signal(self._tree(run), signal.SIGTERM)
            self._wait_empty(run, grace_s)
        deadline = time.monotonic() + 5.0
        while True:
            self.cgroups.kill_all(job_id, timeout_s=1.0)
            left = self._tree(run)
            if not left or time.monotonic() >= deadline:
                break
            self._signal(left, signal.SIGKILL)
            time.sleep(0.02)
        # the shim reaps the job and writes exit.json, then exits
        deadline = time.monotonic() + 3.0
        while self._shim_alive(run) and time.monotonic() < deadline:
            time.sleep(0.02)
        if self._shim_alive(run):
            self._signal({run.state["shim_pid"]}, signal.SIGKILL)
            if run.shim is not None:
                try:
                    run.shim.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    pass

    def unsupervised(self, job_id: int) -> bool:
        """Whether the job runs on without its shim, which would fence it (shim.py)."""
        run = self._runs.get(job_id)
        return run is not None and run.exit is None and run.unsupervised_since is not None

    def fence(self, job_id: int, why: str) -> None:
        """Kill a job whose shim is gone, as its shim would have fenced it: its end is
        then a fence (`why`), also after a restart, not a stop of the agent's."""
        run = self._run(job_id)
        try:
            (run.job_dir / "fenced").write_text(why)
        except OSError:
            pass
        self.stop(job_id, grace_s=0)

    def cleanup(self, job_id: int) -> None:
        """After the job ended: kill what it left running in the background and remove its
        cgroups. The exit record stays until forget()."""
        run = self._run(job_id)
        if self._tree(run):
            self.cgroups.kill_all(job_id, timeout_s=2.0)
            self._signal(self._tree(run), signal.SIGKILL)
        self.cgroups.remove(job_id)

    def forget(self, job_id: int) -> None:
        """Drop everything this runner keeps about a finished job."""
        run = self._runs.get(job_id)
        if run is None:
            return
        self.cleanup(job_id)
        if run.shim is not None:
            run.shim.poll()
        shutil.rmtree(run.job_dir, ignore_errors=True)
        del self._runs[job_id]

"""The job shim: runs one job as its tenant and records how it ended.

Started by the native runner as root, as `python -I -S shim.py JOB_DIR`, in a session
of its own, so that it outlives the server. Standard library only and no imports of
ours: it must start fast and must not depend on the server's environment.

JOB_DIR (root-owned, 0700) holds launch.json and launch.marshal (the same, written by the
runner; the shim reads the second: marshal is built in, while importing json takes 10 ms of
re and enum, and every millisecond here is one of the job's start), `script`
(0600, owned by the tenant) and, written here: started.json (the pid of the job's
process and its start time, to detect PID reuse on re-attach, and the machine's boot
id), ended.json (written by the job's keeper) and exit.json (written atomically when the
job ends). The job's process waits for started.json to be on disk before it runs
anything of the job, so a run without started.json never ran a single instruction of
the job: after a crash, such a run can be started again without running twice.

The job's process (the pid in started.json) is its keeper (_keep): still root, it forks
the job proper, which drops to the tenant and execs, waits for it, records its end in
ended.json and ends the same way. Should the shim be killed (with the server, say), the
job is the keeper's child still, so its exit status is not lost (issue 23).

The shim ignores SIGHUP and forwards SIGTERM/SIGINT to the job's process group. It
stays *outside* the job's cgroups: the job process joins them itself between fork and
exec (still root, before any job code runs), so an OOM kill or a cgroup-wide kill takes
the job and never the shim, which then records the truth. It is the job's subreaper:
when the job's main process ends, what is left of the job (its cgroups, its orphans) is
killed before the end is recorded. In a cluster it also fences the job: once the
member's lease (server/cluster/lease.py) is older than lease_s, it kills the job, and
keeps killing what the job forks, until it is gone.

sbatch's --output/--error (launch.json's output_path/error_path): the job's process opens
those files as the tenant, in the job's working directory, then forks the job itself with
its stdout/stderr on pipes and copies what comes to the log and to the files until the job
ends; it ends as the job did (the same exit code, or the same signal), so the shim records
the job's own end.
"""

import _signal as signal  # the C module: `signal` imports enum, some ms at every job's start
import marshal
import os
import resource
import select
import stat
import sys
import time

_child_pid = 0


def _starttime(pid):
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    with open("/proc/%d/stat" % pid, "rb") as f:
        data = f.read()
    return int(data.rsplit(b")", 1)[1].split()[19])


def _boot_id():
    """This boot of the machine: after a reboot, a run recorded in another one was killed by
    it (native.py tells that from a supervisor killed in this boot)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _plain(text):
    return all(" " <= c <= "~" and c not in '"\\' for c in text)


def _dumps(obj):
    """JSON of a record. A flat one of numbers and plain strings (started.json, written before
    the job may run) is written here; anything else by json, imported then."""
    parts = []
    for key, value in obj.items():
        if not (isinstance(key, str) and _plain(key)):
            break
        if value is None or isinstance(value, bool):
            text = {None: "null", True: "true", False: "false"}[value]
        elif isinstance(value, int):
            text = str(value)
        elif isinstance(value, float) and value - value == 0:  # finite
            text = repr(value)
        elif isinstance(value, str) and _plain(value):
            text = '"' + value + '"'
        else:
            break
        parts.append('"%s": %s' % (key, text))
    else:
        return "{" + ", ".join(parts) + "}"
    import json
    return json.dumps(obj)


def _write_json_atomic(path, obj):
    """Write, fsync, rename, and fsync the folder: on disk even after a power cut."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, _dumps(obj).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _forward(signum, _frame):
    if _child_pid:
        for send in (os.killpg, os.kill):
            try:
                send(_child_pid, signum)
            except OSError:
                pass


def _set_subreaper():
    """Orphans of the job are re-parented to the shim (not to a PID 1 that may not reap)."""
    try:  # _ctypes alone: the ctypes package takes some ms to import, at every job's start
        import _ctypes
        _ctypes.call_function(_ctypes.dlsym(_ctypes.dlopen(None), "prctl"), (36, 1, 0, 0, 0))  # PR_SET_CHILD_SUBREAPER
    except Exception:
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
        except Exception:
            pass


def _open_log(path, uid, gid):
    """Open the job's log for appending as root, refusing links planted by anyone."""
    parent = os.path.dirname(path)
    if parent and not os.path.isdir(parent):
        os.makedirs(parent, 0o755, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid not in (0, uid):
        os.close(fd)
        raise OSError("refusing log %s: not a plain file of its own (links or foreign owner)" % path)
    os.fchown(fd, uid, gid)
    os.fchmod(fd, 0o600)
    return fd


def _child(spec, log_fd, script_fd, err_w, go_r, job_dir):
    """In the forked child: wait for the shim's go, confine, fork the job's keeper off
    (_keep: this process), and in the job's own process drop to the tenant and exec.
    Never returns."""
    step = "start"
    try:
        # The go comes once started.json is on disk; no byte (EOF) means the shim died
        # before: then nothing of the job may run.
        if os.read(go_r, 1) != b"g":
            os._exit(126)
        os.close(go_r)
        os.setsid()
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        step = "join the job's cgroups"
        me = str(os.getpid()).encode()
        for procs in spec["cgroup_procs"]:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, me)
            finally:
                os.close(fd)
        step = "start the job's keeper"
        job = os.fork()
        if job:
            os.close(err_w)  # the job's own copy says whether it ran
            os.close(log_fd)
            os.close(script_fd)
            _keep(job, job_dir)  # never returns
        step = "set up stdin/stdout/stderr"
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        step = "set resource limits"
        if spec.get("rlimit_as"):
            resource.setrlimit(resource.RLIMIT_AS, (spec["rlimit_as"], spec["rlimit_as"]))
        step = "drop to uid %d gid %d" % (spec["uid"], spec["gid"])
        gid, uid = spec["gid"], spec["uid"]
        os.setgroups([gid] + [g for g in spec["extra_gids"] if g != gid])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        step = "change to the working directory %s" % spec["workdir"]
        os.chdir(spec["workdir"])
        step = "run %s" % spec["argv"][0]
        argv = list(spec["argv"])
        if spec.get("script_arg", True):
            os.set_inheritable(script_fd, True)
            argv.append("/dev/fd/%d" % script_fd)
        if spec.get("output_path") or spec.get("error_path"):
            files = {}
            for key, what in (("output_path", "output"), ("error_path", "error")):
                if spec.get(key):
                    step = "open the %s file %s (in %s)" % (what, spec[key], spec["workdir"])
                    files[key] = _open_output(spec[key], bool(spec.get("output_append")))
            step = "start the job's output copier"
            out_r, out_w = os.pipe()  # both ends close on exec
            err_r, err_pipe_w = os.pipe() if "error_path" in files else (None, None)
            pid = os.fork()
            if pid == 0:  # the job itself
                os.dup2(out_w, 1)
                os.dup2(err_pipe_w if err_pipe_w is not None else out_w, 2)
                step = "run %s" % argv[0]
                os.execve(argv[0], argv, spec["env"])
            os.close(err_w)  # the job's copy of it tells the shim that it ran (EOF) or why not
            os.close(out_w)
            sources = {out_r: [log_fd] + ([files["output_path"]] if "output_path" in files else [])}
            if err_r is not None:
                os.close(err_pipe_w)
                sources[err_r] = [log_fd, files["error_path"]]
            if "output_path" not in files:  # only error=: stderr goes there, stdout to the log only
                sources[out_r] = [log_fd]
            _copy_output(pid, sources)  # never returns
        os.execve(argv[0], argv, spec["env"])
    except BaseException as e:  # report to the shim, which records it as the reason
        try:
            os.write(err_w, ("could not %s: %s" % (step, e)).encode()[:4000])
        finally:
            os._exit(127)


def _open_output(path, append):
    """An output file of the job, opened as the tenant (its permissions apply), emptied
    first unless `append` (a requeued attempt goes on where the last one stopped). Always
    written at its end: the `srun` steps of the job's other ranks append to it too."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_APPEND | (0 if append else os.O_TRUNC)
    return os.open(path, flags, 0o644)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _copy_output(pid, sources):
    """In the job's process, after it forked the job: copy each pipe in `sources` to its
    files until the job has ended and what it wrote is copied, then end as it ended.
    Never returns. Signals that stop a job reach the job through its process group; this
    copier ignores them, so what the job prints while it stops is kept."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_IGN)
    status = None
    try:
        poller = select.poll()
        for fd in sources:
            poller.register(fd, select.POLLIN)
        left = set(sources)
        drain_until = None
        while left:
            if status is None:
                got, st = os.waitpid(pid, os.WNOHANG)
                if got == pid:
                    status = st
                    drain_until = time.monotonic() + 2.0  # what the job wrote; not a leftover's endless output
            events = poller.poll(200 if status is None else 0)
            if status is not None and (not events or time.monotonic() > drain_until):
                break
            for fd, _ in events:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    data = b""
                if not data:
                    poller.unregister(fd)
                    left.discard(fd)
                    continue
                targets = sources[fd]
                for k in range(len(targets) - 1, -1, -1):
                    try:
                        _write_all(targets[k], data)
                    except OSError:  # a full disk or quota on the tenant's file: the log goes on
                        if k > 0:
                            del targets[k]
        if status is None:
            status = os.waitpid(pid, 0)[1]
    except BaseException:
        if status is None:
            try:
                status = os.waitpid(pid, 0)[1]
            except OSError:
                os._exit(127)
    _end_as(status)


def _end_as(status):
    """End this process as the wait status `status` says: the same exit code, or killed by
    the same signal (no core file). Never returns."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if sig not in (signal.SIGKILL, signal.SIGSTOP):  # their handlers cannot be set
                signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        except (OSError, ValueError):
            pass
        try:
            os.kill(os.getpid(), sig)
        except OSError:
            pass
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _keep(pid, job_dir):
    """The job's keeper: root, in the job's session and cgroups, the parent of the job's
    process. It waits for the job, records how it ended in ended.json, then ends the same
    way, so the shim records the job's own end as before. Should the shim be killed, the
    job is still this process's child: its end is still known (the runner reads
    ended.json). It ignores the signals that stop a job (they reach the job through its
    process group) and is the last choice of the OOM killer. Never returns."""
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_IGN)
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("-1000")
        except OSError:
            pass
        status = os.waitpid(pid, 0)[1]
        rec = {"exit_code": None, "signal": None, "ended_at": time.time()}
        if os.WIFSIGNALED(status):
            rec["signal"] = os.WTERMSIG(status)
        else:
            rec["exit_code"] = os.waitstatus_to_exitcode(status)
        try:
            _write_json_atomic(os.path.join(job_dir, "ended.json"), rec)
        except OSError:
            pass
        _end_as(status)
    finally:
        os._exit(127)


def _lease_age(path):
    """Seconds since the member last knew itself in the cluster. The agent writes that
    moment as CLOCK_MONOTONIC seconds into the file (a wall-clock step cannot stretch
    the lease); a file without a number falls back to its modification time."""
    try:
        with open(path, "rb") as f:
            text = f.read(64).strip()
        if text:
            age = time.monotonic() - float(text)
            return age if age > -1.0 else float("inf")  # from another boot: not this member's lease
        return time.time() - os.stat(path).st_mtime
    except (OSError, ValueError):
        return float("inf")


def _cgroup_pids(spec):
    pids = set()
    for procs in spec.get("cgroup_procs") or []:
        try:
            with open(procs) as f:
                pids.update(int(x) for x in f.read().split())
        except (OSError, ValueError):
            pass
    return pids


def _my_children():
    """Processes whose parent is this shim: the job, and (as a subreaper) its orphans."""
    me, found = os.getpid(), set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name, "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == me and fields[0] != b"Z":
                found.add(int(name))
    return found


def _kill_job(pid, spec):
    """SIGKILL the job's process group, everything in its cgroups and every child of
    this shim (the job's orphans come to it)."""
    targets = [(os.killpg, pid)] if pid else []
    targets += [(os.kill, p) for p in ({pid} if pid else set()) | _cgroup_pids(spec) | _my_children()]
    for send, target in targets:
        try:
            send(target, signal.SIGKILL)
        except OSError:
            pass


def _reap():
    while True:
        try:
            got, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if got == 0:
            return


def _end_leftovers(spec, timeout_s=5.0):
    """After the job's main process ended, nothing of the job may run on: kill what is
    left in its cgroups and of its orphans, until none is left (bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _reap()
        left = _cgroup_pids(spec) | _my_children()
        if not left:
            return
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)


def _wait_for(pid, spec):
    """Wait for the job to end. With a lease (cluster mode), also fence the job: when
    the agent has not renewed the lease for lease_s (the node lost the cluster, or its
    server is frozen), kill it, so it never runs beside its requeued copy elsewhere."""
    lease_path, lease_s = spec.get("lease_path"), spec.get("lease_s")
    fenced = ""
    while True:
        try:
            got, st = os.waitpid(-1, os.WNOHANG if lease_path else 0)
        except ChildProcessError:
            return None, fenced
        if got == pid:
            return st, fenced
        if got == 0:
            if not fenced and _lease_age(lease_path) > lease_s:
                fenced = ("fenced: this node's agent lost contact with the cluster for more than %gs; "
                          "the job was stopped so it cannot run twice" % lease_s)
            if fenced:  # again on every round: a process forked meanwhile dies too
                _kill_job(pid, spec)
            time.sleep(0.2)


def main(job_dir):
    global _child_pid
    with open(os.path.join(job_dir, "launch.marshal"), "rb") as f:
        spec = marshal.load(f)
    exit_path = os.path.join(job_dir, "exit.json")
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _forward)
    signal.signal(signal.SIGINT, _forward)
    _set_subreaper()
    try:
        log_fd = _open_log(spec["log_path"], spec["uid"], spec["gid"])
        script_fd = os.open(os.path.join(job_dir, "script"), os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        _write_json_atomic(exit_path, {"exit_code": 127, "signal": None, "ended_at": time.time(),
                                       "reason": "could not prepare the job: %s" % e})
        return 0
    err_r, err_w = os.pipe()  # both close-on-exec: EOF on exec success
    go_r, go_w = os.pipe()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM, signal.SIGINT])
    pid = os.fork()
    if pid == 0:
        os.close(err_r)
        os.close(go_w)
        _child(spec, log_fd, script_fd, err_w, go_r, job_dir)
    _child_pid = pid
    signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a SIGTERM that came meanwhile is forwarded now
    os.close(go_r)
    os.close(err_w)
    os.close(log_fd)
    os.close(script_fd)
    try:
        _write_json_atomic(os.path.join(job_dir, "started.json"),
                           {"pid": pid, "starttime": _starttime(pid), "started_at": time.time(), "boot": _boot_id()})
        os.write(go_w, b"g")
    except OSError:
        pass  # the child is already gone (or may not run): its exit is recorded below
    os.close(go_w)
    chunks = []
    while True:
        b = os.read(err_r, 4096)
        if not b:
            break
        chunks.append(b)
    os.close(err_r)
    setup_error = b"".join(chunks).decode(errors="replace")

    status, fenced = _wait_for(pid, spec)
    _end_leftovers(spec)

    rec = {"exit_code": None, "signal": None, "ended_at": time.time(), "reason": setup_error or fenced,
           "fenced": bool(fenced)}
    if status is not None:
        if os.WIFSIGNALED(status):
            rec["signal"] = os.WTERMSIG(status)
        else:
            rec["exit_code"] = os.waitstatus_to_exitcode(status)
    _write_json_atomic(exit_path, rec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

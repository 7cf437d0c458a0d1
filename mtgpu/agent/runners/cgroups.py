"""Per-job cgroups: limits (memory, CPU, pids, GPU device nodes) and whole-tree kill.

Detects cgroup v2 (unified) or v1 (one hierarchy per controller) at construction and
checks what this process may write. Job groups are created below the server's own
cgroup (`<own>/<parent>/job-<id>`), so limits a container or service manager set on
the server still bound its jobs. A controller that is not writable is reported in
`unavailable` and its limit is recorded as not enforced; the runner falls back to
setrlimit and process-group/marker killing.

The member's own work comes first (issue 23: a busy member is not a dead one). Its jobs'
parent is weighted against a sibling group of the member's own, `<own>/<parent>-services`
(`hold_member()`, called where the member starts, before its first job): the member's
process, and what it starts afterwards (the job shims that fence its jobs, the tenant
sshd) run there, at SERVICES_CPU_WEIGHT times the CPU weight of all its jobs together
(v1 `cpu.shares`, v2 `cpu.weight`). Jobs still get every CPU the member leaves idle; when
they burn every core, the member's reports, Raft and API still run at once. The tenant
sshd, whose sessions are tenants' work, is moved out again as it starts, into
`<own>/<parent>-sessions` at the jobs' weight (`place_sessions()`). On v2 these are
siblings because a group with controllers enabled may hold no process.

GPU device nodes a job may not open are denied through the v1 devices controller
(`devices.deny`) or, on v2, which has no devices controller, by a device eBPF program
attached to the job's group (devbpf.py); whether such programs can be attached here is
tried once at construction (`device_fencing_problem()`).
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from mtgpu.agent import procs, state_key
from mtgpu.agent.runners import devbpf

log = logging.getLogger(__name__)

V1_CONTROLLERS = ("memory", "cpu", "pids", "devices", "freezer", "cpuacct")  # cpuacct: usage (idle culling)
V2_CONTROLLERS = ("memory", "cpu", "pids")
CPU_PERIOD_US = 100_000
# The member's services against all its jobs together: v1 cpu.shares (default 1024) and v2
# cpu.weight (default 100) of the services group; the jobs' parent keeps the default. A
# member needs little CPU but needs it at once: at 20 to 1 it gets 95% of what the two
# groups share whenever it wants it, and its jobs get the rest and everything it leaves.
SERVICES_CPU_WEIGHT = 20
SERVICES_SUFFIX = "-services"
SESSIONS_SUFFIX = "-sessions"  # the tenant sshd and its sessions: tenants' work, at the jobs' weight
NEIGHBOURS_SUFFIX = "-neighbours"  # v2: other processes that shared the member's group (_move_neighbours)


# What every container may open besides its own GPUs' nodes (its allow-list; runc's own for a
# rootful container is much the same): null, zero, full, random, urandom, tty, console, ptmx,
# the pseudo-terminals (136:*), /dev/net/tun (slirp4netns), /dev/fuse (fuse-overlayfs).
STANDARD_DEVICES: tuple[tuple[str, int, int | None], ...] = (
    ("c", 1, 3), ("c", 1, 5), ("c", 1, 7), ("c", 1, 8), ("c", 1, 9), ("c", 5, 0), ("c", 5, 1), ("c", 5, 2),
    ("c", 136, None), ("c", 10, 200), ("c", 10, 229))


def parent_for(node_name: str, state_dir: str | Path) -> str:
    """A member's own group parent, `mtgpu-NODE-KEY` (KEY from its state directory): two
    members on one machine, even of two clusters that both name a node m1 and both have a
    job 1 (test clusters side by side), never share, empty or kill each other's groups."""
    return f"mtgpu-{node_name}-{state_key(state_dir)}"


@dataclass
class JobCgroup:
    """One job's cgroup directories (controller -> path; v2 has the single key "unified")."""

    job_id: int
    version: str
    paths: dict[str, str]
    enforced: dict[str, str] = field(default_factory=dict)
    not_enforced: dict[str, str] = field(default_factory=dict)  # controller -> why a limit asked for is not

    @property
    def procs_files(self) -> list[str]:
        return [os.path.join(p, "cgroup.procs") for p in self.paths.values()]


def _write(path: str | Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str | Path) -> str:
    with open(path) as f:
        return f.read()




def gpu_device_nodes(vendor: str | None, indices: tuple[int, ...]) -> list[tuple[str, int, int]]:
    """(type, major, minor) of the existing device nodes of these GPUs; only NVIDIA's
    /dev/nvidiaN map one node per GPU index. Missing nodes are skipped."""
    if vendor not in (None, "nvidia"):
        return []
    nodes = []
    for i in indices:
        try:
            st = os.stat(f"/dev/nvidia{i}")
        except OSError:
            continue
        nodes.append(("c", os.major(st.st_rdev), os.minor(st.st_rdev)))
    return nodes


def device_numbers(paths) -> list[tuple[str, int, int]]:
    """(type, major, minor) of the device nodes at these paths; what is not one is skipped."""
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            out.append(("c" if stat.S_ISCHR(st.st_mode) else "b", os.major(st.st_rdev), os.minor(st.st_rdev)))
    return out


class CgroupManager:
    """Creates, fills, kills and removes job cgroups under `<own cgroup>/<parent>`."""

    def __init__(self, parent: str = "mtgpu", *, root: str = "/sys/fs/cgroup", pids_max: int = 4096):
        self.parent = parent
        self.pids_max = pids_max
        self.version: str | None = None
        self.bases: dict[str, Path] = {}  # controller (or "unified") -> writable parent dir
        self.unavailable: dict[str, str] = {}  # controller -> why it cannot be used
        self.services: dict[str, Path] = {}  # controller (or "unified") -> the member's services group
        self._own_dirs: dict[str, Path] = {}  # controller (or "unified") -> the group this process started in
        self._held: int | None = None  # the pid hold_member() moved into the services group
        self._jobs: dict[int, JobCgroup] = {}
        self._sessions_deny: list[tuple[str, int, int]] = []  # fence_sessions(): every GPU's device nodes
        self._sessions_fenced: set[str] = set()  # hierarchies whose sessions group has that denial
        self._sessions_open = False  # open_sessions(): SESSION_GPUS = "all", the group denies nothing
        self.moved_neighbours: list[int] = []  # v2: pids moved out of the member's group (_move_neighbours)
        if os.path.exists(os.path.join(root, "cgroup.controllers")):
            self.version = "v2"
            self._detect_v2(Path(root))
        else:
            self.version = "v1"
            self._detect_v1()

    # -- detection ---------------------------------------------------------------
    @staticmethod
    def _own_paths() -> dict[str, str]:
        own = {}
        for line in _read("/proc/self/cgroup").splitlines():
            _, ctrls, path = line.split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                own[c] = path
        return own

    def _detect_v1(self) -> None:
        own = self._own_paths()
        mounts: dict[str, tuple[str, str]] = {}  # controller -> (mount root, mount point)
        try:
            for line in _read("/proc/self/mountinfo").splitlines():
                pre, _, post = line.partition(" - ")
                fstype, _src, opts = (post.split() + ["", "", ""])[:3]
                if fstype != "cgroup":
                    continue
                f = pre.split()
                for opt in opts.split(","):
                    if opt in V1_CONTROLLERS and opt not in mounts:
                        mounts[opt] = (f[3], f[4].replace("\\040", " "))
        except OSError as e:
            self.version = None
            self.unavailable = {c: f"cannot read mounts: {e}" for c in V1_CONTROLLERS}
            return
        for c in V1_CONTROLLERS:
            if c not in mounts:
                self.unavailable[c] = "controller not mounted"
                continue
            mroot, mpoint = mounts[c]
            rel = own.get(c, "/")
            rel = rel[len(mroot):] if mroot != "/" and rel.startswith(mroot) else (rel if mroot == "/" else "/")
            own_dir = Path(mpoint + rel.rstrip("/"))
            if own_dir.name == self.parent + SERVICES_SUFFIX:  # held early (hold_member_early): its parent is own
                self.services[c], self._held = own_dir, os.getpid()
                own_dir = own_dir.parent
            base = own_dir / self.parent
            if base in self.bases.values():
                continue  # co-mounted (cpu,cpuacct): one group serves both
            try:
                base.mkdir(exist_ok=True)
                if not os.access(base / "cgroup.procs", os.W_OK):
                    raise PermissionError(f"{base}/cgroup.procs is not writable")
            except OSError as e:
                self.unavailable[c] = f"not writable ({e})"
                continue
            self.bases[c] = base
            self._own_dirs[c] = own_dir
        if not self.bases:
            self.version = None

    def _detect_v2(self, root: Path) -> None:
        own = self._own_paths().get("", "/")
        own_dir = Path(str(root) + own.rstrip("/"))
        if own_dir.name == self.parent + SERVICES_SUFFIX:  # held early (hold_member_early): its parent is own
            self.services["unified"], self._held = own_dir, os.getpid()
            own_dir = own_dir.parent
            own = str(own_dir)[len(str(root)):] or "/"
        try:
            available = _read(own_dir / "cgroup.controllers").split()
            wanted = [c for c in V2_CONTROLLERS if c in available]
            for c in V2_CONTROLLERS:
                if c not in available:
                    self.unavailable[c] = f"not delegated to {own_dir}"
            enable = " ".join("+" + c for c in wanted)
            if wanted:
                try:
                    _write(own_dir / "cgroup.subtree_control", enable)
                except OSError as e:
                    if e.errno != errno.EBUSY or own == "/":
                        raise
                    # "no internal processes": move the server into a leaf of its own, its
                    # services group (what a delegated systemd service does), then enable.
                    leaf = own_dir / (self.parent + SERVICES_SUFFIX)
                    leaf.mkdir(exist_ok=True)
                    _write(leaf / "cgroup.procs", str(os.getpid()))
                    self._held, self.services["unified"] = os.getpid(), leaf
                    try:
                        _write(own_dir / "cgroup.subtree_control", enable)
                    except OSError as e2:
                        if e2.errno != errno.EBUSY:
                            raise
                        self._move_neighbours(own_dir, enable)
            base = own_dir / self.parent
            base.mkdir(exist_ok=True)
            if wanted:
                _write(base / "cgroup.subtree_control", enable)
        except OSError as e:
            self.version = None
            self.unavailable = {c: f"not writable ({e})" for c in V2_CONTROLLERS}
            return
        self.bases["unified"] = base
        self._own_dirs["unified"] = own_dir
        why = devbpf.probe(str(base))
        if why:
            self.unavailable["devices"] = ("cgroup v2 has no devices controller and a device eBPF program "
                                           f"cannot be used: {why}")

    def _move_neighbours(self, own_dir: Path, enable: str, tries: int = 3) -> None:
        """The member's group still holds other processes (it was started from a shell or a
        wrapper such as `timeout`, not as a service of its own; a real H200 machine's
        runner did this): cgroup v2 enables controllers only in a group with no process of
        its own, so they go into a leaf of that group, `<own>/<parent>-neighbours`, as
        Docker's dind does. They stay inside the member's group, under every limit set on
        it. Raises the last OSError when the group still will not take the controllers."""
        leaf = own_dir / (self.parent + NEIGHBOURS_SUFFIX)
        leaf.mkdir(exist_ok=True)
        for attempt in range(tries):
            for pid in _read(own_dir / "cgroup.procs").split():
                try:
                    _write(leaf / "cgroup.procs", pid)
                    self.moved_neighbours.append(int(pid))
                except OSError:  # gone meanwhile, or a kernel thread: the next write tells
                    pass
            try:
                _write(own_dir / "cgroup.subtree_control", enable)
            except OSError as e:
                if e.errno != errno.EBUSY or attempt == tries - 1:
                    raise
                continue
            if self.moved_neighbours:
                log.warning("cgroup v2: %d other process(es) shared this member's group %s (pids %s): moved into %s, "
                            "since controllers can be enabled only in a group without processes of its own (a member "
                            "started from a shell rather than as a service)", len(self.moved_neighbours), own_dir,
                            " ".join(map(str, self.moved_neighbours[:10])), leaf)
            return

    def device_fencing_problem(self) -> str | None:
        """Why jobs cannot be denied GPU device nodes here; None when they can."""
        if self.version == "v2" and "unified" in self.bases:
            return self.unavailable.get("devices")
        if "devices" in self.bases:
            return None
        return f"the devices cgroup is not usable ({self.unavailable.get('devices') or self.no_hierarchy()})"

    def no_hierarchy(self) -> str:
        """Why no hierarchy is usable, with what detection met (a read-only /sys/fs/cgroup,
        a controller not delegated...): "no writable cgroup hierarchy" alone hid it."""
        reasons = sorted(set(self.unavailable.values()))
        return "no writable cgroup hierarchy" + (f" ({'; '.join(reasons)})" if reasons else "")

    # -- per job -----------------------------------------------------------------
    def create(self, job_id: int, *, cpus: float | None, mem_bytes: int | None,
               deny_devices: list[tuple[str, int, int]] = (),
               allow_devices: list[tuple[str, int, int | None]] | None = None) -> JobCgroup | None:
        """Make the job's groups and write its limits. None when no controller is usable.
        Device nodes: a native job is denied `deny_devices` (the GPUs it was not given); a
        container job (`allow_devices` given) may open only those (minor None: any minor)."""
        if not self.bases:
            return None
        name = self._free_name(job_id)
        cg = JobCgroup(job_id, self.version or "", {})
        try:
            for ctrl, base in self.bases.items():
                d = base / name
                d.mkdir()
                cg.paths[ctrl] = str(d)
            self._set_limits(cg, cpus, mem_bytes, deny_devices, allow_devices)
        except OSError:
            self._rmdirs(cg)
            raise
        self._jobs[job_id] = cg
        return cg

    def _free_name(self, job_id: int) -> str:
        """`job-<id>`; a stale empty group of that name is replaced, a busy one is left alone."""
        for n in range(1, 100):
            name = f"job-{job_id}" if n == 1 else f"job-{job_id}-{n}"
            dirs = [b / name for b in self.bases.values()]
            existing = [d for d in dirs if d.exists()]
            if not existing:
                return name
            if any(self._procs_of(str(d)) for d in existing):
                continue
            try:
                for d in existing:
                    d.rmdir()
                return name
            except OSError:
                continue
        raise OSError(errno.EEXIST, f"no free cgroup name for job {job_id} under {self.parent}")

    def _set_limits(self, cg: JobCgroup, cpus, mem_bytes, deny_devices, allow_devices=None) -> None:
        v = cg.version
        tag = f"cgroup-{v}"
        p = cg.paths
        enf = cg.enforced
        if v == "v2":
            d = p["unified"]
            if mem_bytes and "memory" not in self.unavailable:
                _write(f"{d}/memory.max", str(mem_bytes))
                if os.path.exists(f"{d}/memory.swap.max"):
                    _write(f"{d}/memory.swap.max", "0")
                enf["memory"] = tag
            if cpus and "cpu" not in self.unavailable:
                _write(f"{d}/cpu.max", f"{max(1000, int(cpus * CPU_PERIOD_US))} {CPU_PERIOD_US}")
                enf["cpu"] = tag
            if "pids" not in self.unavailable:
                _write(f"{d}/pids.max", str(self.pids_max))
                enf["pids"] = f"{tag} (max {self.pids_max})"
            if deny_devices or allow_devices is not None:
                if "devices" in self.unavailable:
                    cg.not_enforced["devices"] = self.unavailable["devices"]
                    return
                try:
                    devbpf.fence(d, deny_devices, allow_devices)
                except devbpf.StillAttached:
                    raise  # create() removes the group, which detaches the program
                except (OSError, ValueError) as e:  # the job runs unfenced, and its record says why
                    cg.not_enforced["devices"] = devbpf.reason(e)
                else:
                    enf["devices"] = f"{tag} (eBPF" + (f", {len(allow_devices)} nodes allowed)" if allow_devices
                                                      is not None else ")")
            return
        if mem_bytes and "memory" in p:
            _write(f"{p['memory']}/memory.limit_in_bytes", str(mem_bytes))
            try:  # memory+swap: no escaping the limit into swap
                _write(f"{p['memory']}/memory.memsw.limit_in_bytes", str(mem_bytes))
            except OSError:
                pass
            enf["memory"] = tag
        if cpus and "cpu" in p:
            _write(f"{p['cpu']}/cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(f"{p['cpu']}/cpu.cfs_quota_us", str(max(1000, int(cpus * CPU_PERIOD_US))))
            enf["cpu"] = tag
        if "pids" in p:
            _write(f"{p['pids']}/pids.max", str(self.pids_max))
            enf["pids"] = f"{tag} (max {self.pids_max})"
        if allow_devices is not None and "devices" in p:  # nothing but these: no process is in it yet
            _write(f"{p['devices']}/devices.deny", "a")
            above = []  # denied by a group above (the kernel refuses to allow them here): they stay denied
            for typ, major, minor in allow_devices:
                rule = f"{typ} {major}:{'*' if minor is None else minor}"
                try:
                    _write(f"{p['devices']}/devices.allow", f"{rule} rwm")
                except PermissionError:
                    above.append(rule)
            enf["devices"] = (f"{tag} ({len(allow_devices) - len(above)} nodes allowed"
                              + (f"; denied above it: {', '.join(above)})" if above else ")"))
        elif deny_devices and "devices" in p:
            for typ, major, minor in deny_devices:
                _write(f"{p['devices']}/devices.deny", f"{typ} {major}:{minor} rwm")
            enf["devices"] = tag

    def enter(self, job_id: int, pid: int) -> None:
        """Move `pid` into every group of the job: a tenant's `podman exec` into the job's
        container, as it starts, so that what it runs is born there, under the job's limits
        and device fence (rootless podman on cgroup v1 cannot join the container's group
        itself, and an exec session would otherwise run in its caller's unfenced group). The
        devices group first. Raises OSError naming the group when the job has none here."""
        cg = self._jobs.get(job_id)
        if cg is None or not cg.paths:
            raise OSError(errno.ENOENT, f"job {job_id} has no cgroup on this node")
        for ctrl in sorted(cg.paths, key=lambda c: c not in ("devices", "unified")):
            path = os.path.join(cg.paths[ctrl], "cgroup.procs")
            try:
                _write(path, str(pid))
            except OSError as e:
                raise OSError(e.errno, f"{path}: {e.strerror or e}") from None

    def attach(self, job_id: int, version: str, paths: dict[str, str]) -> JobCgroup:
        """Know a job's groups again after a restart (from the runner's persisted state)."""
        cg = JobCgroup(job_id, version, {k: v for k, v in paths.items() if os.path.isdir(v)})
        self._jobs[job_id] = cg
        return cg

    def get(self, job_id: int) -> JobCgroup | None:
        return self._jobs.get(job_id)

    @staticmethod
    def _procs_of(path: str) -> set[int]:
        try:
            return {int(x) for x in _read(os.path.join(path, "cgroup.procs")).split()}
        except (OSError, ValueError):
            return set()

    def pids(self, job_id: int) -> set[int]:
        """Live (non-zombie) processes in any of the job's groups."""
        cg = self._jobs.get(job_id)
        if cg is None:
            return set()
        found: set[int] = set()
        for path in cg.paths.values():
            found |= self._procs_of(path)
        return {p for p in found if procs.alive(p)}

    def cpu_seconds(self, job_id: int) -> float | None:
        """CPU time the job's processes used so far (cpuacct on v1, cpu.stat on v2)."""
        cg = self._jobs.get(job_id)
        if cg is None:
            return None
        try:
            if "unified" in cg.paths:
                for line in _read(os.path.join(cg.paths["unified"], "cpu.stat")).splitlines():
                    if line.startswith("usage_usec "):
                        return int(line.split()[1]) / 1e6
            for ctrl in ("cpuacct", "cpu"):  # its own mount, or co-mounted with cpu
                usage = os.path.join(cg.paths.get(ctrl, ""), "cpuacct.usage")
                if ctrl in cg.paths and os.path.exists(usage):
                    return int(_read(usage)) / 1e9
        except (OSError, ValueError):
            return None
        return None

    def signal_all(self, job_id: int, sig: int) -> None:
        for pid in self.pids(job_id):
            try:
                os.kill(pid, sig)
            except OSError:
                pass

    def kill_all(self, job_id: int, timeout_s: float = 5.0) -> bool:
        """SIGKILL every process of the job, including ones forking meanwhile; True when
        none is left. v2 uses cgroup.kill; v1 freezes the group first so nothing escapes
        between reading cgroup.procs and killing."""
        cg = self._jobs.get(job_id)
        if cg is None:
            return True
        deadline = time.monotonic() + timeout_s
        if cg.version == "v2":
            kill_file = os.path.join(cg.paths.get("unified", ""), "cgroup.kill")
            if os.path.exists(kill_file):
                try:
                    _write(kill_file, "1")
                except OSError:
                    pass
        freezer = cg.paths.get("freezer")
        while True:
            if freezer:
                self._freeze(freezer, True)
            try:
                self.signal_all(job_id, signal.SIGKILL)
            finally:
                if freezer:  # killed tasks die when thawed
                    self._freeze(freezer, False)
            if not self.pids(job_id):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    @staticmethod
    def _freeze(path: str, on: bool, timeout_s: float = 1.0) -> bool:
        want = "FROZEN" if on else "THAWED"
        try:
            _write(f"{path}/freezer.state", want)
            deadline = time.monotonic() + timeout_s
            while _read(f"{path}/freezer.state").strip() != want:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.005)
            return True
        except OSError:
            return False

    def hold_member(self, pid: int | None = None) -> str | None:
        """Move the member's process (`pid`, default this one; all its threads) into its
        services group, weighted SERVICES_CPU_WEIGHT times above its jobs' parent (see the
        module's docstring). Call it before the first job starts: what the member starts
        afterwards (shims, sshd) is born there. None when done; else why the member's
        work is not weighted above its jobs here (it still runs, at an equal share)."""
        pid = pid or os.getpid()
        if not self.bases:
            return self.no_hierarchy()
        problems = []
        for ctrl, group in self._join_sibling(SERVICES_SUFFIX, pid, problems).items():
            self.services[ctrl] = group
        self._held = pid if self.services else self._held
        weight = self._weigh_services()
        if weight:
            problems.append(weight)
        return "; ".join(problems) or None

    @classmethod
    def hold_member_early(cls, parent: str, **kw) -> str | None:
        """hold_member() for a member that is starting, before its heavy imports and the
        reload of its state: a member restarted while its jobs burn every CPU otherwise
        spends that time at their share, and its first report comes seconds later
        (bench/member_restart.py). The agent's own Cgroups, made later in this process,
        finds it in its services group and takes it from there (detection above)."""
        return cls(parent, **kw).hold_member()

    def place_sessions(self, pid: int) -> str | None:
        """Move `pid` (the tenant sshd, as it starts: its sessions are born where it is) out
        of the services group into `<own>/<parent>-sessions`, at the default weight, the
        jobs' parent's: tenants' interactive work gets no more than their jobs, and never
        the member's share. None when done, else why not."""
        problems: list[str] = []
        self._fence_sessions(problems)  # before it joins: nothing is ever there unfenced
        self._join_sibling(SESSIONS_SUFFIX, pid, problems)
        return "; ".join(problems) or None

    def sessions_misses(self, pid: int) -> list[str]:
        """The hierarchies whose sessions group does not hold `pid` (the tenant sshd): empty
        when it is where place_sessions() put it."""
        return [ctrl for ctrl, base in self.bases.items()
                if pid not in self._procs_of(str(base.with_name(self.parent + SESSIONS_SUFFIX)))]

    def fence_sessions(self, deny_devices: list[tuple[str, int, int]]) -> None:
        """What tenants run outside their jobs (their SSH sessions, the podman they run
        there, mt-podman) holds no GPU: the sessions group is denied these device nodes,
        every GPU's, from the next place_sessions() on (docs/ISOLATION.md). After
        open_sessions() (SESSION_GPUS = "all") the group stays open."""
        if self._sessions_open:
            return
        self._sessions_deny = list(deny_devices)
        self._sessions_fenced = set()

    def open_sessions(self) -> None:
        """SESSION_GPUS = "all" (a single-user workstation): the sessions group denies no
        device node; a denial an earlier start left on it (the group outlives a member whose
        sshd or sessions still run) is lifted at the next place_sessions()."""
        self._sessions_deny = []
        self._sessions_open = True
        self._sessions_fenced = set()

    def _open_sessions(self, problems: list[str]) -> None:
        """Lift the sessions group's device rules, if the group exists: v1 `devices.allow a`
        (every device, as its parent allows), v2 every device program attached to it."""
        for ctrl in ("devices", "unified"):
            base = self.bases.get(ctrl)
            if base is None or ctrl in self._sessions_fenced:
                continue
            group = base.with_name(self.parent + SESSIONS_SUFFIX)
            if group.is_dir():
                try:
                    if ctrl == "devices":
                        _write(group / "devices.allow", "a")
                    else:
                        devbpf.detach_all(str(group))
                except (OSError, ValueError) as e:
                    problems.append(f"{group}: its earlier GPU fence could not be lifted ({devbpf.reason(e)})")
                    continue
            self._sessions_fenced.add(ctrl)

    def _fence_sessions(self, problems: list[str]) -> None:
        """Write the sessions group's device denial once per hierarchy (v1 devices.deny,
        v2 a device program; on v2 a restart that finds the group still there attaches one
        more, the same)."""
        if self._sessions_open:
            self._open_sessions(problems)
            return
        deny = self._sessions_deny
        if not deny:
            return
        for ctrl in ("devices", "unified"):
            base = self.bases.get(ctrl)
            if base is None or ctrl in self._sessions_fenced:
                continue
            group = base.with_name(self.parent + SESSIONS_SUFFIX)
            try:
                group.mkdir(exist_ok=True)
                if ctrl == "devices":
                    for typ, major, minor in deny:
                        _write(group / "devices.deny", f"{typ} {major}:{minor} rwm")
                elif "devices" in self.unavailable:
                    problems.append(f"{group}: GPUs not fenced off ({self.unavailable['devices']})")
                    continue
                else:
                    devbpf.fence(str(group), deny)
            except (OSError, ValueError) as e:
                problems.append(f"{group}: GPUs not fenced off ({devbpf.reason(e)})")
                continue
            self._sessions_fenced.add(ctrl)

    def job_of(self, pid: int) -> int | None:
        """The job whose groups hold `pid` (this member's jobs), or None."""
        for job_id, cg in list(self._jobs.items()):
            path = cg.paths.get("devices") or cg.paths.get("unified") or next(iter(cg.paths.values()), None)
            if path and pid in self._procs_of(path):
                return job_id
        return None

    def _join_sibling(self, suffix: str, pid: int, problems: list[str]) -> dict[str, Path]:
        """Move `pid` into `<own>/<parent><suffix>` of every hierarchy (made if missing): the
        groups it joined, by controller; each failure is added to `problems`."""
        joined = {}
        for ctrl, base in self.bases.items():
            group = base.with_name(self.parent + suffix)
            try:
                group.mkdir(exist_ok=True)
                _write(group / "cgroup.procs", str(pid))
            except OSError as e:
                problems.append(f"{group}: {e.strerror or e}")
                continue
            joined[ctrl] = group
        return joined

    def _weigh_services(self) -> str | None:
        """Write the services group's CPU weight; why not, or None."""
        if "unified" in self.services and "cpu" not in self.unavailable:
            path = self.services["unified"] / "cpu.weight"
            value = 100 * SERVICES_CPU_WEIGHT
        elif "cpu" in self.services:
            path = self.services["cpu"] / "cpu.shares"
            value = 1024 * SERVICES_CPU_WEIGHT
        else:
            return f"the cpu controller is not usable ({self.unavailable.get('cpu', 'no services group')})"
        try:
            _write(path, str(value))
        except OSError as e:
            return f"{path}: {e.strerror or e}"
        return None

    def release(self) -> None:
        """When the member stops: it goes back to the groups it started in, and its services,
        sessions and jobs' parent groups go if nothing is left in them (rmdir refuses a
        non-empty group: a job that runs on through a restart keeps its shim in the one and
        its group in the other, a tenant sshd left running keeps the sessions group, and the
        next start takes them over). On v2 a group with controllers enabled takes no process
        back: the member then stays in its services group until it exits."""
        if self._held is not None:
            for ctrl, own in self._own_dirs.items():
                try:
                    _write(own / "cgroup.procs", str(self._held))
                except OSError:
                    pass
            self._held = None
        siblings = {*self.services.values(), *(b.with_name(self.parent + suffix) for b in self.bases.values()
                                               for suffix in (SERVICES_SUFFIX, SESSIONS_SUFFIX))}
        siblings |= {own / (self.parent + NEIGHBOURS_SUFFIX) for own in self._own_dirs.values()}
        for group in [*siblings, *self.bases.values()]:  # (a member killed earlier left its own: gone if empty)
            try:
                group.rmdir()
            except OSError:
                pass
        self.services = {}

    def remove(self, job_id: int) -> None:
        """Delete the job's groups (after its processes are gone); retries briefly while
        exiting tasks are still being released."""
        cg = self._jobs.pop(job_id, None)
        if cg is not None:
            self._rmdirs(cg)

    @staticmethod
    def _rmdirs(cg: JobCgroup, timeout_s: float = 2.0) -> None:
        deadline = time.monotonic() + timeout_s
        for path in list(cg.paths.values()):
            while True:
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY or time.monotonic() >= deadline:
                        break
                    time.sleep(0.02)

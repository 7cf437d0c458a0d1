"""The container runner: a `container=IMAGE` job runs `podman run` as its tenant
(rootless, the tenant's own store) under the same shim as a native job.

The shim (shim.py) drops to the tenant and runs podman in the job's cgroups, so the
container's processes (conmon, the job) stay in them: the job's cgroup limits, tree kill,
fencing, the exit record and re-attach after a server restart are the native job's. On
cgroup v1 rootless podman cannot set limits itself, so `cpus=`/`mem=` are the enclosing
job cgroup's; on cgroup v2 they are also given to podman (`--cpus`, `--memory`).

What a container gets (docs/CONTAINERS.md):
- `--userns=keep-id`: the tenant's uid/gid inside; `--pull=never`: nothing is downloaded
  when a job starts; `--init`: signals (cancel, time limit) reach the job as natively;
  labels mtgpu.job / mtgpu.node / mtgpu.run; `--rm`, and removed by name by cleanup().
- the home at its own path (read-write); DATASETS_DIRECTORIES and PYTHON_INTERPRETERS roots
  read-only; the tenant's cache volume at /mtgpu-cache (PIP_CACHE_DIR, HF_HOME, TORCH_HOME).
- its GPUs as CDI devices, and the visibility variables renumbered to what the container
  sees (its GPUs are devices 0..k-1 there) in the container's own environment, which
  `podman exec` sessions also get (CDI's env reaches the main process only).
- `--shm-size`: the job's `mem=` when given (shared memory is charged to the job's memory
  anyway), else half of the machine's memory: PyTorch data loaders need far more than
  podman's 64 MiB default.
- `nodes=N` jobs use the host network (the rendezvous port must be reachable); one-node
  jobs `[CONTAINERS] network`.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import json
import logging
import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
from pathlib import Path

from mtgpu.agent.podman.cdi import NVIDIA_CONTROL, CdiSpec
from mtgpu.agent.podman.exec_sessions import ExecSessions
from mtgpu.agent.podman.images import ImageError, ImageStore
from mtgpu.agent.podman.tenant import PODMAN, PodmanHost, PodmanSetupError, error_line, last_error
from mtgpu.agent.podman.ports import PortGuard, PortGuardError
from mtgpu.agent.runners.cgroups import STANDARD_DEVICES, device_numbers
from mtgpu.agent.runners.base import RUNNING, SLURM_BIN_DIR, UNSUPERVISED, ExitInfo, Launch, RunnerError
from mtgpu.agent.runners.native import Command, NativeRunner, _interpreter
from mtgpu.agent.runners.workspace import (ENTRY_MOUNT, GPUS_LABEL, Existing, entry_script, gpus_label, layer_image,
                                           parse_inspect, pick_host_ports, publish_args, workspace_container)
from mtgpu.agent.runners.workspace import LABEL as WS_LABEL
from mtgpu.agent.runners.workspace import WS_UID
from mtgpu.model.gpu import VISIBILITY_VARS
from mtgpu.workspaces.variables import (container_env_of_image, has_container_env, image_env, resolve_container_env,
                                        substitute_container_env_in_shell)
from mtgpu.workspaces.homepath import OutsideHome, checked_mounts, recheck_stored_sources
from mtgpu.workspaces.mounts import bind_mount_arg
from mtgpu.workspaces.runargs import host_sources
from mtgpu.agent.podman.bindcheck import Bind, BindMismatch, check_binds

log = logging.getLogger(__name__)

CACHE_MOUNT = "/mtgpu-cache"
SCRIPT_MOUNT = "/.mtgpu/job"
NODE_ENTRY_FILE = "entry"  # a workspace's entry script, in its job folder (podman.root/jobs/ID, root's)
PODMAN_EXITS = (125, 126, 127)  # podman's, or the runtime's, when its `Error:` line ends the log


def container_name(job_id: int, token: str) -> str:
    return f"mtgpu-job{job_id}-{token[:10]}"


def shm_bytes(mem_bytes: int | None) -> int:
    if mem_bytes:
        return mem_bytes
    try:
        return max(64 << 20, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2)
    except (ValueError, OSError):
        return 8 << 30


def _renumbered(env: dict[str, str]) -> dict[str, str]:
    """Inside, a container's k GPUs are its devices 0..k-1."""
    out = dict(env)
    for names in VISIBILITY_VARS.values():
        for var in names:
            value = env.get(var)
            if value:
                out[var] = ",".join(str(i) for i in range(len(value.split(","))))
    return out


class ContainerRunner(NativeRunner):
    """Native jobs as NativeRunner; `launch.container` jobs in rootless Podman."""

    def __init__(self, state_dir: Path, *, node_name: str, podman: PodmanHost, images: ImageStore,
                 cdi: CdiSpec | None, read_only: list[str], cache_volume: str, network: str, **kw):
        super().__init__(state_dir, **kw)
        self.node_name = node_name
        self.podman = podman
        self.images = images
        self.cdi = cdi
        self.read_only = list(read_only)
        self.cache_volume = cache_volume
        self.network = network
        self.ports = PortGuard(podman.key)
        self.exec_sessions = ExecSessions()

    # ------------------------------------------------------------ start
    def _command(self, launch: Launch, job_dir: Path, env: dict[str, str], token: str, enforced: dict) -> Command:
        if launch.container is None:
            return super()._command(launch, job_dir, env, token, enforced)
        image = launch.container
        ws = launch.workspace
        mounts: tuple[tuple[str, str, bool], ...] = ()
        if ws is not None:
            try:  # on this member's file system, at every start: a path checked at create may be a symlink now
                mounts = checked_mounts(ws.mounts, ws.run_args, launch.home)
            except OutsideHome as e:
                raise RunnerError(str(e)) from None
        try:
            tenant = self.podman.ready(launch.uid, launch.gid, launch.home)
            existing = self._existing_workspace(tenant, launch.job_id, gpus_label(launch.gpu_indices)) \
                if ws is not None else None
            staged = self.images.ensure_loaded(tenant, image) if existing is None else None
        except (PodmanSetupError, ImageError, OSError, subprocess.TimeoutExpired) as e:
            raise RunnerError(str(e)) from e
        files = self.podman.root / "jobs" / str(launch.job_id)
        layer = None
        if existing is not None and existing[1]:
            layer = self._recommit(tenant, launch.job_id)  # other GPUs now: its layer goes into a new container
        if existing is None or layer is not None:
            shutil.rmtree(files, ignore_errors=True)
            files.mkdir(mode=0o711)
            os.chmod(files, 0o711)  # root's, as every folder above it: the tenant cannot swap a file it holds
        else:
            _seal_node_folder(files)

        inner = _renumbered(env)
        inner.update({"PIP_CACHE_DIR": f"{CACHE_MOUNT}/pip", "HF_HOME": f"{CACHE_MOUNT}/huggingface",
                      "TORCH_HOME": f"{CACHE_MOUNT}/torch", "MTGPU_CACHE_DIR": CACHE_MOUNT,
                      "MTGPU_CONTAINER_IMAGE": image})
        ws_token = None
        if ws is not None:
            inner.update(dict(ws.env))
            if ws.token_env:
                ws_token = launch.ws_token or secrets.token_urlsafe(24)
                inner[ws.token_env] = ws_token
            env_of_image = functools.cache(lambda: self._image_env(tenant, staged[1] if staged else image, image))
            if any(has_container_env(v) for _, v in ws.env):  # ${containerEnv:PATH}: the image's, here
                inner = resolve_container_env(inner, env_of_image())
            made = existing is None or layer is not None  # its entry file is written now
            if made and any(has_container_env(c) for c in (*ws.post_create, *ws.post_start)):  # from its Env
                known = container_env_of_image(env_of_image())
                ws = dataclasses.replace(ws, post_create=tuple(substitute_container_env_in_shell(c, known)
                                                               for c in ws.post_create),
                                         post_start=tuple(substitute_container_env_in_shell(c, known)
                                                          for c in ws.post_start))
        for k, v in inner.items():
            if "\n" in v or "\0" in v or "=" in k:
                raise RunnerError(f"the environment variable {k} has a newline in its value; a container cannot get it")

        digest, run_as = (staged[0], staged[1]) if staged else (None, image)  # a staged image runs by its id
        penv = tenant.env()
        penv.update({"MTGPU_JOB_ID": str(launch.job_id), "MTGPU_RUN_TOKEN": token, "USER": env.get("USER", ""),
                     "LOGNAME": env.get("LOGNAME", "")})
        state = {"runner": "podman", "container": {"image": image, "digest": digest, "uid": launch.uid,
                                                   "gid": launch.gid, "home": launch.home, "files": str(files)}}
        enforced["container"] = f"rootless podman, {image}" + (f" ({digest[:19]})" if digest else "")
        if "memory" in enforced and enforced["memory"].startswith("setrlimit"):
            enforced["memory"] = "not enforced (no memory cgroup; RLIMIT_AS would break podman)"
            enforced.pop("mem_fallback", None)
        if ws is not None and existing is not None and not existing[1]:
            # Made for these GPUs before: start it again as it is (its layer, its ports).
            name, ports = workspace_container(launch.job_id), existing[0].ports
            cid = self._recheck_mounts(tenant, name, launch.home)
            if _tenant_binds(ws):  # what runc mounts at this start, checked before it runs
                self._init_checked(tenant, launch, name, cid, penv, files, made_now=False)
            self._guard(launch, ports)
            state["container"].update({"name": name, "workspace": True, "ports": ports, "token": ws_token})
            enforced["container_limits"] = "the job's cgroup around the container"
            return Command([PODMAN, "start", "--attach", name], penv, script_arg=False, state=state,
                           rlimit_as_ok=False)
        if layer is not None:
            run_as = layer

        self._write_owned(files / "env", "".join(f"{k}={v}\n" for k, v in sorted(inner.items())), launch, 0o600)
        gang = bool(env.get("MTGPU_NNODES"))
        network = "host" if gang else self.network
        if ws is not None:
            name = workspace_container(launch.job_id)
            if ws.ports and network in ("host", "none"):
                raise RunnerError(f"workspace ports {list(ws.ports)} cannot be published: this node's "
                                  f"[CONTAINERS] network is {network!r}; an admin sets network = \"slirp4netns\"")
            ports = dict(zip(ws.ports, pick_host_ports(len(ws.ports))))
            self._guard(launch, ports)
            self._write_owned(files / NODE_ENTRY_FILE, entry_script(ws), launch, 0o500)
            uid, gid = self._image_user(tenant, run_as, image, ws.user) if ws.user else (WS_UID, WS_UID)
            # root inside is the tenant itself: the rootless default mapping (keep-id onto uid 0 fails in runc)
            userns = f"--userns=keep-id:uid={uid},gid={gid}" if uid else "--userns="
            argv = [PODMAN, "run", "--init", "--pull=never", userns,
                    "--user", f"{uid}:{gid}", "--name", name,
                    "--label", f"{WS_LABEL}={launch.job_id}", "--label", f"{GPUS_LABEL}={gpus_label(launch.gpu_indices)}",
                    *[a for k, v in ws.labels for a in ("--label", f"{k}={v}")], *publish_args(ports)]
            if not any(k == "devcontainer.metadata" for k, _ in ws.labels):  # what VS Code reads when it attaches
                folder = ws.container_workdir or launch.workdir
                argv += ["--label", "devcontainer.metadata=" + json.dumps([{"workspaceFolder": folder}])]
            state["container"].update({"name": name, "workspace": True, "ports": ports, "token": ws_token})
        else:
            name = container_name(launch.job_id, token)
            self._write_owned(files / "script", launch.script, launch, 0o500)
            # --user too: an image's own USER (a saved workspace's is 1000) would win over keep-id's
            argv = [PODMAN, "run", "--rm", "--init", "--pull=never", "--userns=keep-id",
                    "--user", f"{launch.uid}:{launch.gid}", "--name", name]
            state["container"]["name"] = name
        argv += ["--label", f"mtgpu.job={launch.job_id}", "--label", f"mtgpu.node={self.node_name}",
                 "--label", f"mtgpu.run={token}", "--network", network,
                 "--env-file", str(files / "env"),
                 "--workdir", (ws.container_workdir if ws is not None and ws.container_workdir else launch.workdir),
                 "--shm-size", str(shm_bytes(launch.mem_bytes)),
                 "-v", f"{launch.home}:{launch.home}",
                 "-v", f"{self.cache_volume}:{CACHE_MOUNT}"]
        if ws is None:
            argv += ["-v", f"{files / 'script'}:{SCRIPT_MOUNT}:ro"]
            if os.path.isdir(SLURM_BIN_DIR):  # our srun, at the path the job's PATH names
                argv += ["-v", f"{SLURM_BIN_DIR}:{SLURM_BIN_DIR}:ro"]
        else:
            argv += ["-v", f"{files / NODE_ENTRY_FILE}:{ENTRY_MOUNT}:ro"]
            for source, target, ro in mounts:  # resolved: no symlink of the tenant's left for podman to follow
                argv += ["--mount", bind_mount_arg(source, target, ro)]  # a folder named with ':' or ',' holds
        for path in self.read_only:
            if os.path.exists(path):
                argv += ["-v", f"{path}:{path}:ro"]
        if launch.gpu_indices:
            if self.cdi is None:
                raise RunnerError("this node has no CDI spec for its GPUs; a container cannot be given GPUs here")
            try:
                argv += self.cdi.device_args(launch.gpu_indices)
            except KeyError as e:
                raise RunnerError(str(e.args[0])) from None
        limits = "the job's cgroup around the container"
        if self.cgroups.version == "v2":
            if launch.cpus:
                argv += ["--cpus", f"{launch.cpus:g}"]
            if launch.mem_bytes:
                argv += ["--memory", str(launch.mem_bytes)]
            limits = "podman (cgroup v2) and the job's cgroup"
        if ws is not None:
            argv += [*ws.run_args, run_as, "/bin/sh", ENTRY_MOUNT, *ws.command]
            if _tenant_binds(ws):  # made and mounted, checked, then started: no window between check and mount
                cid = self._create(launch, name, argv, penv)
                self._init_checked(tenant, launch, name, cid, penv, files, made_now=True)
                enforced["container_limits"] = limits
                return Command([PODMAN, "start", "--attach", name], penv, script_arg=False, state=state,
                               rlimit_as_ok=False)
        elif launch.script.startswith("#!"):
            argv += [run_as, *_interpreter(launch.script), SCRIPT_MOUNT]
        else:  # bash when the image has it (as natively), else its sh
            argv += [run_as, "/bin/sh", "-c", 'if [ -x /bin/bash ]; then exec /bin/bash "$0"; fi; exec /bin/sh "$0"',
                     SCRIPT_MOUNT]
        enforced["container_limits"] = limits
        return Command(argv, penv, script_arg=False, state=state, rlimit_as_ok=False)

    def _allowed_devices(self, launch: Launch) -> list[tuple[str, int, int | None]] | None:
        """A container's allow-list (the job's cgroup holds conmon, the container and every
        exec session into it: cgroups.enter): the standard nodes, its own GPUs' and, with
        GPUs, their vendor's shared ones (NVIDIA's control nodes, AMD's /dev/kfd); every
        other device node is denied, whatever the container has mounted."""
        if launch.container is None:
            return None
        own: list[str] = []
        for index in launch.gpu_indices:
            own += launch.gpu_devices.get(index, ())
        nvidia = launch.gpu_vendor in (None, "nvidia")
        if launch.gpu_indices and not launch.gpu_devices and nvidia:
            own += [f"/dev/nvidia{i}" for i in launch.gpu_indices]
        if launch.gpu_indices and nvidia:
            own += [*NVIDIA_CONTROL, *sorted(glob.glob("/dev/nvidia-caps/*"))]
        if launch.gpu_indices and launch.gpu_vendor == "amd":
            own.append("/dev/kfd")
        return [*STANDARD_DEVICES, *device_numbers(own)]

    # ------------------------------------------------------------ workspaces
    def _recheck_mounts(self, tenant, name: str, home: str) -> str:
        """The bind sources stored in a stopped workspace's container, checked before it
        starts again; returns the container's id."""
        try:
            r = tenant.run(["container", "inspect", "--format", "{{.Id}} {{json .Mounts}}", name], timeout_s=60)
            cid, _, text = r.stdout.decode().strip().partition(" ") if r.returncode == 0 else ("", "", "")
            stored = json.loads(text or "[]")
            recheck_stored_sources((m.get("Source", "") for m in stored or () if m.get("Type") == "bind"), home)
            return cid
        except OutsideHome as e:
            raise RunnerError(str(e)) from None
        except (OSError, ValueError, subprocess.TimeoutExpired) as e:
            raise RunnerError(f"workspace container {name}: its mounts could not be read to check them: {e}") from e

    def _create(self, launch: Launch, name: str, argv: list[str], penv: dict[str, str]) -> str:
        """`podman create` of what `argv` (a `podman run`) would run; returns its id."""
        r = subprocess.run([PODMAN, "create", *argv[2:]], env=penv, user=launch.uid, group=launch.gid,
                           extra_groups=list(launch.extra_gids), cwd="/", capture_output=True, timeout=300)
        if r.returncode != 0:
            raise RunnerError(f"podman could not create the container {name}: {last_error(r) or 'no answer'}")
        return (r.stdout.decode(errors="replace").split() or [""])[-1]

    def _init_checked(self, tenant, launch: Launch, name: str, cid: str, penv: dict[str, str], files: Path, *,
                      made_now: bool) -> None:
        """`podman init` in the job's cgroup (conmon and the waiting first process are born
        there, under the job's device fence, as with `podman run` under the shim), then every
        bind mount runc made is checked against its source (bindcheck.py) before anything of
        the container runs. Refused: the container is removed (made now) or stopped again
        (a workspace's kept container), and RunnerError names the mount."""
        def undo() -> None:
            if made_now:
                tenant.run(["rm", "--force", "--ignore", "--time", "0", name], timeout_s=60)
                return
            r = tenant.run(["stop", "--time", "0", name], timeout_s=60)
            if r.returncode != 0:  # never left initialized with a mount that was refused
                tenant.run(["rm", "--force", "--ignore", "--time", "0", name], timeout_s=60)

        # the gate: moved into the job's cgroup before it execs podman
        p = subprocess.Popen(["/bin/sh", "-c", 'read -r _ || exit 1; exec "$0" "$@"', PODMAN, "init", name],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=penv,
                             user=launch.uid, group=launch.gid, extra_groups=list(launch.extra_gids), cwd="/")
        try:
            if self.cgroups.get(launch.job_id) is not None:
                self.cgroups.enter(launch.job_id, p.pid)
            out, err = p.communicate(b"go\n", timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            p.kill()
            p.wait()
            undo()
            raise RunnerError(f"container {name}: podman init could not run in job {launch.job_id}'s cgroup "
                              f"({getattr(e, 'strerror', None) or e}), so it would not be fenced") from None
        if p.returncode != 0:
            r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
            undo()
            raise RunnerError(f"podman could not prepare the container {name}: {last_error(r) or 'no answer'}")
        try:
            pid, binds = self._waiting(tenant, launch.job_id, name, cid)
            check_binds(pid, binds, launch.home, str(files))
        except (OutsideHome, BindMismatch) as e:
            undo()
            raise RunnerError(str(e)) from None
        except (OSError, ValueError, subprocess.TimeoutExpired) as e:
            undo()
            raise RunnerError(f"container {name}: its mounts could not be checked before it starts: {e}") from None

    def _waiting(self, tenant, job_id: int, name: str, cid: str) -> tuple[int, list[Bind]]:
        """The initialized container's waiting first process and its bind mounts. With a
        job cgroup (the usual case, no podman call): the one process in it whose parent is
        the conmon in it too, and the mounts of the runtime spec runc was given (its bundle's
        config.json); else what `podman inspect` says."""
        binds = _spec_binds(tenant.graph_root, cid) if cid else None
        pid = None
        if self.cgroups.get(job_id) is not None:
            inside = self.cgroups.pids(job_id)
            children = [p for p in inside if (parent := _ppid(p)) in inside and _comm(parent) == "conmon"]
            if len(children) != 1:
                raise BindMismatch(f"its first process cannot be told in job {job_id}'s cgroup (processes {sorted(inside)})")
            pid = children[0]
        if pid is None or binds is None:
            r = tenant.run(["container", "inspect", "--format", "{{.State.Pid}} {{json .Mounts}}", name], timeout_s=60)
            pid_text, _, mounts_json = r.stdout.decode().strip().partition(" ")
            pid = pid if pid is not None else int(pid_text)
            if binds is None:
                binds = [Bind(m.get("Source", ""), m.get("Destination", ""))
                         for m in json.loads(mounts_json or "[]") or () if m.get("Type") == "bind"]
        return pid, binds

    def _guard(self, launch: Launch, ports: dict[int, int]) -> None:
        """Only the tenant (and root) may connect to these ports, from before they are published."""
        if not ports:
            return
        try:
            self.ports.allow(launch.job_id, launch.uid, list(ports.values()))
        except PortGuardError as e:
            raise RunnerError(f"{e}; the workspace's ports stay unpublished rather than open to every user") from e

    def load_state(self, job_id: int, state: dict) -> str:
        outcome = super().load_state(job_id, state)
        c = state.get("container") or {}
        if outcome in (RUNNING, UNSUPERVISED) and c.get("workspace") and c.get("ports"):
            try:
                self.ports.allow(job_id, c["uid"], [int(h) for h in c["ports"].values()])
            except PortGuardError as e:
                log.error("workspace job %d runs again, but its ports could not be kept private: %s", job_id, e)
        return outcome

    def _existing_workspace(self, tenant, job_id: int, gpus: str) -> tuple[Existing, bool] | None:
        """The workspace's container when it exists: (what it is, whether it must be made
        again because it was made for other GPUs); None when there is none."""
        if not _maybe_in_store(tenant.graph_root, workspace_container(job_id)):
            return None  # a first start: no podman call to learn it (about 70 ms of every workspace's start)
        r = tenant.run(["container", "inspect", workspace_container(job_id)], timeout_s=60)
        if r.returncode != 0:
            return None
        found = parse_inspect(r.stdout.decode(errors="replace"))
        if found is None:
            return None
        return found, found.gpus != gpus

    def _image_env(self, tenant, ref: str, image: str) -> dict[str, str]:
        """The image's own environment (Config.Env), what ${containerEnv:VAR} reads."""
        try:
            r = tenant.run(["image", "inspect", "--format", "{{json .Config.Env}}", ref], timeout_s=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RunnerError(f"the environment of image {image} could not be read: {e}") from e
        if r.returncode == 0:
            try:
                return image_env(json.loads(r.stdout.decode() or "null"))
            except ValueError:
                pass
        raise RunnerError(f"the environment of image {image} could not be read for ${{containerEnv:...}}: "
                          + (last_error(r) or "no answer"))

    def _image_user(self, tenant, run_as: str, image: str, user: str) -> tuple[int, int]:
        """The uid and gid of `user` in the image: the tenant is mapped onto that user."""
        r = tenant.run(["run", "--rm", "--pull=never", "--network=none", run_as, "/bin/sh", "-c",
                        'id -u "$0" && id -g "$0"', user], timeout_s=120)
        words = r.stdout.decode(errors="replace").split()
        if r.returncode != 0 or len(words) != 2 or not all(w.isdigit() for w in words):
            why = last_error(r) or r.stderr.decode(errors="replace").strip()[-300:] or "no answer"
            raise RunnerError(f"remoteUser/containerUser {user!r} is not a user of image {image} ({why}); name a user "
                              "of its /etc/passwd, or drop the key to be uid 1000 inside")
        return int(words[0]), int(words[1])

    def _recommit(self, tenant, job_id: int) -> str:
        name = workspace_container(job_id)
        r = tenant.run(["commit", "--quiet", name, layer_image(job_id)], timeout_s=600)
        if r.returncode != 0:
            raise RunnerError(f"workspace container {name}: its layer could not be kept: {last_error(r)}")
        tenant.run(["rm", "--force", "--ignore", name], timeout_s=60)
        return layer_image(job_id)

    def workspace_info(self, job_id: int) -> dict | None:
        """What a started workspace published: {"container", "ports", "token"}; None for a job."""
        run = self._runs.get(job_id)
        c = run.state.get("container") if run is not None else None
        if not c or not c.get("workspace"):
            return None
        return {"container": c["name"], "ports": {str(k): v for k, v in c.get("ports", {}).items()},
                "token": c.get("token")}

    def enter_container(self, name: str, uid: int, pid: int) -> int | None:
        """Put `pid` (the tenant `uid`'s podman exec, before it starts) into the cgroup of
        the running job or workspace whose container is `name`, so that the exec session
        opens that job's GPUs and no other (cgroups.enter); returns the job's id, or None
        when `name` is no running container of this tenant's here. Raises RunnerError when
        it could not be moved: the session must not run unfenced. A container id (VS Code
        execs by id) is read back to its name with the tenant's podman first."""
        mine = {job_id: run.state["container"] for job_id, run in list(self._runs.items())
                if (run.state.get("container") or {}).get("uid") == uid and run.exit is None}
        if name not in {c.get("name") for c in mine.values()} and re.fullmatch(r"[0-9a-f]{3,64}", name) and mine:
            c = next(iter(mine.values()))
            try:
                r = self.podman.tenant(uid, c["gid"], c["home"]).run(
                    ["container", "inspect", "--format", "{{.Name}}", name], timeout_s=30)
                name = r.stdout.decode(errors="replace").strip().lstrip("/") if r.returncode == 0 else name
            except (OSError, subprocess.TimeoutExpired):
                pass
        for job_id, c in mine.items():
            if c.get("name") != name:
                continue
            try:
                self.cgroups.enter(job_id, pid)
            except OSError as e:
                raise RunnerError(f"container {name}: this exec session could not be put into job {job_id}'s "
                                  f"cgroup ({e.strerror or e}), so it would not be fenced to the job's GPUs") from None
            return job_id
        return None

    def workspace_sessions(self, job_id: int) -> int:
        """Exec sessions open in a running workspace's container (shells, SSH logins, VS Code)."""
        run = self._runs.get(job_id)
        c = run.state.get("container") if run is not None else None
        if not c or not c.get("workspace"):
            return 0
        # a failed `podman exec` leaves its session listed: counted, it would keep the workspace busy for good
        return self.exec_sessions.count(self.podman.tenant(c["uid"], c["gid"], c["home"]), c["name"])

    def stop(self, job_id: int, grace_s: float = 5.0) -> None:
        """A workspace is stopped by podman (its container kept, its state clean), then as a job."""
        run = self._runs.get(job_id)
        c = run.state.get("container") if run is not None else None
        if c and c.get("workspace"):
            tenant = self.podman.tenant(c["uid"], c["gid"], c["home"])
            try:
                tenant.run(["stop", "--time", str(max(1, int(grace_s))), c["name"]], timeout_s=grace_s + 60)
            except (OSError, subprocess.TimeoutExpired) as e:
                log.warning("workspace container %s: podman stop failed: %s", c["name"], e)
        super().stop(job_id, grace_s)

    def save_workspace(self, job_id: int, uid: int, gid: int, home: str, name: str) -> str:
        """`mt-container save`: its container (layer included) as the staged image `name`,
        which every member can then fetch and run; returns the image's digest."""
        tenant = self.podman.ready(uid, gid, home)
        container = workspace_container(job_id)
        r = tenant.run(["commit", "--quiet", container], timeout_s=1800)
        if r.returncode != 0:
            raise RunnerError(f"workspace container {container} could not be committed: {last_error(r)}")
        image_id = r.stdout.decode().strip().splitlines()[-1]
        try:
            return self.images.stage_from_tenant(tenant, image_id, name)
        except (ImageError, OSError, subprocess.TimeoutExpired) as e:
            raise RunnerError(str(e)) from e

    def remove_workspace(self, job_id: int, uid: int, gid: int, home: str) -> bool:
        """`mt-container rm`: the container, its committed layer and its files."""
        tenant = self.podman.tenant(uid, gid, home)
        removed = self._remove_container({"uid": uid, "gid": gid, "home": home, "name": workspace_container(job_id)})
        try:
            tenant.run(["rmi", "--force", "--ignore", layer_image(job_id)], timeout_s=120)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if removed:
            shutil.rmtree(self.podman.root / "jobs" / str(job_id), ignore_errors=True)
        return removed

    @staticmethod
    def _write_owned(path: Path, text: str, launch: Launch, mode: int) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, text.encode())
            os.fchown(fd, launch.uid, launch.gid)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)

    # ------------------------------------------------------------ ends
    def _exit_record(self, run, name: str = "exit.json") -> ExitInfo | None:
        info = super()._exit_record(run, name)
        c = run.state.get("container")
        if info is None or c is None or info.exit_code not in PODMAN_EXITS or info.stopped or info.fenced:
            return info
        why = _podman_error_in_log(run.job_dir)
        if why:
            info.reason = f"podman could not run the container: {why}"
        return info

    def cleanup(self, job_id: int) -> None:
        run = self._runs.get(job_id)
        super().cleanup(job_id)
        c = run.state.get("container") if run is not None else None
        if c and c.get("workspace"):
            self.ports.drop(job_id)
            return  # a workspace's container is kept until the workspace is removed
        if not c:
            return
        ended = run.exit
        if ended is not None and ended.natural and ended.signal is None and ended.exit_code not in PODMAN_EXITS:
            removed = True  # podman run --rm removed it before it exited
        else:
            removed = self._remove_container(c)
        if removed:
            shutil.rmtree(c.get("files") or "", ignore_errors=True)

    def _remove_container(self, c: dict) -> bool:
        tenant = self.podman.tenant(c["uid"], c["gid"], c["home"])
        try:
            r = tenant.run(["rm", "--force", "--ignore", "--time", "0", c["name"]], timeout_s=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("container %s: could not remove it: %s", c["name"], e)
            return False
        if r.returncode != 0:
            log.warning("container %s: could not remove it: %s", c["name"], last_error(r))
            return False
        return True

    def sweep(self, active_tokens: set[str]) -> list[str]:
        """Remove this node's containers that no known run owns (left by a crash);
        returns their names. Looks in every tenant store made here."""
        removed = []
        users = self.podman.root / "users"
        for d in sorted(users.iterdir()) if users.is_dir() else []:
            if not d.name.isdigit() or not (d / "storage").is_dir():
                continue
            try:
                account = pwd.getpwuid(int(d.name))
            except KeyError:
                continue  # the account is gone; its store goes with the tenant's removal
            tenant = self.podman.tenant(account.pw_uid, account.pw_gid, account.pw_dir)
            try:
                r = tenant.run(["ps", "-a", "--filter", f"label=mtgpu.node={self.node_name}", "--format",
                                '{{.Names}} {{index .Labels "mtgpu.run"}} {{index .Labels "' + WS_LABEL + '"}}'],
                               timeout_s=60)
            except (OSError, subprocess.TimeoutExpired):
                continue
            for line in r.stdout.decode(errors="replace").splitlines():
                parts = line.split()  # a workspace's container (third field) goes with its workspace
                if len(parts) == 2 and parts[1] not in active_tokens:
                    if self._remove_container({"uid": tenant.uid, "gid": tenant.gid, "home": tenant.home,
                                               "name": parts[0]}):
                        removed.append(parts[0])
        return removed

    def active_tokens(self) -> set[str]:
        return {r.state.get("run_token", "") for r in self._runs.values()}


def _seal_node_folder(files: Path) -> None:
    """The job folder a kept workspace container mounts its entry file from, root's and
    closed to the tenant's writes before podman follows the path again at `podman start`.
    A folder made before the node's files lived in root's folders (the tenant's, 0700) is
    taken back; an entry file the tenant replaced meanwhile (anything but a regular file)
    is refused: the workspace is made again by `mt-container rm` and `create`."""
    try:
        fd = os.open(files, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise RunnerError(f"the workspace's job folder {files} cannot be opened ({e.strerror}); remove the "
                          "workspace and create it again") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != 0 or st.st_gid != 0 or stat.S_IMODE(st.st_mode) != 0o711:
            os.fchown(fd, 0, 0)
            os.fchmod(fd, 0o711)
        entry = os.stat(NODE_ENTRY_FILE, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISREG(entry.st_mode):
            raise RunnerError(f"the workspace's entry file {files / NODE_ENTRY_FILE} is no longer the node's "
                              "(it was replaced by something that is not a regular file); remove the workspace "
                              "(mt-container rm) and create it again")
    except FileNotFoundError:
        raise RunnerError(f"the workspace's entry file {files / NODE_ENTRY_FILE} is missing; remove the workspace "
                          "(mt-container rm) and create it again") from None
    finally:
        os.close(fd)


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _read_small(path: Path, limit: int = 8 << 20) -> bytes | None:
    """A regular file of the tenant's store, read as root without following a link at its
    end and at most `limit` bytes; None when it is not there or not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def _maybe_in_store(graph_root: Path, name: str) -> bool:
    """False only when the tenant's store lists its containers and `name` is not among them
    (containers/storage's containers.json); True when it is, or when that cannot be told."""
    for driver in ("overlay", "vfs"):
        data = _read_small(graph_root / f"{driver}-containers" / "containers.json")
        if data is None:
            continue
        try:
            listed = json.loads(data)
            return any(name in (c.get("names") or ()) for c in listed if isinstance(c, dict))
        except (ValueError, TypeError, AttributeError):
            return True
    return True


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _spec_binds(graph_root: Path, cid: str) -> list[Bind] | None:
    """The bind mounts of the OCI spec podman wrote for runc (BUNDLE/config.json in the
    tenant's store: read without following a link, at most 8 MiB); None when not found."""
    if not cid or not cid.isalnum():
        return None
    for driver in ("overlay", "vfs"):
        data = _read_small(graph_root / f"{driver}-containers" / cid / "userdata" / "config.json")
        if data is None:
            continue
        try:
            spec = json.loads(data)
        except ValueError:
            return None
        if not isinstance(spec, dict):
            return None
        return [Bind(m.get("source", ""), m.get("destination", "")) for m in spec.get("mounts") or ()
                if isinstance(m, dict) and m.get("type") == "bind"]
    return None


def _tenant_binds(ws) -> bool:
    """Whether a workspace mounts host paths of its tenant's (mounts, runArgs)."""
    return bool(ws.mounts) or bool(host_sources(list(ws.run_args)))


def _podman_error_in_log(job_dir: Path) -> str:
    """Podman's `Error:` line at the end of the job's log (the shim's launch.json names it)."""
    try:
        log_path = json.loads((job_dir / "launch.json").read_text())["log_path"]
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            tail = f.read().decode(errors="replace")
    except (OSError, ValueError, KeyError):
        return ""
    line = error_line(tail)
    return line[len("Error:"):].strip() if line else ""


__all__ = ["ContainerRunner", "container_name", "shm_bytes"]

"""Workspaces (mt-container): the long-running sibling of a container job
(docs/WORKSPACES.md). A workspace is a job whose spec carries a WorkspaceSpec: it is
placed (or queued, or refused at once) by the scheduler like any job, its container is
kept by its member, `stop` releases its reservation and keeps the container, `start`
queues it again pinned to that member, `rm` cancels it and its member removes the
container.

The service builds the WorkspaceSpec from a template of this node's config, an image,
or what the client read from a devcontainer.json (the client reads it as the tenant;
the service checks again what a node must never take from a tenant: mounts outside the
home, odd variables, ports out of range).
"""

from __future__ import annotations

import os
import re
from dataclasses import replace

from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from ...accounts.lookup import tenant_home_of
from ...agent.podman.setup import SAVED_PREFIX
from ...agent.podman.tenant import PodmanSetupError
from ...agent.runners.base import RunnerError
from ...agent.runners.workspace import url_of
from ...jobfile import JobFileError, parse_job_file
from ...model.job import Job, JobSpec, JobState, WorkspaceSpec
from ...state import commands as C
from ...workspaces.homepath import OutsideHome, checked_mounts
from ...workspaces.mounts import HomeFolder
from ...workspaces.runargs import check_run_args
from .identity import Caller
from .service import MemberService, ServiceError

RESOURCE_FLAGS = ("gpus", "vram", "cpus", "mem", "gpu-mode", "server", "priority")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,39}$")
_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class DevcontainerParts(BaseModel):
    """What `mt-container create --devcontainer` read from the file (mtgpu/workspaces)."""

    path: str = Field(max_length=4096)
    name: str | None = Field(default=None, max_length=200)
    image: str = Field(max_length=255)
    env: dict[str, str] = Field(default_factory=dict)
    ports: list[int] = Field(default_factory=list)
    post_create: list[str] = Field(default_factory=list)
    post_start: list[str] = Field(default_factory=list)
    mounts: list[tuple[str, str, bool]] = Field(default_factory=list)
    workdir: str | None = Field(default=None, max_length=4096)
    metadata: str = Field(default="", max_length=65536)
    resources: dict[str, str] = Field(default_factory=dict)
    run_args: list[str] = Field(default_factory=list)
    user: str | None = Field(default=None, max_length=32)


class WorkspaceRequest(BaseModel):
    name: str | None = Field(default=None, max_length=40)
    template: str | None = Field(default=None, max_length=100)
    image: str | None = Field(default=None, max_length=255)
    devcontainer: DevcontainerParts | None = None
    resources: dict[str, str] = Field(default_factory=dict, description="mt-job directive flags: gpus, cpus, ...")
    ports: list[int] = Field(default_factory=list, description="container ports to publish (besides the template's)")


# Linux takes one argument or variable of at most 128 KiB (MAX_ARG_STRLEN) and all of them
# together of about 2 MiB: what podman is handed must fit, with room for the node's own.
MAX_STRING_CHARS = 65536
MAX_REQUEST_CHARS = 1_000_000


def _unpassable(value: object) -> str | None:
    """Why a request cannot be handed to podman, naming the field (e.g. "devcontainer.run_args[1]
    holds a NUL character"), else None. The member's exec failed with "embedded null byte"."""
    total = 0
    for where, text in _strings_in(value):
        if "\0" in text:
            return f"{where} holds a NUL character, which no name, argument, path or variable given to podman can hold"
        if len(text) > MAX_STRING_CHARS:
            return f"{where} holds {len(text):,} characters, more than the {MAX_STRING_CHARS:,} one argument may"
        total += len(text)
    if total > MAX_REQUEST_CHARS:
        return f"the request holds {total:,} characters, more than the {MAX_REQUEST_CHARS:,} a workspace may"
    return None


def _strings_in(value: object, where: str = ""):
    """(where, text) of every string in a request, keys included."""
    if isinstance(value, str):
        yield where, value
        return
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for k, v in items:
        if isinstance(k, str):
            yield (f"{where}.{k!r}" if where else repr(k)), k
        yield from _strings_in(v, f"{where}[{k}]" if isinstance(k, int) else (f"{where}.{k}" if where else k))


class WorkspaceService:
    def __init__(self, service: MemberService) -> None:
        self.service = service
        self.config = service.config

    # ------------------------------------------------------------ create
    async def create(self, caller: Caller, req: WorkspaceRequest) -> dict:
        """Check and commit a workspace. The checks walk the tenant's file system (every bind
        source resolved in the home, homepath.py: a source through `..` and symlinks takes
        a quarter of a second, a request may hold many), so they run in a worker thread:
        on the event loop they held up every other request, members' reports included."""
        spec, name = await run_in_threadpool(self._checked_spec, caller, req)
        r = await self.service.submit_spec(caller, spec, what="workspace")
        warnings = [w for w in (r.get("warning"), *r.get("warnings", ())) if w]  # the disk quota; an own image pinned
        return {"name": name, "job_id": r["job_id"], **({"warning": "; ".join(warnings)} if warnings else {})}

    def _checked_spec(self, caller: Caller, req: WorkspaceRequest) -> tuple[JobSpec, str]:
        """The workspace's job spec and name, from a request that passed every check (blocking)."""
        self.service._authorized(caller)
        given = [k for k in ("template", "image", "devcontainer") if getattr(req, k) is not None]
        if len(given) != 1:
            raise ServiceError(422, "refused: give one of --template NAME, --image IMAGE or --devcontainer PATH"
                                    + self._templates_hint(), refused=True)
        why = _unpassable(req.model_dump())
        if why is not None:
            raise ServiceError(422, f"refused: {why}; remove or shorten it", refused=True)
        home = tenant_home_of(self.config.TENANT_HOME_ROOT, caller.name, caller.uid)
        resources: dict[str, str] = {}
        if req.template is not None:
            image, ws, resources = self._from_template(req.template)
        elif req.image is not None:
            image, ws = req.image, WorkspaceSpec(name="", source=f"image {req.image}")
        else:
            image, ws, resources = self._from_devcontainer(req.devcontainer, home)
        for key, value in req.resources.items():
            if key not in RESOURCE_FLAGS:
                raise ServiceError(422, f"refused: --{key} is not a workspace resource; give "
                                        + ", ".join(f"--{k}" for k in RESOURCE_FLAGS), refused=True)
            resources[key] = value
        ports = list(ws.ports)
        for p in req.ports:
            if not 1 <= p <= 65535:
                raise ServiceError(422, f"refused: --port {p}: a container port is 1-65535", refused=True)
            if p not in ports:
                ports.append(p)
        if ports and not self.config.CONTAINERS.publish_ports:
            raise ServiceError(422, f"refused: ports {ports}: this node does not publish workspace ports "
                                    "([CONTAINERS] publish_ports = false); drop --port, or an admin sets it to true",
                               refused=True)
        name = self._name(caller, req.name, req, image)
        ws = replace(ws, name=name, ports=tuple(ports))
        try:
            spec = parse_job_file("#!/bin/sh\n", resources)
        except JobFileError as e:
            raise ServiceError(422, f"refused: {e}", refused=True) from None
        spec = replace(spec, name=name, container=image, workspace=ws, time_limit_s=None, workdir=home,
                       script="# a workspace (mt-container): its container runs its command\n")
        return spec, name

    def _templates_hint(self) -> str:
        names = sorted(self.config.CONTAINERS.templates)
        return f" (templates here: {', '.join(names)})" if names else " (this node has no templates)"

    def _from_template(self, name: str) -> tuple[str, WorkspaceSpec, dict[str, str]]:
        t = self.config.CONTAINERS.templates.get(name)
        if t is None:
            raise ServiceError(422, f"refused: no template {name!r}" + self._templates_hint(), refused=True)
        if isinstance(t, str):
            return t, WorkspaceSpec(name="", source=f"template {name}"), {}
        ws = WorkspaceSpec(name="", source=f"template {name}", command=tuple(t.get("command") or ()),
                           ports=tuple(t.get("ports") or ()), env=tuple(sorted((t.get("env") or {}).items())),
                           token_env=t.get("token_env"), url_path=t.get("url_path", "/"))
        resources = {k.replace("_", "-"): str(t[k]) for k in ("gpus", "vram", "cpus", "mem", "gpu_mode") if k in t}
        return t["image"], ws, resources

    def _from_devcontainer(self, d: DevcontainerParts, home: str) -> tuple[str, WorkspaceSpec, dict[str, str]]:
        where = f"--devcontainer {d.path}"
        for source, target, _ro in d.mounts:
            if not target.startswith("/"):
                raise ServiceError(422, f"refused: {where}: mount target {target!r} must be an absolute path",
                                   refused=True)
        for k, v in d.env.items():
            if not _VAR.match(k) or "\n" in v or "\0" in v:
                raise ServiceError(422, f"refused: {where}: the variable {k!r} needs a name of letters, digits and _ "
                                        "and a one-line value", refused=True)
        for p in d.ports:
            if not 1 <= p <= 65535:
                raise ServiceError(422, f"refused: {where}: port {p} is not 1-65535", refused=True)
        home = HomeFolder(os.path.realpath(home), home)  # its real path and the account's, when they differ
        problems = check_run_args(d.run_args, home)
        if problems:
            raise ServiceError(422, f"refused: {where}: " + "; ".join(p.render() for p in problems), refused=True)
        try:  # resolved on this node's file system, as the member does again before podman runs
            checked_mounts(d.mounts, d.run_args, home)
        except OutsideHome as e:
            raise ServiceError(422, f"refused: {where}: {e}", refused=True) from None
        if d.user is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$", d.user):
            raise ServiceError(422, f"refused: {where}: remoteUser/containerUser {d.user!r} is not a user name",
                               refused=True)
        labels = (("devcontainer.metadata", d.metadata), ("devcontainer.config_file", d.path)) if d.metadata else ()
        ws = WorkspaceSpec(name=d.name or "", source=f"devcontainer {d.path}", ports=tuple(dict.fromkeys(d.ports)),
                           env=tuple(sorted(d.env.items())), post_create=tuple(d.post_create),
                           post_start=tuple(d.post_start), mounts=tuple((s, t, bool(ro)) for s, t, ro in d.mounts),
                           labels=labels, container_workdir=d.workdir, run_args=tuple(d.run_args), user=d.user)
        return d.image, ws, dict(d.resources)

    def _name(self, caller: Caller, wanted: str | None, req: WorkspaceRequest, image: str) -> str:
        taken = {j.spec.workspace.name for j in self._workspaces(caller)}
        if wanted is not None:
            if not _NAME.match(wanted):
                raise ServiceError(422, f"refused: --name {wanted!r}: use 1-40 lower-case letters, digits, '.', '_' "
                                        "and '-', starting with a letter or digit", refused=True)
            if wanted in taken:
                raise ServiceError(409, f"refused: you already have a workspace named {wanted!r}; choose another "
                                        f"--name, or `mt-container rm {wanted}` first", refused=True)
            return wanted
        if req.template is not None:
            base = req.template
        elif req.devcontainer is not None:
            base = req.devcontainer.name or os.path.basename(os.path.dirname(os.path.dirname(req.devcontainer.path)))
        else:
            base = image.rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0]
        base = re.sub(r"[^a-z0-9_.-]+", "-", base.lower()).strip("-._")[:30] or "ws"
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}-{n}"
        return name

    # ------------------------------------------------------------ the others
    def _workspaces(self, caller: Caller, everyone: bool = False) -> list[Job]:
        with self.service.store.lock:
            jobs = list(self.service.store.machine.jobs.values())
        return sorted((j for j in jobs if j.spec.workspace is not None and not j.state.final
                       and (j.uid == caller.uid or (everyone and caller.is_admin))), key=lambda j: j.id)

    def find(self, caller: Caller, name: str) -> Job:
        self.service._authorized(caller)
        for j in self._workspaces(caller):
            if j.spec.workspace.name == name or str(j.id) == name:
                return j
        raise ServiceError(404, f"no workspace {name!r} of yours; `mt-container list` shows them")

    def view(self, job: Job) -> dict:
        d = self.service.job_json(job)
        ws = job.spec.workspace
        ports = job.ws.get("ports") or {}
        token = job.ws.get("token")
        node = job.ws.get("node") or (job.allocations[0].node if job.allocations else None)
        rec = self.service.store.machine.nodes.get(node) if node else None
        d["workspace"] = {
            "name": ws.name, "source": ws.source, "image": job.spec.container,
            "node": node, "node_address": rec.address if rec else None,
            "container": job.ws.get("container"),
            "ports": [{"port": p, "host_port": ports.get(str(p)),
                       "url": url_of(ws, p, ports[str(p)], token) if str(p) in ports else None} for p in ws.ports],
            "command": list(ws.command), "post_create": list(ws.post_create), "post_start": list(ws.post_start),
        }
        return d

    def list(self, caller: Caller, everyone: bool = False) -> list[dict]:
        self.service._authorized(caller)
        return [self.view(j) for j in self._workspaces(caller, everyone)]

    def show(self, caller: Caller, name: str) -> dict:
        return self.view(self.find(caller, name))

    def stop(self, caller: Caller, name: str) -> dict:
        job = self.find(caller, name)
        if job.state is JobState.STOPPED:
            raise ServiceError(409, f"workspace {name!r} is already stopped; `mt-container start {name}` starts it")
        self._commit(C.WORKSPACE_STOP, job_id=job.id, at=self.service.clock(), reason=f"by {caller.name}")
        return self.show(caller, name)

    def start(self, caller: Caller, name: str) -> dict:
        job = self.find(caller, name)
        if job.state is not JobState.STOPPED:
            raise ServiceError(409, f"workspace {name!r} is {job.state.value}; only a stopped one can be started")
        self._commit(C.WORKSPACE_START, job_id=job.id, at=self.service.clock())
        return self.show(caller, name)

    def remove(self, caller: Caller, name: str) -> dict:
        job = self.find(caller, name)
        self._commit(C.JOB_CANCEL, job_id=job.id, at=self.service.clock(), by=caller.name,
                     reason=f"workspace removed by {caller.name}")
        return {"removed": job.spec.workspace.name, "job_id": job.id}

    def save(self, caller: Caller, name: str, image: str) -> dict:
        """`mt-container save WS NAME[:TAG]`: the workspace's container (its layer too) as
        the image SAVED_PREFIX/TENANT/NAME:TAG, staged here and offered to every member."""
        job = self.find(caller, name)
        short, _, tag = image.partition(":")
        if not _NAME.match(short) or (tag and not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$", tag)):
            raise ServiceError(422, f"refused: {image!r} is not an image name to save as; give NAME[:TAG] with a "
                                    "lower-case NAME, e.g. mt-container save lab mylab:v1", refused=True)
        full = f"{SAVED_PREFIX}{caller.name}/{short}:{tag or 'latest'}"
        node = job.ws.get("node")
        if not node or not job.ws.get("container"):
            raise ServiceError(409, f"workspace {name!r} has no container yet (it is {job.state.value}); save it "
                                    "once it has run")
        setup = self.service.member.agent.containers
        if node != self.service.node_name or setup is None:
            raise ServiceError(409, f"workspace {name!r} is kept on {node}; run `mt-container save` there")
        home = tenant_home_of(self.config.TENANT_HOME_ROOT, job.tenant, job.uid)
        try:
            digest = setup.runner.save_workspace(job.id, job.uid, job.gid, home, full)
        except (RunnerError, PodmanSetupError, OSError) as e:
            raise ServiceError(500, f"workspace {name!r} could not be saved: {e}") from None
        # Offered to the cluster before the answer, so that a create from it anywhere right
        # after finds it; if the cluster cannot record that now, the next pass does.
        offered = self.service.member.register_now()
        self.service.wake()
        return {"image": full, "digest": digest, "node": node, "offered": offered}

    def _commit(self, cmd: str, **args) -> None:
        r = self.service.apply(cmd, **args)
        if not r["ok"]:
            raise ServiceError(409, r["error"])
        self.service.wake()

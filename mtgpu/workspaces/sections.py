"""The smaller sections of devcontainer.json: environments, ports, lifecycle commands,
hostRequirements (-> the workspace's reservation) and the security keys."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mtgpu.model.units import UnitError, parse_size
from mtgpu.workspaces.errors import DevContainerError, Problem
from mtgpu.workspaces.runargs import cap_refused, security_opt_refused

LIFECYCLE_HOOKS = (
    "initializeCommand",
    "onCreateCommand",
    "updateContentCommand",
    "postCreateCommand",
    "postStartCommand",
    "postAttachCommand",
)
_LOOPBACK = ("127.0.0.1", "localhost")
_ENV_NAME = re.compile(r"^[^=\0]+$")
# The spec's size form, read as the reference reads it: tb/gb/mb/kb are 1024-based there.
_SPEC_SIZE = re.compile(r"^(\d+)([tgmk]b)?$", re.IGNORECASE)
_SPEC_FACTORS = {"t": 2**40, "g": 2**30, "m": 2**20, "k": 2**10}
_APP_PORT = re.compile(r"^(?:(?:(?P<ip>[^:]+):)?(?P<host>\d*):)?(?P<container>\d+)(?:/(?P<proto>tcp|udp|sctp))?$")


@dataclass(frozen=True)
class Command:
    """One lifecycle command: `shell` runs with `/bin/sh -c`, `argv` runs as is, without
    a shell. `name` is its key in the object form, whose commands run in parallel."""

    shell: str | None = None
    argv: tuple[str, ...] = ()
    name: str | None = None


@dataclass(frozen=True)
class AppPort:
    """An `appPort` entry: a container port published on the node's loopback (on
    `host_port`, or a free one when None)."""

    container_port: int
    host_port: int | None
    protocol: str = "tcp"


@dataclass(frozen=True)
class Reservation:
    """What the workspace reserves, in mt-job's terms; None means not asked. `gpus` is a
    count of whole GPUs; `gpu_optional` ("gpu": "optional") reserves none but says a GPU
    would be used if given (mt-container create --gpus)."""

    cpus: float | None = None
    mem_bytes: int | None = None
    gpus: int | None = None
    vram_bytes: int | None = None
    gpu_optional: bool = False

    def directives(self) -> dict[str, str]:
        """The same request as mt-job directives (`jobfile.parse_job_file` overrides)."""
        d: dict[str, str] = {}
        if self.cpus is not None:
            d["cpus"] = f"{self.cpus:g}"
        if self.mem_bytes is not None:
            d["mem"] = str(self.mem_bytes)
        if self.gpus:
            d["gpus"] = str(self.gpus)
        if self.vram_bytes is not None:
            d["vram"] = str(self.vram_bytes)
        return d


@dataclass(frozen=True)
class HostRequirements:
    """`hostRequirements` as written, sizes in bytes. `gpu` is False, True or "optional";
    `gpu_cores` is kept but not reserved (the scheduler has no per-model core counts);
    `storage_bytes` is not reserved either (USER_DISK_LIMIT governs disk)."""

    cpus: float | None = None
    memory_bytes: int | None = None
    storage_bytes: int | None = None
    gpu: bool | str = False
    gpu_cores: int | None = None
    gpu_memory_bytes: int | None = None

    def reservation(self) -> Reservation:
        return Reservation(
            cpus=self.cpus,
            mem_bytes=self.memory_bytes,
            gpus=1 if self.gpu is True else None,
            vram_bytes=self.gpu_memory_bytes if self.gpu is True else None,
            gpu_optional=self.gpu == "optional",
        )


def parse_env(cfg: dict, key: str, allow_null: bool) -> dict[str, str | None]:
    value = cfg.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise DevContainerError.one(key, value, 'must be an object of strings, such as {"LANG": "C.UTF-8"}')
    problems = []
    for name, v in value.items():
        if not _ENV_NAME.match(name):
            problems.append(Problem(f"{key}.{name}", v, "is not a variable name (empty, or holds '=')"))
        elif not (isinstance(v, str) or (allow_null and v is None)):
            problems.append(Problem(f"{key}.{name}", v, "must be a string; quote it"))
    if problems:
        raise DevContainerError(problems)
    return dict(value)


def _port(value: Any, key: str, written: object) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise DevContainerError.one(key, written, "is not a port; write a number from 1 to 65535")
    return value


def parse_forward_ports(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise DevContainerError.one("forwardPorts", value, "must be a list of ports, such as [8888, 6006]")
    ports: list[int] = []
    for i, item in enumerate(value):
        key = f"forwardPorts[{i}]"
        if isinstance(item, str) and ":" in item:
            host, _, port = item.rpartition(":")
            if host not in _LOOPBACK:
                raise DevContainerError.one(
                    key, item, f"forwards a port of {host!r}; only the workspace's own ports can be forwarded "
                    f"(docker compose services are not supported): write {port}"
                )
            item_port = _port(port, key, item)
        else:
            item_port = _port(item, key, item)
        if item_port not in ports:
            ports.append(item_port)
    return tuple(ports)


def parse_app_ports(value: Any) -> tuple[AppPort, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    result = []
    for i, item in enumerate(items):
        key = f"appPort[{i}]" if isinstance(value, list) else "appPort"
        if isinstance(item, int) and not isinstance(item, bool):
            port = _port(item, key, item)
            result.append(AppPort(port, port))
            continue
        m = _APP_PORT.match(item) if isinstance(item, str) else None
        if not m:
            raise DevContainerError.one(key, item, 'is not a port; write 8000, "8000:8000" or "127.0.0.1:8000:8000"')
        if m.group("ip") and m.group("ip") not in _LOOPBACK:
            raise DevContainerError.one(
                key, item, "workspace ports are published on the node's loopback only, and reached through "
                f"mt-container ports / remotegpu-cli forward; drop the address: {m.group('host')}:{m.group('container')}"
            )
        host = _port(m.group("host"), key, item) if m.group("host") else None
        result.append(AppPort(_port(m.group("container"), key, item), host, m.group("proto") or "tcp"))
    return tuple(result)


def _commands(value: Any, key: str) -> tuple[Command, ...]:
    hint = 'a string (run by a shell), a list (["cmd", "arg"], no shell) or an object of those (run in parallel)'
    if isinstance(value, str):
        return (Command(shell=value),) if value.strip() else ()
    if isinstance(value, list):
        if not all(isinstance(a, str) for a in value):
            raise DevContainerError.one(key, value, "a command list holds strings only; " + hint)
        return (Command(argv=tuple(value)),) if value else ()
    if isinstance(value, dict):
        out: list[Command] = []
        for name, sub in value.items():
            if isinstance(sub, dict) or sub is None:
                raise DevContainerError.one(f"{key}.{name}", sub, "must be a string or a list of strings")
            out += [Command(c.shell, c.argv, name) for c in _commands(sub, f"{key}.{name}")]
        return tuple(out)
    raise DevContainerError.one(key, value, "must be " + hint)


def parse_lifecycle(cfg: dict) -> dict[str, tuple[Command, ...]]:
    problems: list[Problem] = []
    hooks: dict[str, tuple[Command, ...]] = {}
    for hook in LIFECYCLE_HOOKS:
        if cfg.get(hook) is None:
            continue
        try:
            hooks[hook] = _commands(cfg[hook], hook)
        except DevContainerError as e:
            problems += e.problems
    if problems:
        raise DevContainerError(problems)
    return hooks


def _host_size(value: Any, key: str) -> int | None:
    m = _SPEC_SIZE.match(value.strip()) if isinstance(value, str) else None
    if m:
        n = int(m.group(1)) * (_SPEC_FACTORS[m.group(2)[0].lower()] if m.group(2) else 1)
    else:
        try:
            n = parse_size(value)
        except UnitError:
            raise DevContainerError.one(
                key, value, "is not a size; write it as devcontainer.json does (8gb, 512mb: 1024-based, as in the "
                "reference) or as mtgpu does (8G, 8GiB)"
            ) from None
    return n or None


def parse_host_requirements(value: Any) -> HostRequirements | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise DevContainerError.one("hostRequirements", value, 'must be an object, such as {"cpus": 4, "memory": "16gb"}')
    problems: list[Problem] = []

    def run(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except DevContainerError as e:
            problems.extend(e.problems)
            return None

    cpus = value.get("cpus")
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or cpus <= 0):
        problems.append(Problem("hostRequirements.cpus", cpus, "must be a number of CPU cores above 0, such as 4"))
        cpus = None
    memory = run(_host_size, value.get("memory"), "hostRequirements.memory") if value.get("memory") is not None else None
    storage = run(_host_size, value.get("storage"), "hostRequirements.storage") if value.get("storage") is not None else None
    gpu, cores, gpu_mem = value.get("gpu", False), None, None
    if isinstance(gpu, dict):
        cores, gpu_mem_raw = gpu.get("cores"), gpu.get("memory")
        if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 1):
            problems.append(Problem("hostRequirements.gpu.cores", cores, "must be a whole number above 0"))
            cores = None
        gpu_mem = run(_host_size, gpu_mem_raw, "hostRequirements.gpu.memory") if gpu_mem_raw is not None else None
        gpu = True
    elif gpu not in (True, False, "optional"):
        problems.append(
            Problem("hostRequirements.gpu", gpu, 'must be true, false, "optional" or {"cores": N, "memory": "16gb"}')
        )
        gpu = False
    if problems:
        raise DevContainerError(problems)
    return HostRequirements(
        cpus=float(cpus) if cpus is not None else None,
        memory_bytes=memory,
        storage_bytes=storage,
        gpu=gpu,
        gpu_cores=cores,
        gpu_memory_bytes=gpu_mem,
    )


def parse_security_keys(cfg: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(capAdd, securityOpt): what a debugger needs (SYS_PTRACE, seccomp=unconfined) passes,
    as in runArgs (runargs.py); `privileged` and anything else that would widen a workspace
    is refused."""
    problems = []
    if cfg.get("privileged") not in (None, False):
        problems.append(Problem("privileged", cfg["privileged"], "a workspace runs unprivileged, as you; remove it"))
    found: list[tuple[str, ...]] = []
    for key, why_refused, example in (("capAdd", cap_refused, "SYS_PTRACE"),
                                      ("securityOpt", security_opt_refused, "seccomp=unconfined")):
        raw = cfg.get(key)
        if raw is None:
            raw = []
        if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
            problems.append(Problem(key, raw, f'must be a list of strings, such as ["{example}"]'))
            raw = []
        problems += [Problem(f"{key}[{i}]", v, why) for i, v in enumerate(raw) if (why := why_refused(v))]
        found.append(tuple(raw))
    if problems:
        raise DevContainerError(problems)
    return found[0], found[1]

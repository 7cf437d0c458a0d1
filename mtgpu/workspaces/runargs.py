"""`runArgs` through an allow-list. The node already gives a workspace what those
flags usually ask for (its GPUs, its user mapping, its network, its limits), so only
options that cannot widen what a tenant reaches are passed on to `podman run`; any
other is refused, naming the argument and what to write instead."""

from __future__ import annotations

from collections.abc import Sequence

from mtgpu.workspaces.errors import DevContainerError, Problem
from mtgpu.workspaces.mounts import check_in_home, inside, parse_mount

# flag -> whether it takes a value; aliases share one spelling in _CANONICAL.
_ALLOWED = {
    "--shm-size": True, "--env": True, "--env-file": True, "--label": True, "--hostname": True,
    "--cap-drop": True, "--security-opt": True, "--init": False, "--workdir": True, "--tmpfs": True,
    "--add-host": True, "--volume": True, "--mount": True, "--network": True, "--ipc": True, "--cap-add": True,
}
_CANONICAL = {"-e": "--env", "-l": "--label", "-h": "--hostname", "-w": "--workdir", "-v": "--volume", "--net": "--network"}

_GPU_FIX = 'GPUs come from the reservation: set "hostRequirements": {"gpu": true} or mt-container create --gpus'
_LIMIT_FIX = 'resources come from the reservation: set "hostRequirements" (cpus, memory) or mt-container create --cpus/--mem'
_REFUSED = {
    "--privileged": "a workspace runs unprivileged, as you; remove it",
    "--device": "host devices are not given to workspaces; " + _GPU_FIX,
    "--device-cgroup-rule": "host devices are not given to workspaces; remove it",
    "--gpus": _GPU_FIX,
    "--pid": "a workspace has its own process namespace; remove it",
    "--uts": "a workspace has its own hostname namespace; remove it (--hostname NAME is allowed)",
    "--userns": "the node maps your uid into the workspace itself; remove it (set remoteUser/containerUser)",
    "--user": 'the node runs the workspace as you; set "containerUser"/"remoteUser" instead',
    "--cgroupns": "the node places the workspace in its own cgroup; remove it",
    "--cgroup-parent": "the node places the workspace in its own cgroup; remove it",
    "--name": "the node names the workspace's container; use mt-container create --name",
    "--pull": "images are never pulled on a node; remove it",
    "--rm": "the node decides when the workspace's container is removed (mt-container rm); remove it",
    "--detach": "the node starts the workspace detached itself; remove it",
    "--memory": _LIMIT_FIX, "--cpus": _LIMIT_FIX, "--cpuset-cpus": _LIMIT_FIX, "--cpu-shares": _LIMIT_FIX,
    "--publish": 'ports are published by the node on its loopback; use "forwardPorts" or "appPort"',
    "--publish-all": 'ports are published by the node on its loopback; use "forwardPorts" or "appPort"',
}
_REFUSED_FLAGS_ONLY = ("--privileged", "--rm", "--detach", "--publish-all")
_REFUSED_SHORT = {"-u": "--user", "-m": "--memory", "-p": "--publish", "-P": "--publish-all", "-d": "--detach"}
_NEW_PRIVS = ("no-new-privileges", "no-new-privileges:true", "no-new-privileges=true")
_IPC_OK = ("private", "none", "shareable")
# What a debugger needs, and all it gets: both act inside the tenant's own user namespace
# (docs/WORKSPACES.md, "Debuggers"); test_devcontainer_templates shows they reach nothing outside it.
CAPS_OK = ("SYS_PTRACE",)
SECURITY_OPTS_OK = (*_NEW_PRIVS, "seccomp=unconfined", "seccomp:unconfined")


def cap_refused(value: str) -> str | None:
    """Why `--cap-add VALUE` (or a capAdd entry) is refused, or None (SYS_PTRACE only)."""
    bad = [c for c in value.split(",") if c.strip().upper().removeprefix("CAP_") not in CAPS_OK]
    if not bad:
        return None
    return (f"capability {', '.join(bad)} is refused: a workspace may add only {', '.join(CAPS_OK)} (for debuggers); "
            "remove it (install what needs more in the image)")


def security_opt_refused(value: str) -> str | None:
    if value in SECURITY_OPTS_OK:
        return None
    return f"{value} is refused: only no-new-privileges and seccomp=unconfined (for debuggers) may be set; remove it"


_OVERLAY_DIRS = ("upperdir", "workdir")  # `-v SRC:DST:O,upperdir=DIR,workdir=DIR`: two more host folders


def _volume_paths(value: str) -> list[tuple[str, str]]:
    """(what, path) of every host path in a `-v` value: its source ("" for a volume name or
    an anonymous volume) and an overlay volume's upperdir and workdir (podman splits the
    value at every ':', and takes at most three parts)."""
    parts = value.split(":")
    found = [("source", parts[0])] if len(parts) > 1 else []
    for option in ",".join(parts[2:]).split(","):
        name, eq, path = option.partition("=")
        if eq and name.strip() in _OVERLAY_DIRS:
            found.append((name.strip(), path))
    return found


def _takes_value(flag: str, following: str | None) -> bool:
    if flag in _ALLOWED:
        return _ALLOWED[flag]
    if flag in _REFUSED:
        return flag not in _REFUSED_FLAGS_ONLY
    # an unknown flag: read a following non-option as its value, so it is not reported twice
    return following is not None and not following.startswith("-")


def _split(token: str, following: str | None) -> tuple[str, str | None, bool]:
    """(flag, value, whether the value is the next token) for one argument."""
    if token.startswith("--"):
        flag, eq, val = token.partition("=")
        flag = _CANONICAL.get(flag, flag)
        if eq:
            return flag, val, False
    else:
        flag = _REFUSED_SHORT.get(token[:2]) or _CANONICAL.get(token[:2], token[:2])
        if len(token) > 2:
            return flag, token[2:].removeprefix("="), False
    takes = _takes_value(flag, following)
    return flag, (following if takes else None), takes


def check_run_args(args: Sequence[object], home: str, key: str = "runArgs") -> list[Problem]:
    """Every refused argument in `args` (empty when all may be passed to podman run)."""
    problems: list[Problem] = []
    i = 0
    while i < len(args):
        token = args[i]
        k = f"{key}[{i}]"
        if not isinstance(token, str):
            problems.append(Problem(k, token, "runArgs holds strings; quote it"))
            i += 1
            continue
        if not token.startswith("-") or token == "-":
            problems.append(Problem(k, token, "runArgs holds options only; the image comes from image or build"))
            i += 1
            continue
        following = args[i + 1] if i + 1 < len(args) and isinstance(args[i + 1], str) else None
        flag, value, consumed = _split(token, following)
        shown = f"{token} {value}" if consumed and value is not None else token
        why = _why_refused(flag, value, home, token.partition("=")[0])
        if why is not None:
            problems.append(Problem(k, shown, why))
        i += 2 if consumed else 1
    return problems


def host_sources(args: Sequence[object], key: str = "runArgs") -> list[tuple[str, str, str]]:
    """(key, argument as written, host path) of every host path in `args` that podman would
    open: `-v`/`--volume` sources (and an overlay volume's upperdir and workdir),
    `--mount type=bind` sources, `--env-file`. Arguments that check_run_args refuses are
    skipped (they are reported there)."""
    found: list[tuple[str, str, str]] = []
    i = 0
    while i < len(args):
        token = args[i]
        if not isinstance(token, str) or not token.startswith("-") or token == "-":
            i += 1
            continue
        following = args[i + 1] if i + 1 < len(args) and isinstance(args[i + 1], str) else None
        flag, value, consumed = _split(token, following)
        shown = f"{token} {value}" if consumed and value is not None else token
        source = None
        if value is not None and flag == "--volume":
            found += [(f"{key}[{i}]", shown, path) for _what, path in _volume_paths(value) if path.startswith("/")]
        elif value is not None and flag == "--env-file":
            source = value
        elif value is not None and flag == "--mount":
            try:
                m = parse_mount(value, flag)
            except DevContainerError:
                m = None
            source = m.source if m is not None and m.type == "bind" else None
        if source is not None and source.startswith("/"):
            found.append((f"{key}[{i}]", shown, source))
        i += 2 if consumed else 1
    return found


def _why_refused(flag: str, value: str | None, home: str, written: str) -> str | None:
    if flag in _REFUSED:
        return f"{flag} is refused: {_REFUSED[flag]}"
    if flag not in _ALLOWED:
        allowed = ", ".join(sorted(_ALLOWED))
        return f"{written} is not on the allow-list of runArgs ({allowed}); remove it"
    if _ALLOWED[flag] and value is None:
        return f"{flag} needs a value"
    if not _ALLOWED[flag]:
        if value is not None and value.lower() not in ("true", "false"):
            return f"{flag} takes no value"
        return None
    assert value is not None  # a flag that takes a value has one here
    if flag == "--security-opt" and security_opt_refused(value):
        return f"--security-opt={security_opt_refused(value)}"
    if flag == "--cap-add" and cap_refused(value):
        return f"--cap-add {cap_refused(value)}"
    if flag == "--network" and value != "none":
        return f"--network={value} is refused: the node chooses the network ([CONTAINERS] network); --network=none is allowed"
    if flag == "--ipc" and value not in _IPC_OK:
        return f"--ipc={value} is refused: a workspace keeps its own IPC namespace ({', '.join(_IPC_OK)} are allowed)"
    if flag == "--label" and value.startswith("mtgpu."):
        return f"--label {value} is refused: the mtgpu.* labels are the node's; choose another name"
    if flag == "--env-file" and not (value.startswith("/") and inside(value, home)):
        return f"--env-file {value} must be an absolute path in your home {home}"
    if flag == "--mount":
        try:
            check_in_home(parse_mount(value, flag), home, flag, value)
        except DevContainerError as e:
            return e.problems[0].message
    if flag == "--volume":
        return _why_volume_refused(value, home)
    return None


def _why_volume_refused(value: str, home: str) -> str | None:
    for what, path in _volume_paths(value):
        if what == "source" and path.startswith((".", "~")):
            return f"-v source {path!r} is relative; write it from ${{localWorkspaceFolder}} or ${{localEnv:HOME}}"
        if what != "source" and not path.startswith("/"):
            return f"-v {what}={path} is not an absolute path; write it from ${{localEnv:HOME}}"
        if path.startswith("/") and not inside(path, home):
            shown = "source " + path if what == "source" else f"{what}={path}"
            return (
                f"-v {shown} is outside your home {home}; a workspace mounts only folders in your home: "
                "move the data under it, or use a named volume"
            )
    return None

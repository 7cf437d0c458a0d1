"""The config file's schema (DESIGN §2): one pydantic model per TOML table.

Field names are the documented keys, spelled exactly as users type them, so an
error can name the key without any mapping. Human forms (sizes) are parsed once
here: after validation `USER_DISK_LIMIT` and `SIMULATED_GPUS[].vram`/`used_vram`
hold bytes. Validators raise `PydanticCustomError` with a message that says
what is allowed; `loader.py` turns pydantic's errors into `ConfigError` lines.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from mtgpu.model.units import SIZE_HELP, UnitError, format_size, parse_duration, parse_size

DEFAULT_STATE_DIR = Path("/var/lib/mtgpu")
SOCKET_NAME = "mtgpu.sock"
SECRET_FILE_NAME = "cluster.secret"
MAX_UID = 2**32 - 2  # (uid_t)-1 is "no user"


def _bad(message: str) -> PydanticCustomError:
    """An error whose message is ours (what is allowed), not pydantic's."""
    return PydanticCustomError("mtgpu_value", message)


CROSS_ERROR_TYPE = "mtgpu_cross"


def _cross(problems: list[tuple[str, Any, str]]) -> PydanticCustomError:
    """Problems that involve several keys, each as (relative key, value, message):
    pydantic gives a model-level error no key, so the loader reads them from ctx."""
    return PydanticCustomError(CROSS_ERROR_TYPE, "; ".join(p[2] for p in problems), {"problems": problems})


# ---------------------------------------------------------------- reusable value checks

_HOST_RE = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9._-]{0,252})$")
_ADDRESS_HELP = 'host:port, e.g. "0.0.0.0:7070", "node-2.lan:7070" or "[::]:7070"'


def parse_address(text: str, *, allow_port_zero: bool = True) -> tuple[str, int]:
    """Split "host:port" (IPv6 in brackets) into (host, port); raises ValueError saying what is allowed."""
    if not isinstance(text, str):
        raise ValueError(f"must be {_ADDRESS_HELP}")
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
        if not sep:
            raise ValueError(f"the port is missing after ']:'; use {_ADDRESS_HELP}")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv6 address; use {_ADDRESS_HELP}") from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise ValueError(f"must be {_ADDRESS_HELP}")
        if ":" in host:
            raise ValueError(f"put an IPv6 address in brackets; use {_ADDRESS_HELP}")
        if not _HOST_RE.match(host):
            raise ValueError(f"{host!r} is not a host name or address; use {_ADDRESS_HELP}")
    lowest = 0 if allow_port_zero else 1
    if not re.fullmatch(r"[0-9]{1,5}", port_text) or not lowest <= int(port_text) <= 65535:
        raise ValueError(f"the port must be a number from {lowest} to 65535; use {_ADDRESS_HELP}")
    return host, int(port_text)


def _listen_address(value: str) -> str:
    try:
        parse_address(value)
    except ValueError as exc:
        raise _bad(str(exc)) from None
    return value


def _peer_address(value: str) -> str:
    try:
        parse_address(value, allow_port_zero=False)
    except ValueError as exc:
        raise _bad(str(exc)) from None
    return value


def _absolute(value: Path) -> Path:
    if not value.is_absolute():
        raise _bad('must be an absolute path, e.g. "/var/lib/mtgpu"')
    return value


def _size(value: Any) -> int:
    try:
        n_bytes = parse_size(value)
    except (UnitError, ValueError, OverflowError):
        raise _bad(f'must be {SIZE_HELP}, in quotes: "200GiB"') from None
    return n_bytes


def _positive_size(value: Any) -> int:
    n_bytes = _size(value)
    if n_bytes <= 0:
        raise _bad('must be more than 0, e.g. "200GiB"')
    return n_bytes


def _optional_positive_size(value: Any) -> int | None:
    return None if value is None else _positive_size(value)


def _name(what: str, example: str) -> Any:
    """A checker for simple names (node, cluster, group): letters, digits, '.', '_', '-'."""

    def check(value: str) -> str:
        if not _HOST_RE.match(value):
            raise _bad(f"{what} must be letters, digits, '.', '_' or '-' (1 to 253), e.g. {example}")
        return value

    return check


def _terminals(value: Any) -> Any:
    # Writing on/off unquoted is a TOML syntax error, so true/false are accepted as the same choice.
    if value is True:
        return "on"
    if value is False:
        return "off"
    return value


def _uid_range(value: Any) -> Any:
    if not isinstance(value, (list, tuple)) or len(value) != 2 or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise _bad("must be two whole numbers [first, last], e.g. [200000, 299999]")
    lo, hi = value
    if lo < 1000 or hi > MAX_UID or lo > hi:
        raise _bad(f"must be [first, last] with 1000 <= first <= last <= {MAX_UID}, e.g. [200000, 299999]")
    return (lo, hi)


AbsolutePath = Annotated[Path, AfterValidator(_absolute)]
ListenAddress = Annotated[str, AfterValidator(_listen_address)]
PeerAddress = Annotated[str, AfterValidator(_peer_address)]


# ---------------------------------------------------------------- tables


_IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9._/:@-]*$")
_VOLUME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_NETWORKS = ("slirp4netns", "pasta", "none", "host")


def _image_name(value: str) -> str:
    if not isinstance(value, str) or not _IMAGE_RE.match(value) or len(value) > 255:
        raise _bad(f"{value!r} is not an image name; use lower-case registry/name:tag, "
                   f"e.g. \"localhost/pytorch:2.6\" or \"registry.lab:5000/team/base:1\"")
    return value


def _unique_images(value: list[str]) -> list[str]:
    seen = set()
    for v in value:
        if v in seen:
            raise _bad(f"{v!r} is listed twice; list each image once")
        seen.add(v)
    return value


TEMPLATE_RESOURCES = ("gpus", "vram", "cpus", "mem", "gpu_mode")
TEMPLATE_KEYS = ("image", "ports", "env", "command", "token_env", "url_path", *TEMPLATE_RESOURCES)


def _template_table(name: str, t: dict) -> dict:
    """A template's table form, checked: every key is one this node acts on."""
    from mtgpu.jobfile import JobFileError, parse_job_file  # the very rules mt-job flags follow

    where = f"template {name!r}"
    unknown = sorted(set(t) - set(TEMPLATE_KEYS))
    if unknown:
        raise _bad(f"{where}: unknown key(s) {', '.join(unknown)}; a template has " + ", ".join(TEMPLATE_KEYS))
    if "image" not in t:
        raise _bad(f'{where}: give its image, e.g. image = "localhost/jupyter:1"')
    _image_name(t["image"])
    ports = t.get("ports", [])
    if not isinstance(ports, list) or not all(type(p) is int and 1 <= p <= 65535 for p in ports) \
            or len(set(ports)) != len(ports):
        raise _bad(f"{where}: ports = {ports!r}; give distinct container ports 1-65535, e.g. ports = [8888]")
    env = t.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k)
                                            and isinstance(v, str) and "\n" not in v for k, v in env.items()):
        raise _bad(f"{where}: env must be a table of NAME = \"value\" (one-line values), e.g. env = {{ LANG = \"C.UTF-8\" }}")
    command = t.get("command", [])
    if isinstance(command, str):
        command = ["/bin/sh", "-c", command]
    if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
        raise _bad(f"{where}: command must be a string (run with /bin/sh -c) or a list of strings (argv)")
    token_env = t.get("token_env")
    if token_env is not None and (not isinstance(token_env, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", token_env)):
        raise _bad(f"{where}: token_env = {token_env!r}; name the variable that gets the secret token, "
                   'e.g. token_env = "JUPYTER_TOKEN"')
    url_path = t.get("url_path", "/")
    if not isinstance(url_path, str) or not url_path.startswith("/"):
        raise _bad(f'{where}: url_path = {url_path!r}; give a path from "/", e.g. url_path = "/lab"')
    resources = {k.replace("_", "-"): str(t[k]) for k in TEMPLATE_RESOURCES if k in t}
    try:
        parse_job_file("", resources)
    except JobFileError as e:
        raise _bad(f"{where}: {e}") from None
    return {**t, "ports": ports, "env": env, "command": command, "url_path": url_path}


def _templates(value: dict) -> dict:
    out = {}
    for name, t in value.items():
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", name):
            raise _bad(f"template name {name!r}: use letters, digits, '.', '_' and '-'")
        if isinstance(t, str):
            out[name] = _image_name(t)
        elif isinstance(t, dict):
            out[name] = _template_table(name, t)
        else:
            raise _bad(f"template {name!r}: give an image name or a table (image, ports, env, command, resources)")
    return out


def _idle_timeout(value: str) -> str:
    if value == "off":
        return value
    try:
        seconds = parse_duration(value)
    except UnitError as e:
        raise _bad(f"idle_timeout = {value!r}: {e}; give \"off\" or a duration such as \"2h\" or \"30m\"") from None
    if seconds < 10:
        raise _bad(f"idle_timeout = {value!r} is shorter than 10s; a workspace would be stopped while it starts")
    return value


def _volume_name(value: str) -> str:
    if not _VOLUME_RE.match(value):
        raise _bad(f"{value!r} is not a Podman volume name; use letters, digits, '.', '_' and '-', "
                   'e.g. "mtgpu-cache"')
    return value


def _network(value: str) -> str:
    if value not in _NETWORKS:
        raise _bad(f"{value!r} is not a network mode this node can give rootless containers; use one of "
                   + ", ".join(_NETWORKS))
    return value


def _feature_archives(value: dict) -> dict:
    """`features`: each key a Feature as devcontainer.json names one from a registry
    (registry/namespace/id[:tag]) or a URL, each once; each value an absolute path (the node
    reads and checks the archive itself at start: agent side, as root)."""
    from mtgpu.workspaces.features import feature_key

    seen: dict[str, str] = {}
    for ref in value:
        key = feature_key(ref)
        if key is None:
            raise _bad(f"{ref!r} is not a Feature from a registry or a URL; name it as devcontainer.json does, e.g. "
                       '"ghcr.io/devcontainers/features/node:1" = "/srv/mtgpu/features/node-1.tgz" (a local Feature, '
                       '"./NAME", is the tenant\'s own folder and needs no staging)')
        if key in seen:
            raise _bad(f"{ref!r} and {seen[key]!r} are the same Feature ({key}); stage each Feature once")
        seen[key] = ref
    return value


ImageName = Annotated[str, AfterValidator(_image_name)]


class ContainersConfig(BaseModel):
    """`[CONTAINERS]`: container jobs on rootless Podman (docs/CONTAINERS.md). The keys
    `templates`, `publish_ports` and `idle_timeout` are the workspaces' (docs/WORKSPACES.md)."""

    # Numbers and booleans are strict (no "yes" for true, no true for 1): TOML has real types.
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        False, strict=True, description="run container jobs (container=) on this node, on rootless Podman as the "
                                        "tenant; off: container= jobs are never placed here, and refused at submit "
                                        "when no node of the cluster has it on")
    templates: Annotated[dict[str, Any], AfterValidator(_templates)] = Field(
        default_factory=dict, description="workspace templates (mt-container create --template NAME): a name for "
                                          "an image, or a table with image, ports, env, command (a string for "
                                          "/bin/sh -c, or argv), token_env (a variable given a secret token, shown "
                                          "in `mt-container ports`), url_path and default resources (gpus, vram, "
                                          "cpus, mem, gpu_mode); the images are pre-staged like `images`"
    )
    images: Annotated[list[ImageName], AfterValidator(_unique_images)] = Field(
        default_factory=list, description="images the node pre-stages as root, once, as content-addressed archives "
                                          "(STATE_DIR/images; with HOME_LAYOUT = \"shared\" under "
                                          "TENANT_HOME_ROOT/.mtgpu-images for every node); a tenant's first use "
                                          "loads the archive into its own store")
    features: Annotated[dict[str, AbsolutePath], AfterValidator(_feature_archives)] = Field(
        default_factory=dict, description="Dev Container Features from a registry or a URL that devcontainer.json files "
                                          "may name, each staged as its archive (what the registry serves: a tar or "
                                          "tar.gz of the Feature's folder, devcontainer-feature.json and install.sh at "
                                          "its root), a file of root's that no one else may write; read and checked at "
                                          "start (a missing, unreadable or damaged archive stops the node), e.g. "
                                          '{ "ghcr.io/devcontainers/features/node:1" = "/srv/mtgpu/features/node-1.tgz" }')
    registry_auth_file: AbsolutePath | None = Field(
        None, description="credentials (containers-auth.json) for pulling `images` from private registries; must "
                          "be readable by root only; tenants never see them")
    cache_volume: Annotated[str, AfterValidator(_volume_name)] = Field(
        "mtgpu-cache", description="the name of each tenant's persistent cache volume, made on first use and "
                                   "mounted at /mtgpu-cache in every container of that tenant: PIP_CACHE_DIR, HF_HOME "
                                   "and TORCH_HOME point into it, so pip wheels and Hugging Face and torch models "
                                   "are downloaded once per tenant, not once per container")
    network: Annotated[str, AfterValidator(_network)] = Field(
        "slirp4netns", description="the network mode of one-node container jobs (gangs, nodes=N, always use the "
                                   "host network so the rendezvous port is reachable)"
    )
    publish_ports: bool = Field(
        True, strict=True, description="publish workspace ports on this node's loopback, each reachable only by "
                                       "its tenant (and root); off: a workspace that asks for ports is refused")
    allow_user_images: bool = Field(
        False, strict=True, description="also allow any image in the tenant's own store (mt-podman pull, "
                                        "podman load)")
    idle_timeout: Annotated[str, AfterValidator(_idle_timeout)] = Field(
        "off", description="stop a workspace with no session attached, no connection to its ports and no CPU or GPU "
                           "work for this long (its GPUs are released, its layer kept); \"off\" never")

    @property
    def idle_timeout_s(self) -> float | None:
        return None if self.idle_timeout == "off" else parse_duration(self.idle_timeout)

    def allowed_images(self) -> list[str]:
        """The images this node stages and offers: `images`, then the templates' images."""
        out = list(self.images)
        for t in self.templates.values():
            image = t if isinstance(t, str) else t["image"]
            if image not in out:
                out.append(image)
        return out


def _grace(value: str) -> str:
    try:
        seconds = parse_duration(value)
    except UnitError as e:
        raise _bad(f"vram_grace = {value!r}: {e}; give a duration such as \"30s\"") from None
    if not 1 <= seconds <= 3600:
        raise _bad(f"vram_grace = {value!r}: give 1s to 1h (how long a job may stay above its VRAM reservation)")
    return value


class GpuPolicyConfig(BaseModel):
    """`[GPU_POLICY]`: what the node does when a shared-mode job uses more VRAM than it
    reserved (docs/ISOLATION.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vram_overuse: Literal["stop", "warn", "off"] = Field(
        "stop", description="a shared-mode job above its vram= reservation for vram_grace: \"stop\" it (failed, "
                            "with the figures), \"warn\" in its reason, or \"off\"")
    vram_grace: Annotated[str, AfterValidator(_grace)] = Field(
        "30s", description="how long a job may stay above its VRAM reservation before vram_overuse applies")

    @property
    def vram_grace_s(self) -> float:
        return parse_duration(self.vram_grace)


def _duration_in(key: str, low: float, high: float, span: str, what: str):
    def check(value: str) -> str:
        try:
            seconds = parse_duration(value)
        except UnitError as e:
            raise _bad(f"{key} = {value!r}: {e}; give a duration such as \"30s\"") from None
        if not low <= seconds <= high:
            raise _bad(f"{key} = {value!r}: give {span} ({what})")
        return value
    return check


class PreemptionConfig(BaseModel):
    """`[PREEMPTION]`: guaranteed jobs stop opportunistic (`gpu-mode=oversubscribe`) ones
    that are in their way (docs/SCHEDULING.md "Preemption"). Read by the scheduler."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, strict=True, description="whether a guaranteed job that fits nowhere may stop "
                                                          "opportunistic jobs to fit (Slurm's PreemptMode=REQUEUE)")
    grace: Annotated[str, AfterValidator(_duration_in("grace", 1, 3600, "1s to 1h", "from SIGTERM to SIGKILL"))] = Field(
        "30s", description="a preempted job gets SIGTERM, then SIGKILL after this long (time to checkpoint)")
    max_per_window: int = Field(3, ge=1, le=1000, strict=True,
                                description="a job preempted this many times within `window` is not chosen again "
                                            "until the oldest of those leaves the window")
    window: Annotated[str, AfterValidator(_duration_in("window", 60, 7 * 86400, "1m to 7d", "the preemption count's window"))] = \
        Field("1h", description="see max_per_window")

    @property
    def grace_s(self) -> float:
        return parse_duration(self.grace)

    @property
    def window_s(self) -> float:
        return parse_duration(self.window)


class SimulatedGpu(BaseModel):
    """One `[[SIMULATED_GPUS]]` entry: `count` identical GPUs the simulated backend reports."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: Annotated[str, Field(min_length=1)] = Field(description='model name as a driver reports it, e.g. "H200"')
    vendor: Literal["nvidia", "amd", "intel"] = Field("nvidia", description="the GPU's vendor")
    vram: Annotated[int, BeforeValidator(_positive_size)] = Field(
        description='total GPU memory, e.g. "141GiB"; bytes after loading'
    )
    count: int = Field(1, ge=1, le=1024, strict=True, description="how many such GPUs this node has")
    used_vram: Annotated[int, BeforeValidator(_size)] = Field(
        0, description="memory shown as used by others (not by jobs); bytes after loading"
    )
    utilization: float = Field(0.0, ge=0, le=100, strict=True, description="utilization shown as background load, percent")

    @property
    def vram_bytes(self) -> int:
        return self.vram

    @property
    def used_vram_bytes(self) -> int:
        return self.used_vram

    @model_validator(mode="after")
    def _used_fits(self) -> "SimulatedGpu":
        if self.used_vram > self.vram:
            raise _cross([("used_vram", format_size(self.used_vram), f"must be at most vram ({format_size(self.vram)})")])
        return self


_INTERPRETER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$")


class PythonInterpreter(BaseModel):
    """One published Python environment. `name` is what `mt-python` lists; by default
    it comes from the path: `/opt/envs/torch` -> "torch", `/opt/py312/bin/python3` -> "py312"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="the name tenants pick it by")
    path: AbsolutePath = Field(description="the environment's directory or its python executable")

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and "name" not in data and isinstance(data.get("path"), str):
            p = PurePosixPath(data["path"])
            name = p.parent.parent.name if p.parent.name == "bin" and p.name.startswith("python") else p.name
            data = {**data, "name": name}
        return data

    @model_validator(mode="after")
    def _check_name(self) -> "PythonInterpreter":
        if not _INTERPRETER_NAME_RE.match(self.name):
            raise _cross([("name", self.name, "must be letters, digits, '.', '_', '+' or '-' (1 to 100)")])
        return self


def _interpreters_from_strings(value: Any) -> Any:
    if isinstance(value, list):
        return [{"path": item} if isinstance(item, str) else item for item in value]
    return value


def _unique_interpreter_names(value: list[PythonInterpreter]) -> list[PythonInterpreter]:
    seen: dict[str, int] = {}
    for i, interp in enumerate(value):
        if interp.name in seen:
            raise _bad(
                f"items {seen[interp.name]} and {i} are both named {interp.name!r}; "
                'give each a distinct name: { name = "torch", path = "/opt/envs/torch" }'
            )
        seen[interp.name] = i
    return value


def _unique_relays(value: list[str]) -> list[str]:
    if len(set(value)) != len(value):
        raise _bad(f"relays = {value!r} names a relay twice; list each once")
    return value


def _relay_listen(value: str) -> str:
    return value if value == "" else _listen_address(value)


class DirectLinkConfig(BaseModel):
    """`[DIRECTLINK]`: reaching this node through NAT with no open port (docs/DIRECTLINK.md).
    With no relay, nothing changes: clients and members reach LISTEN and SSH_LISTEN
    directly as before."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        True, strict=True, description="connect to `relays`, take tenants' sessions through them (SSH to "
                                       "this node's tenant sshd, the tenant API) and reach members that do not "
                                       "answer directly through them (cluster HTTP, Raft); off: no DirectLink at all")
    relays: Annotated[list[PeerAddress], AfterValidator(_unique_relays)] = Field(
        default_factory=list, description="relays (host:port of an `mtgpu-relay` or of a member's relay_listen) this "
                                          "node stays connected to, tried in order; clients are given the same list")
    relay_listen: Annotated[str, AfterValidator(_relay_listen)] = Field(
        "", description="also serve as a relay for this cluster on this address (TCP, and UDP for address "
                        "answers, on the same port): a member with a public address; \"\" none")


def _scraper_network(value: str) -> str:
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        raise _bad(f'must be an address or a network, e.g. "127.0.0.1", "10.0.0.0/24" or "::1" ({exc})') from None
    return value


_LOOPBACK = {4: ipaddress.ip_network("127.0.0.0/8"), 6: ipaddress.ip_network("::1/128")}


class MetricsConfig(BaseModel):
    """`[METRICS]`: who may read `GET /metrics` on LISTEN (docs/METRICS.md). LISTEN is
    also the tenant API, and the figures are cluster-wide usage, so scraping is off
    until an admin turns it on, and then open only to the scrapers' addresses."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, strict=True, description="serve GET /metrics (Prometheus) on LISTEN; off: it "
                                                          "answers 404 and says how to turn it on")
    allow: list[Annotated[str, AfterValidator(_scraper_network)]] = Field(
        default_factory=lambda: ["127.0.0.1", "::1"],
        description="addresses or networks (CIDR) that may scrape; anyone else gets 403. Default: this machine "
                    "only (a Prometheus on the node)")
    tenant_labels: bool = Field(False, strict=True, description="also export per-tenant series labelled with "
                                                                "tenant names (jobs by state, GPUs held); off: no "
                                                                "tenant or job name appears in /metrics")

    @property
    def allowed_networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return tuple(ipaddress.ip_network(a) for a in self.allow)

    def allows(self, host: str | None) -> bool:
        """Whether a scrape from `host` (the peer's address as the server saw it) is let in;
        an IPv4 address mapped into IPv6 counts as the IPv4 address."""
        try:
            address = ipaddress.ip_address(host or "")
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in n for n in self.allowed_networks if n.version == address.version)


# ---------------------------------------------------------------- the file


class Config(BaseModel):
    """One node's configuration (`/etc/mtgpu/mtgpu.toml`); unknown keys are rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    CLUSTER_MODE: Literal["standalone", "cluster"] = Field("standalone", description="standalone or cluster")
    CLUSTER_ID: Annotated[str, AfterValidator(_name("CLUSTER_ID", '"lab-a"'))] | None = Field(
        None,
        description="machines with the same id form one cluster; required in cluster mode",
        validate_default=True,
    )
    NODE_NAME: Annotated[str, AfterValidator(_name("NODE_NAME", '"gpu-node-3"'))] = Field(
        default_factory=socket.gethostname, description="this machine's name in the cluster (default: hostname)"
    )
    LISTEN: ListenAddress = Field("0.0.0.0:7070", description="address:port serving the cluster and clients")
    PEERS: list[PeerAddress] = Field(default_factory=list, description="addresses of other members to join through")
    CLUSTER_SECRET_FILE: AbsolutePath | None = Field(
        None, description="the cluster's shared secret (32+ characters); default STATE_DIR/cluster.secret"
    )
    STATE_DIR: AbsolutePath = Field(DEFAULT_STATE_DIR, description="durable state, journal, sockets")
    TENANT_HOME_ROOT: AbsolutePath = Field(Path("/home/mtgpu"), description="root of tenant home directories")
    HOME_LAYOUT: Literal["shared", "per-node"] = Field(
        "per-node", description="shared (one home on shared storage) or per-node"
    )
    DATASETS_DIRECTORIES: list[AbsolutePath] = Field(
        default_factory=list, description="published read-only to every tenant and container"
    )
    PYTHON_INTERPRETERS: Annotated[
        list[PythonInterpreter],
        BeforeValidator(_interpreters_from_strings),
        AfterValidator(_unique_interpreter_names),
    ] = Field(
        default_factory=list,
        description='prepared Python environments, published read-only: "/path" or { name = "...", path = "/path" }',
    )
    USER_DISK_LIMIT: Annotated[int | None, BeforeValidator(_optional_positive_size)] = Field(
        None, description='per-tenant disk quota, e.g. "200GiB"; bytes after loading; none when absent'
    )
    JOB_RETENTION_DAYS: float = Field(30.0, gt=0, strict=True, description="finished jobs' records and outputs are kept this long")
    TENANT_RETENTION_DAYS: float = Field(180.0, gt=0, strict=True, description="inactive tenant accounts are kept this long")
    PERSISTENT_TERMINALS: Annotated[Literal["on", "optional", "off"], BeforeValidator(_terminals)] = Field(
        "on", description="SSH sessions in tmux: on, optional (user opts in) or off"
    )
    SESSION_GPUS: Literal["none", "all"] = Field(
        "none",
        description="(our addition) what tenants' sessions outside their jobs (SSH logins, their own podman) may open: "
                    "none (GPUs only through a job, a session attached to one or a workspace) or all (a single-user "
                    "workstation); docs/ISOLATION.md",
    )
    GPU_BACKEND: Literal["auto", "nvml", "amd", "intel", "simulated"] = Field(
        "auto", description="auto-detect (NVML, AMD SMI, Intel), one of them, or simulated (SIMULATED_GPUS)"
    )
    SSH_LISTEN: ListenAddress = Field("0.0.0.0:2222", description="where this node's tenant sshd listens")
    TENANT_UID_RANGE: Annotated[tuple[int, int], BeforeValidator(_uid_range)] = Field(
        (200000, 299999), description="UIDs/GIDs handed to tenants, the same on every node"
    )
    CONTAINERS: ContainersConfig = Field(default_factory=ContainersConfig, description="container workspaces and jobs")
    DIRECTLINK: DirectLinkConfig = Field(default_factory=DirectLinkConfig,
                                         description="connections through NAT via relays, end to end encrypted")
    METRICS: MetricsConfig = Field(default_factory=MetricsConfig,
                                   description="who may scrape GET /metrics on LISTEN, and tenant labels")
    GPU_POLICY: GpuPolicyConfig = Field(default_factory=GpuPolicyConfig,
                                        description="what is done to a shared-mode job above its VRAM reservation")
    PREEMPTION: PreemptionConfig = Field(default_factory=PreemptionConfig,
                                         description="when guaranteed jobs stop opportunistic ones in their way")
    SIMULATED_GPUS: list[SimulatedGpu] = Field(
        default_factory=list, description="the GPUs the simulated backend reports; none is a CPU-only node"
    )
    ACCOUNTS_ROOT: AbsolutePath = Field(
        Path("/"),
        description="(our addition) root of the account database tenants are created in: / for the machine's own "
                    "/etc/passwd; another folder (useradd --prefix) for a container image or a test",
    )
    MEMBER_DOWN_AFTER_S: float = Field(
        10.0, ge=3, le=3600, strict=False,
        description="(our addition) a cluster member that has not reported for this long is marked down; its jobs "
                    "are requeued; its job supervisors stop them one second sooner, counted from its last report the "
                    "scheduler took (self-fencing). At least 3: members report once a second",
    )
    JOB_REQUEUE: bool = Field(
        True, strict=True,
        description="(our addition, Slurm's JobRequeue) whether a batch job that says nothing (no requeue= directive, "
                    "no sbatch --requeue/--no-requeue) may be requeued when it is interrupted: its member is marked "
                    "down, its supervisor fenced it, or its machine restarted under it; applied by the member that "
                    "takes the submission (set it alike on every member). A job whose supervisor died while its "
                    "processes ran on is never requeued: it may have run to its end",
    )
    JOIN_TIMEOUT_S: float = Field(
        60.0, gt=0, le=86400, strict=False,
        description="(our addition) how long a member that joins through PEERS keeps trying before it gives up and "
                    "says why (each failed attempt is logged with what every peer answered)",
    )
    ADMIN_GROUP: Annotated[str, AfterValidator(_name("ADMIN_GROUP", '"mtgpu-admin"'))] = Field(
        "mtgpu-admin",
        description="(not in DESIGN §2, our addition) members of this OS group are admins and see all jobs",
    )

    @field_validator("CLUSTER_ID")
    @classmethod
    def _id_in_cluster_mode(cls, value: str | None, info: ValidationInfo) -> str | None:
        # A field validator (CLUSTER_MODE is declared first, so it is in info.data) rather
        # than a model validator, so this is reported together with every other problem.
        if value is None and info.data.get("CLUSTER_MODE") == "cluster":
            raise _bad('is required when CLUSTER_MODE = "cluster", e.g. CLUSTER_ID = "lab-a"')
        return value

    @model_validator(mode="after")
    def _directlink_needs_a_cluster(self) -> "Config":
        dl = self.DIRECTLINK
        if self.CLUSTER_MODE != "cluster" and dl.enabled and (dl.relays or dl.relay_listen):
            raise _cross([("DIRECTLINK", "relays" if dl.relays else "relay_listen",
                           "DirectLink needs CLUSTER_MODE = \"cluster\" (its keys come from the cluster secret); "
                           "a machine alone is a cluster of one: set CLUSTER_MODE = \"cluster\" and a CLUSTER_ID")])
        return self

    @model_validator(mode="after")
    def _metrics_loopback_is_not_only_this_machine(self) -> "Config":
        # DirectLink hands tenants' sessions to LISTEN from loopback: with it, "127.0.0.1"
        # would let every tenant with a DirectLink session scrape, which `allow` does not say.
        dl, m = self.DIRECTLINK, self.METRICS
        loopback = [a for a, n in zip(m.allow, m.allowed_networks) if n.overlaps(_LOOPBACK[n.version])]
        if m.enabled and loopback and self.CLUSTER_MODE == "cluster" and dl.enabled and (dl.relays or dl.relay_listen):
            raise _cross([("METRICS", None, f"allow names {', '.join(loopback)} (loopback), which cannot be allowed with "
                           "[DIRECTLINK] relays or relay_listen: tenants' DirectLink sessions reach LISTEN from loopback too; "
                           "allow the scraper's own network address instead (e.g. \"10.0.0.5\")")])
        return self

    @model_validator(mode="after")
    def _resolve_defaults(self) -> "Config":
        if self.CLUSTER_SECRET_FILE is None:
            # Resolved once here so every reader sees the same path; frozen, hence object.__setattr__.
            object.__setattr__(self, "CLUSTER_SECRET_FILE", self.STATE_DIR / SECRET_FILE_NAME)
        return self

    # -------- derived values, in the units the rest of the code uses

    def listen_host_port(self) -> tuple[str, int]:
        """(host, port) of LISTEN; an IPv6 host comes without brackets."""
        return parse_address(self.LISTEN)

    def ssh_listen_host_port(self) -> tuple[str, int]:
        return parse_address(self.SSH_LISTEN)

    def peer_host_ports(self) -> list[tuple[str, int]]:
        return [parse_address(p) for p in self.PEERS]

    @property
    def is_cluster(self) -> bool:
        return self.CLUSTER_MODE == "cluster"

    @property
    def socket_path(self) -> Path:
        """The local Unix socket tenants' commands talk to (DESIGN §4)."""
        return self.STATE_DIR / SOCKET_NAME

    @property
    def secret_file_path(self) -> Path:
        """CLUSTER_SECRET_FILE as resolved at load (STATE_DIR/cluster.secret when not given)."""
        return self.CLUSTER_SECRET_FILE or self.STATE_DIR / SECRET_FILE_NAME

    @property
    def user_disk_limit_bytes(self) -> int | None:
        return self.USER_DISK_LIMIT

    @property
    def job_retention_s(self) -> float:
        return self.JOB_RETENTION_DAYS * 86400.0

    @property
    def tenant_retention_s(self) -> float:
        return self.TENANT_RETENTION_DAYS * 86400.0


# Which model a dotted location (list indices dropped) points into: for unknown-key messages.
SECTION_MODELS: dict[tuple[str, ...], type[BaseModel]] = {
    (): Config,
    ("CONTAINERS",): ContainersConfig,
    ("GPU_POLICY",): GpuPolicyConfig,
    ("DIRECTLINK",): DirectLinkConfig,
    ("METRICS",): MetricsConfig,
    ("SIMULATED_GPUS",): SimulatedGpu,
    ("PYTHON_INTERPRETERS",): PythonInterpreter,
}

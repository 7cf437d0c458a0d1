"""Dev Container Features, built into the workspace's image as the specification says: each
Feature is a folder with a `devcontainer-feature.json` (its `id`, `options` with their
defaults, `containerEnv`, ...) and an `install.sh`, which runs as root in the build with the
Feature's options as variables (the option's name in capitals, other characters `_`), the
user's choices over the defaults.

A Feature comes from the project's own folder (`"features": {"./my-feature": {}}`), or from a
registry (`ghcr.io/devcontainers/features/node:1`) or a URL where an admin staged its archive
on the node (`[CONTAINERS] features`, docs/CONTAINERS.md): no registry is reachable from a
node. One that is not staged is refused, naming it, the config key that stages it, and how
to bring it as a local one (docs/WORKSPACES.md).

`parse_feature_refs` is pure; `load_features` reads the folders (a staged Feature's is the one
its archive was unpacked into, by the `staged` function the caller gives); `feature_dockerfile`
and `stage_feature_context` make what `podman build` is given (mtgpu/cli/devcontainer.py runs it).
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cmp_to_key
from types import MappingProxyType

from mtgpu.workspaces.errors import DevContainerError, Problem
from mtgpu.workspaces.jsonc import JsoncError, loads_jsonc
from mtgpu.workspaces.runargs import cap_refused, security_opt_refused

METADATA = "devcontainer-feature.json"
INSTALL = "install.sh"
ENV_FILE = "devcontainer-features.env"
IN_IMAGE = "/tmp/mtgpu-features"
MAX_METADATA_BYTES = 256 * 1024
_ID = re.compile(r"^[a-zA-Z0-9_.-]+$")
# keys of devcontainer-feature.json that would need more than an image layer
_UNSUPPORTED = ("mounts", "entrypoint", "onCreateCommand", "updateContentCommand", "postCreateCommand",
                "postStartCommand", "postAttachCommand")


@dataclass(frozen=True)
class FeatureRef:
    """One entry of `features` (or of a Feature's `dependsOn`) as written: its key, its folder
    on the node and the options chosen. `source` is "local" (a folder next to devcontainer.json),
    "oci" (a registry: `resource` is registry/namespace/id, lower case, `version` its tag or
    sha256 digest) or "tarball" (a URL, `resource`); a staged one's `folder` is where its
    archive was unpacked and `digest` the archive's SHA-256, once `load_features` resolved it."""

    key: str
    folder: str
    options: Mapping[str, str | bool] = field(default_factory=lambda: MappingProxyType({}))
    source: str = "local"
    resource: str = ""
    version: str = ""
    digest: str = ""
    asked_by: str = ""  # the Feature whose dependsOn names it ("" for `features` itself)
    asked_in: str = ""  # where that dependsOn is, for a refusal: features.KEY.dependsOn

    @property
    def staged_key(self) -> str:
        """How `[CONTAINERS] features` names it (feature_key)."""
        return feature_key(self.key) or self.key


@dataclass(frozen=True)
class StagedFolder:
    """A staged Feature as the `staged` function of load_features gives it: the folder its
    archive was unpacked into, and the archive's SHA-256."""

    folder: str
    sha256: str


StagedFeatures = Callable[[FeatureRef], "StagedFolder | None"]

CONFIG_KEY = "[CONTAINERS] features"
_OCI_PATH = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$")
_OCI_VERSION = re.compile(r"^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$")


def oci_parts(text: str) -> tuple[str, str] | None:
    """(resource, version) of a Feature in a registry, as @devcontainers/cli's getRef reads it:
    lower-cased, `registry/namespace/id`, then `:tag` (`latest` when none) or `@sha256:HEX`;
    None when `text` is not one."""
    text = text.lower()
    if text.startswith((".", "/")) or "://" in text:
        return None
    if "@" in text:
        resource, _, digest = text.rpartition("@")
        algo, _, hex_ = digest.partition(":")
        if algo != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hex_):
            return None
        version = digest
    elif text.rfind(":") > text.rfind("/"):
        resource, _, version = text.rpartition(":")
        if not _OCI_VERSION.match(version):
            return None
    else:
        resource, version = text, "latest"
    parts = resource.split("/")
    if len(parts) < 3 or not parts[0] or not _OCI_PATH.match("/".join(parts[1:])):
        return None
    return resource, version


def feature_key(text: str) -> str | None:
    """The one spelling of a Feature from a registry or URL that `[CONTAINERS] features` and
    devcontainer.json are matched by: `registry/namespace/id:tag` (`@sha256:...`), lower case,
    `:latest` where no version is written; a URL as written. None: neither."""
    if text.startswith(("https://", "http://")):
        return text
    parts = oci_parts(text)
    if parts is None:
        return None
    resource, version = parts
    return f"{resource}@{version}" if version.startswith("sha256:") else f"{resource}:{version}"


def _remote_ref(key: str, options: object, where: str, problems: list[Problem], asked_by: str = "",
                asked_in: str = "") -> FeatureRef | None:
    options = _options(options, where, problems)
    if options is None:
        return None
    if key.startswith(("https://", "http://")):
        return FeatureRef(key, "", options, "tarball", key, asked_by=asked_by, asked_in=asked_in)
    parts = oci_parts(key)
    resource, version = parts if parts else (key, "")
    return FeatureRef(key, "", options, "oci", resource, version, asked_by=asked_by, asked_in=asked_in)


def _unstaged(ref: FeatureRef) -> str:
    where = "a URL" if ref.source == "tarball" or "://" in ref.key else "a registry"
    hint = _folder_hint(ref.key)
    stage = (f'an admin can stage its archive on this node ({CONFIG_KEY} = {{ "{ref.staged_key}" = '
             '"/path/to/feature.tgz" }, docs/CONTAINERS.md)')
    if ref.asked_by:
        return (f"the Feature {ref.asked_by} depends on {ref.key}, from {where}, which this node cannot reach, and "
                f"it is not staged here: {stage}, or put that Feature's folder ({METADATA} and {INSTALL}) next to "
                f'devcontainer.json, for instance .devcontainer/{hint}, and name it "./{hint}" in this dependsOn')
    return (f"the Feature {ref.key} comes from {where}, which this node cannot reach, and it is not staged here: "
            f"{stage}, or put the Feature's folder ({METADATA} and {INSTALL}) next to devcontainer.json, "
            f'for instance .devcontainer/{hint}, and name it "./{hint}"')


@dataclass(frozen=True)
class Feature:
    """A local Feature read from its folder. `options_env` is what install.sh sees;
    `container_env` becomes the image's ENV."""

    ref: FeatureRef
    id: str
    options_env: Mapping[str, str]
    container_env: Mapping[str, str]
    cap_add: tuple[str, ...] = ()
    security_opt: tuple[str, ...] = ()
    installs_after: tuple[str, ...] = ()
    depends_on: tuple[FeatureRef, ...] = ()  # local ones resolved from the folder of devcontainer.json


def option_env_name(option: str) -> str:
    """The variable an option becomes, as the specification writes it:
    `str.replace(/[^\\w_]/g, '_').replace(/^[\\d_]+/g, '_').toUpperCase()`."""
    return re.sub(r"^[\d_]+", "_", re.sub(r"[^\w]", "_", option, flags=re.ASCII)).upper()


def parse_feature_refs(value: object, config_dir: str, *, staging: bool = False) -> tuple[FeatureRef, ...]:
    """The `features` object: local folders under the folder of devcontainer.json, and with
    `staging` (the caller can look up what the node staged) Features from a registry or a URL,
    which load_features resolves; their options strings or booleans (a string alone is
    `version`). Without `staging` a registry or URL Feature is refused here, naming it."""
    if value is None or value == {}:
        return ()
    if not isinstance(value, dict):
        raise DevContainerError.one("features", value, 'must be an object, such as {"./my-feature": {}}')
    problems: list[Problem] = []
    refs = []
    for key, options in value.items():
        k = f"features.{key}"
        if not key.startswith(("./", "../")):
            ref = _remote_ref(key, options, k, problems)
            if ref is not None and not staging:
                problems.append(Problem(k, key, _unstaged(ref)))
            elif ref is not None:
                refs.append(ref)
            continue
        ref = _local_ref(key, options, config_dir, k, problems)
        if ref is not None:
            refs.append(ref)
    if problems:
        raise DevContainerError(problems)
    return tuple(refs)


def _options(options: object, where: str, problems: list[Problem]) -> Mapping[str, str | bool] | None:
    if isinstance(options, str):
        options = {"version": options}
    if options is None:
        options = {}
    if not isinstance(options, dict) or not all(isinstance(v, (str, bool)) for v in options.values()):
        problems.append(Problem(where, options, 'options are an object of strings and booleans, such as {"version": "1"}'))
        return None
    return MappingProxyType(dict(options))


def _local_ref(key: str, options: object, config_dir: str, where: str, problems: list[Problem]) -> FeatureRef | None:
    """A local Feature named by `key` (relative to the folder of devcontainer.json, as the
    specification resolves it in `features` and in a Feature's `dependsOn`) with its options."""
    folder = posixpath.normpath(posixpath.join(config_dir, key))
    if not (folder + "/").startswith(config_dir.rstrip("/") + "/") or folder == config_dir:
        problems.append(Problem(where, key, "a local Feature is a folder under the folder of devcontainer.json "
                                            '(as the specification says), such as "./my-feature"'))
        return None
    opts = _options(options, where, problems)
    return None if opts is None else FeatureRef(key, folder, opts)


def _folder_hint(key: str) -> str:
    name = key.rstrip("/").rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0]
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name) or "feature"


MAX_FEATURES = 100  # with those they depend on: a Feature's dependsOn may name others, recursively


def load_features(refs: tuple[FeatureRef, ...], config_dir: str,
                  staged: StagedFeatures | None = None) -> tuple[Feature, ...]:
    """Each Feature's folder read (as the tenant: mt-container runs as the tenant), with the
    Features they `dependsOn` (recursively; one equal to a Feature already there, the same
    folder, or staged archive, with the same options, is that one), in the order they install
    (install_order). A Feature from a registry or a URL is read from the folder `staged` gives
    for it (its staged archive, unpacked); one `staged` has none for (or every one, without
    `staged`) is refused naming it."""
    problems: list[Problem] = []
    features: list[Feature] = []
    work, seen = list(refs), 0
    while work:
        ref = work.pop(0)
        if ref.source != "local":
            got = staged(ref) if staged is not None else None
            if got is None:
                problems.append(Problem(ref.asked_in or f"features.{ref.key}", ref.key, _unstaged(ref)))
                continue
            ref = replace(ref, folder=got.folder, digest=got.sha256)
        if any(_same(f.ref, ref) for f in features):
            continue
        seen += 1
        if seen > MAX_FEATURES:
            raise DevContainerError.one("features", None, f"more than {MAX_FEATURES} Features with those they depend "
                                                          "on; is a dependsOn asking for itself with new options?")
        try:
            f = _load_one(ref, config_dir, staging=staged is not None)
        except DevContainerError as e:
            problems.extend(e.problems)
            continue
        features.append(f)
        work.extend(f.depends_on)
    if problems:
        raise DevContainerError(problems)
    return install_order(features, config_dir)


def _load_one(ref: FeatureRef, config_dir: str, staging: bool = False) -> Feature:
    k = f"features.{ref.key}"
    meta_path = os.path.join(ref.folder, METADATA)
    if not os.path.isdir(ref.folder):
        raise DevContainerError.one(k, ref.key, f"no such folder: {ref.folder}; a local Feature is a folder with "
                                                f"{METADATA} and {INSTALL}")
    for need in (METADATA, INSTALL):
        if not os.path.isfile(os.path.join(ref.folder, need)):
            raise DevContainerError.one(k, ref.key, f"{os.path.join(ref.folder, need)} is missing: a Feature's folder "
                                                    f"holds {METADATA} and {INSTALL}")
    try:
        with open(meta_path, "rb") as f:
            meta = loads_jsonc(f.read(MAX_METADATA_BYTES + 1).decode("utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise DevContainerError.one(k, meta_path, f"cannot be read: {e}") from None
    except JsoncError as e:
        raise DevContainerError.one(f"{k} ({METADATA}) {e.where}", None, e.problem) from None
    if not isinstance(meta, dict):
        raise DevContainerError.one(k, meta_path, "must hold one JSON object")
    problems: list[Problem] = []
    fid = meta.get("id")
    if not isinstance(fid, str) or not _ID.match(fid):
        problems.append(Problem(f"{k}.id", fid, f"{METADATA} needs an id of letters, digits, '.', '_' and '-'"))
    declared = meta.get("options") or {}
    if not isinstance(declared, dict):
        problems.append(Problem(f"{k}.options", declared, f"options in {METADATA} must be an object"))
        declared = {}
    env: dict[str, str] = {}
    for name, spec in declared.items():
        default = spec.get("default") if isinstance(spec, dict) else None
        if default is not None:
            env[option_env_name(name)] = _text(default)
    for name, chosen in ref.options.items():
        if name not in declared:
            known = ", ".join(declared) or "none"
            problems.append(Problem(f"{k}.{name}", chosen, f"the Feature has no option {name!r} (its options: {known})"))
            continue
        env[option_env_name(name)] = _text(chosen)
    container_env = meta.get("containerEnv") or {}
    if not isinstance(container_env, dict) or not all(isinstance(v, str) and "\n" not in v for v in container_env.values()):
        problems.append(Problem(f"{k}.containerEnv", container_env, "must be an object of one-line strings"))
        container_env = {}
    if meta.get("privileged"):
        problems.append(Problem(f"{k}.privileged", True, "a workspace runs unprivileged, as you; this Feature cannot be used"))
    for key in _UNSUPPORTED:
        if meta.get(key):
            problems.append(Problem(f"{k}.{key}", meta[key], f"a Feature's {key} is not supported here; remove it "
                                                             "from the Feature, or put it in devcontainer.json"))
    caps = _strings(meta.get("capAdd"), f"{k}.capAdd", problems)
    problems += [Problem(f"{k}.capAdd", c, why) for c in caps if (why := cap_refused(c))]
    opts = _strings(meta.get("securityOpt"), f"{k}.securityOpt", problems)
    problems += [Problem(f"{k}.securityOpt", o, why) for o in opts if (why := security_opt_refused(o))]
    after = _strings(meta.get("installsAfter"), f"{k}.installsAfter", problems)
    depends = _depends_on(meta.get("dependsOn"), fid if isinstance(fid, str) else ref.key, config_dir, k, problems,
                          staging)
    if problems:
        raise DevContainerError(problems)
    return Feature(ref, fid, MappingProxyType(env), MappingProxyType(dict(container_env)), caps, opts, after, depends)


def _depends_on(value: object, name: str, config_dir: str, k: str, problems: list[Problem],
                staging: bool = False) -> tuple[FeatureRef, ...]:
    """A Feature's `dependsOn` (an object like `features`): local Features, resolved from the
    folder of devcontainer.json, and from a registry or a URL (load_features resolves those
    where the node staged them; without `staging` they are refused here, naming them)."""
    if value is None or value == {}:
        return ()
    if not isinstance(value, dict):
        problems.append(Problem(f"{k}.dependsOn", value, 'must be an object like "features", such as {"./other": {}}'))
        return ()
    refs = []
    for key, options in value.items():
        if not key.startswith(("./", "../")):
            dep = _remote_ref(key, options, f"{k}.dependsOn.{key}", problems, asked_by=name, asked_in=f"{k}.dependsOn")
            if dep is not None and not staging:
                problems.append(Problem(f"{k}.dependsOn", key, _unstaged(dep)))
                continue
        else:
            dep = _local_ref(key, options, config_dir, f"{k}.dependsOn.{key}", problems)
        if dep is not None:
            refs.append(dep)
    return tuple(refs)


def _text(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _strings(value: object, key: str, problems: list[Problem]) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(Problem(key, value, "must be a list of strings"))
        return ()
    return tuple(value)


def install_order(features: list[Feature], config_dir: str) -> tuple[Feature, ...]:
    """The order the specification gives (feature-dependencies.md, "round-based sorting", as
    @devcontainers/cli computes it): in rounds, every Feature whose `dependsOn` (the equal
    Feature) and `installsAfter` (a Feature of that folder, registry resource or id in the set;
    one naming no Feature to install is no dependency) are installed already, each round
    sorted as the reference's compareTo sorts (_compare). A round with nothing to install is
    a cycle, refused naming the Features."""
    soft = {id(f): [g for g in features if g is not f and any(_names(a, g, config_dir) for a in f.installs_after)]
            for f in features}
    left, order = list(features), []
    while left:
        ready = [f for f in left if all(any(_same(g.ref, d) for g in order) for d in f.depends_on)
                 and all(any(g is h for h in order) for g in soft[id(f)])]
        if not ready:
            names = ", ".join(f.ref.key for f in left)
            raise DevContainerError.one("features", names, (
                f"the Features {names} wait for each other (dependsOn, installsAfter), so no order installs them; "
                "drop one of those dependencies"))
        ready.sort(key=cmp_to_key(_compare))
        order += ready
        left = [f for f in left if not any(f is r for r in ready)]
    return tuple(order)


def _same(a: FeatureRef, b: FeatureRef) -> bool:
    """Feature equality as the reference has it: the same folder (local), archive (a staged
    registry Feature: its digest stands for the manifest's) or URL, with the same options."""
    if a.source != b.source or dict(a.options) != dict(b.options):
        return False
    if a.source == "local":
        return a.folder == b.folder
    if a.source == "oci":
        if a.digest and b.digest:
            return a.digest == b.digest
        return (a.resource, a.version) == (b.resource, b.version)
    return a.resource == b.resource


def _names(entry: str, f: Feature, config_dir: str) -> bool:
    """Whether an `installsAfter` entry names `f`: its folder (a ./ or ../ path, from the
    folder of devcontainer.json, as the reference resolves it), its registry resource (any
    version, as the reference's satisfiesSoftDependency), its URL, or its id."""
    if entry.startswith(("./", "../")):
        return f.ref.source == "local" and posixpath.normpath(posixpath.join(config_dir, entry)) == f.ref.folder
    if f.ref.source == "oci":
        parts = oci_parts(entry)
        return parts is not None and parts[0] == f.ref.resource
    if f.ref.source == "tarball":
        return entry == f.ref.resource
    return entry == f.id


def _compare(a: Feature, b: Feature) -> int:
    """The reference's compareTo for two Features of one round: of different sources, by the
    keys as written; local ones by folder, then options; registry ones by registry/namespace,
    id, tag, options, then digest; URLs by URL, then options (strings as Node's localeCompare)."""
    ra, rb = a.ref, b.ref
    if ra.source != rb.source:
        return _locale_cmp(ra.key, rb.key)
    if ra.source == "local":
        return _locale_cmp(ra.folder, rb.folder) or _options_cmp(ra, rb)
    if ra.source == "tarball":
        return _locale_cmp(ra.resource, rb.resource) or _options_cmp(ra, rb)
    if ra.digest == rb.digest and not _options_cmp(ra, rb):
        return 0
    space_a, _, id_a = ra.resource.rpartition("/")
    space_b, _, id_b = rb.resource.rpartition("/")
    tags = (ra.version, rb.version) if not any(v.startswith("sha256:") for v in (ra.version, rb.version)) else ("", "")
    return (_locale_cmp(space_a, space_b) or _locale_cmp(id_a, id_b) or _locale_cmp(*tags)
            or _options_cmp(ra, rb) or _locale_cmp(ra.digest, rb.digest))


def _options_cmp(a: FeatureRef, b: FeatureRef) -> int:
    ka, kb = sorted(a.options.items(), key=str), sorted(b.options.items(), key=str)
    return (ka > kb) - (ka < kb) if all(isinstance(v, str) for _, v in ka + kb) else (str(ka) > str(kb)) - (str(ka) < str(kb))


def _locale_cmp(a: str, b: str) -> int:
    ka, kb = _collation_key(a), _collation_key(b)
    return (ka > kb) - (ka < kb)


# Node's String.prototype.localeCompare (ICU's root collation) on what folder names hold:
# ' ' < '_' < '-' < '.' < '/' < digits < letters (checked with Node 20), letters without case first,
# then lower before upper.
_PUNCTUATION = {c: i for i, c in enumerate(' _-,;:!?.\'"()[]{}@*/\\&#%`^+<=>|~$')}  # as Node orders them


def _collation_key(text: str) -> tuple:
    def primary(c: str) -> tuple[int, object]:
        if c in _PUNCTUATION:
            return (0, _PUNCTUATION[c])
        if c.isdigit():
            return (1, c)
        if c.isalpha():
            return (2, c.casefold())
        return (0, 100 + ord(c))
    return tuple(primary(c) for c in text), tuple(c.isupper() for c in text)


def _folder_in_context(i: int, f: Feature) -> str:
    return f"{i}-{f.id}"


def feature_dockerfile(base: str, features: tuple[Feature, ...], image_user: str) -> str:
    """The Dockerfile that installs `features` on `base`, each install.sh as root with its
    options, then the image's own user again."""
    lines = [f"FROM {base}", "USER root"]
    for i, f in enumerate(features):
        d = _folder_in_context(i, f)
        lines += [f"COPY {d}/ {IN_IMAGE}/{d}/",
                  f"RUN cd {IN_IMAGE}/{d} && chmod +x ./{INSTALL} && set -a && . ./{ENV_FILE} && set +a "
                  f"&& ./{INSTALL} && cd / && rm -rf {IN_IMAGE}/{d}"]
        for k, v in f.container_env.items():
            escaped = v.replace("\\", "\\\\").replace('"', '\\"')
            lines.append(f'ENV {k}="{escaped}"')
    if image_user and image_user not in ("root", "0", "0:0"):
        lines.append(f"USER {image_user}")
    return "\n".join(lines) + "\n"


def stage_feature_context(features: tuple[Feature, ...], dest: str, *, remote_user: str, container_user: str) -> None:
    """Copy each Feature's folder into `dest` (the build context) with the variables its
    install.sh reads: its options and the users the specification names."""
    for i, f in enumerate(features):
        d = os.path.join(dest, _folder_in_context(i, f))
        shutil.copytree(f.ref.folder, d, symlinks=True)
        env = dict(f.options_env)
        env.update({"_REMOTE_USER": remote_user, "_CONTAINER_USER": container_user})
        text = "".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items())
        for k in ("_REMOTE_USER", "_CONTAINER_USER"):  # their homes, from the image's /etc/passwd
            text += f"{k}_HOME=\"$(awk -F: -v u=\"${k}\" '$1 == u {{ print $6 }}' /etc/passwd)\"\n"
        with open(os.path.join(d, ENV_FILE), "w", encoding="utf-8") as out:
            out.write(text)

"""Dev Container Features from the project's own folder (`"features": {"./my-feature": {}}`),
built into the workspace's image as the specification says: each Feature is a folder with a
`devcontainer-feature.json` (its `id`, `options` with their defaults, `containerEnv`, ...) and
an `install.sh`, which runs as root in the build with the Feature's options as variables
(the option's name in capitals, other characters `_`), the user's choices over the defaults.

A Feature named by a registry (`ghcr.io/devcontainers/features/node:1`) or a URL is refused,
naming it: no registry is reachable from a node, and none is staged for Features
(docs/WORKSPACES.md says how to bring such a Feature as a local one).

`parse_feature_refs` is pure; `load_features` reads the folders; `feature_dockerfile` and
`stage_feature_context` make what `podman build` is given (mtgpu/cli/devcontainer.py runs it).
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
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
    """One entry of `features` as written: its key, its folder on the node and the options chosen."""

    key: str
    folder: str
    options: Mapping[str, str | bool] = field(default_factory=lambda: MappingProxyType({}))


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
    depends_on: tuple[FeatureRef, ...] = ()  # local Features, resolved from the folder of devcontainer.json


def option_env_name(option: str) -> str:
    """The variable an option becomes, as the specification writes it:
    `str.replace(/[^\\w_]/g, '_').replace(/^[\\d_]+/g, '_').toUpperCase()`."""
    return re.sub(r"^[\d_]+", "_", re.sub(r"[^\w]", "_", option, flags=re.ASCII)).upper()


def parse_feature_refs(value: object, config_dir: str) -> tuple[FeatureRef, ...]:
    """The `features` object: every entry a local folder under the folder of
    devcontainer.json, its options strings or booleans (a string alone is `version`)."""
    if value is None or value == {}:
        return ()
    if not isinstance(value, dict):
        raise DevContainerError.one("features", value, 'must be an object, such as {"./my-feature": {}}')
    problems: list[Problem] = []
    refs = []
    for key, options in value.items():
        k = f"features.{key}"
        if not key.startswith(("./", "../")):
            where = "a URL" if "://" in key else "a registry"
            problems.append(Problem(k, key, (
                f"the Feature {key} comes from {where}, which this node cannot reach (none is staged here for "
                f"Features): put the Feature's folder ({METADATA} and {INSTALL}) next to devcontainer.json, "
                f'for instance .devcontainer/{_folder_hint(key)}, and name it "./{_folder_hint(key)}"')))
            continue
        ref = _local_ref(key, options, config_dir, k, problems)
        if ref is not None:
            refs.append(ref)
    if problems:
        raise DevContainerError(problems)
    return tuple(refs)


def _local_ref(key: str, options: object, config_dir: str, where: str, problems: list[Problem]) -> FeatureRef | None:
    """A local Feature named by `key` (relative to the folder of devcontainer.json, as the
    specification resolves it in `features` and in a Feature's `dependsOn`) with its options."""
    folder = posixpath.normpath(posixpath.join(config_dir, key))
    if not (folder + "/").startswith(config_dir.rstrip("/") + "/") or folder == config_dir:
        problems.append(Problem(where, key, "a local Feature is a folder under the folder of devcontainer.json "
                                            '(as the specification says), such as "./my-feature"'))
        return None
    if isinstance(options, str):
        options = {"version": options}
    if options is None:
        options = {}
    if not isinstance(options, dict) or not all(isinstance(v, (str, bool)) for v in options.values()):
        problems.append(Problem(where, options, 'options are an object of strings and booleans, such as {"version": "1"}'))
        return None
    return FeatureRef(key, folder, MappingProxyType(dict(options)))


def _folder_hint(key: str) -> str:
    name = key.rstrip("/").rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0]
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name) or "feature"


MAX_FEATURES = 100  # with those they depend on: a Feature's dependsOn may name others, recursively


def load_features(refs: tuple[FeatureRef, ...], config_dir: str) -> tuple[Feature, ...]:
    """Each Feature's folder read (as the tenant: mt-container runs as the tenant), with the
    local Features they `dependsOn` (recursively; one equal to a Feature already there, the
    same folder with the same options, is that one), in the order they install
    (install_order)."""
    problems: list[Problem] = []
    features: list[Feature] = []
    work, seen = list(refs), 0
    while work:
        ref = work.pop(0)
        if any(_same(f.ref, ref) for f in features):
            continue
        seen += 1
        if seen > MAX_FEATURES:
            raise DevContainerError.one("features", None, f"more than {MAX_FEATURES} Features with those they depend "
                                                          "on; is a dependsOn asking for itself with new options?")
        try:
            f = _load_one(ref, config_dir)
        except DevContainerError as e:
            problems.extend(e.problems)
            continue
        features.append(f)
        work.extend(f.depends_on)
    if problems:
        raise DevContainerError(problems)
    return install_order(features, config_dir)


def _load_one(ref: FeatureRef, config_dir: str) -> Feature:
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
    depends = _depends_on(meta.get("dependsOn"), fid if isinstance(fid, str) else ref.key, config_dir, k, problems)
    if problems:
        raise DevContainerError(problems)
    return Feature(ref, fid, MappingProxyType(env), MappingProxyType(dict(container_env)), caps, opts, after, depends)


def _depends_on(value: object, name: str, config_dir: str, k: str, problems: list[Problem]) -> tuple[FeatureRef, ...]:
    """A Feature's `dependsOn` (an object like `features`): local Features, resolved from the
    folder of devcontainer.json; one from a registry or a URL is refused, naming it."""
    if value is None or value == {}:
        return ()
    if not isinstance(value, dict):
        problems.append(Problem(f"{k}.dependsOn", value, 'must be an object like "features", such as {"./other": {}}'))
        return ()
    refs = []
    for key, options in value.items():
        if not key.startswith(("./", "../")):
            where = "a URL" if "://" in key else "a registry"
            problems.append(Problem(f"{k}.dependsOn", key, (
                f"the Feature {name} depends on {key}, from {where}, which this node cannot reach (none is staged "
                f"here for Features): put that Feature's folder ({METADATA} and {INSTALL}) next to "
                f'devcontainer.json, for instance .devcontainer/{_folder_hint(key)}, and name it "./{_folder_hint(key)}" '
                f"in this dependsOn")))
            continue
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
    Feature) and `installsAfter` (a Feature of that folder, or id, in the set; one naming no
    Feature to install is no dependency) are installed already, each round sorted by the
    Feature's folder as Node's localeCompare sorts it, then by its options. A round with
    nothing to install is a cycle, refused naming the Features."""
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
        ready.sort(key=lambda f: (_collation_key(f.ref.folder), sorted(f.ref.options.items(), key=str)))
        order += ready
        left = [f for f in left if not any(f is r for r in ready)]
    return tuple(order)


def _same(a: FeatureRef, b: FeatureRef) -> bool:
    """Feature equality for local Features, as the reference has it: the same folder, the same options."""
    return a.folder == b.folder and dict(a.options) == dict(b.options)


def _names(entry: str, f: Feature, config_dir: str) -> bool:
    """Whether an `installsAfter` entry names `f`: its folder (a ./ or ../ path, from the
    folder of devcontainer.json, as the reference resolves it), or its id."""
    if entry.startswith(("./", "../")):
        return posixpath.normpath(posixpath.join(config_dir, entry)) == f.ref.folder
    return entry == f.id


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

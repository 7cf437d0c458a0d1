"""The node's config at install: written from the flags only when there is none; an
existing one is validated with the server's own loader and never overwritten."""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import Config, ConfigError, config_from_dict, load_config
from ..config.schema import SECTION_MODELS
from .plan import Check, SetupRefused

# flag -> the config key it sets (DESIGN §2 names)
FLAG_KEYS = {
    "--cluster-id": "CLUSTER_ID",
    "--peers": "PEERS",
    "--listen": "LISTEN",
    "--node-name": "NODE_NAME",
    "--ssh-listen": "SSH_LISTEN",
    "--state-dir": "STATE_DIR",
    "--tenant-home-root": "TENANT_HOME_ROOT",
    "--gpu-backend": "GPU_BACKEND",
}


def parse_set(text: str) -> tuple[str, Any]:
    """`--set KEY=VALUE`: KEY a config key (`TABLE.key` inside a table), VALUE in TOML
    (`[420000, 429999]`, `true`, `"text"`); a bare word is taken as a string."""
    key, sep, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or not key:
        raise SetupRefused(f"--set {text!r}: give KEY=VALUE, e.g. --set 'TENANT_UID_RANGE=[420000, 429999]' "
                           "or --set CONTAINERS.enabled=true")
    parts = key.split(".")
    section, name = tuple(parts[:-1]), parts[-1]
    model = SECTION_MODELS.get(section)
    if model is None or len(parts) > 2 or name not in model.model_fields:
        tables = ", ".join(s[0] for s in SECTION_MODELS if len(s) == 1)
        raise SetupRefused(f"--set {text!r}: {key!r} is not a config key; give a key of DESIGN §2 "
                           f"(e.g. TENANT_UID_RANGE) or TABLE.key for the tables {tables}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


def settings_from_flags(flags: dict[str, Any], sets: list[tuple[str, Any]]) -> dict[str, Any]:
    """The config's keys from the install's flags (FLAG_KEYS, by flag) and --set pairs,
    nested for tables; --cluster-id implies CLUSTER_MODE = "cluster"."""
    settings: dict[str, Any] = {}
    if flags.get("--cluster-id") is not None:
        settings["CLUSTER_MODE"] = "cluster"
    for flag, key in FLAG_KEYS.items():
        if flags.get(flag) is not None:
            settings[key] = flags[flag]
    if flags.get("--peers") is not None and flags.get("--cluster-id") is None:
        raise SetupRefused("--peers needs --cluster-id ID: PEERS are the members of a cluster; give the cluster's "
                           "id, the same on every member")
    for key, value in sets:
        if "." in key:
            table, name = key.split(".", 1)
            settings.setdefault(table, {})[name] = value
        else:
            settings[key] = value
    if settings.get("GPU_BACKEND") == "simulated" and "SIMULATED_GPUS" not in settings:
        settings["SIMULATED_GPUS"] = [dict(DEFAULT_SIMULATED_GPUS)]  # a try-out node without GPUs
    return settings


# what `--gpu-backend simulated` without --set SIMULATED_GPUS=... gives (docs/INSTALL.md)
DEFAULT_SIMULATED_GPUS = {"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24GiB", "count": 2}


def validated(settings: dict[str, Any], source: str) -> Config:
    try:
        return config_from_dict(settings, source=source)
    except ConfigError as e:
        raise SetupRefused(f"the flags do not make a config that can be used (nothing was changed):\n{e}\n"
                           "fix the flag(s) named above and run again") from None


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (str, Path)):
        return json.dumps(str(v), ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML form for {v!r}")


def render_config(settings: dict[str, Any]) -> str:
    """The file written at install: the keys given, then each table; everything else keeps
    its default (DESIGN §2)."""
    lines = ["# The mtgpu node's config, written by `mtgpu-setup install` from its flags.",
             "# Keys and defaults: DESIGN.md section 2 (docs/INSTALL.md). `mtgpu-setup install` never",
             "# overwrites this file; edit it, then restart the service.", ""]
    lines += [f"{k} = {toml_value(v)}" for k, v in settings.items() if not isinstance(v, dict)]
    for table, values in settings.items():
        if isinstance(values, dict):
            lines += ["", f"[{table}]"] + [f"{k} = {toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


@dataclass
class ConfigPlan:
    """The config an install works with: the existing file (validated) or the one the flags
    make. `notes` name flags that differ from an existing config (which is kept)."""

    path: Path
    config: Config
    text: str | None  # what to write; None when the file exists
    notes: list[str] = field(default_factory=list)

    def check(self) -> Check:
        if self.text is None:
            return Check(True, f"{self.path} exists and is valid; it is kept as it is")
        if self.path.exists():
            return Check(True, f"{self.path} exists")
        return Check(False, "from the flags")

    def apply(self) -> str:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(self.text or "")
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.path)
        load_config(self.path)  # what was written is what the server will read
        return f"written from the flags ({len(self.text or '')} bytes)"


def plan_config(path: Path, settings: dict[str, Any], given: set[str]) -> ConfigPlan:
    """Validate the existing config at `path`, or the flags' config when there is none.
    `given`: the keys the admin set explicitly (compared with an existing config)."""
    flags_config = validated(settings, "the flags")
    if not path.exists():
        return ConfigPlan(path, flags_config, render_config(settings))
    try:
        existing = load_config(path)
    except ConfigError as e:
        raise SetupRefused(f"the existing config {path} cannot be used; it is kept as it is and nothing was changed:\n"
                           f"{e}\nfix the key(s) named above in {path} (or move the file away to have one written "
                           "from the flags), then run mtgpu-setup install again") from None
    notes = []
    for key in sorted(given):
        if "." in key:
            table, name = key.split(".", 1)
            mine, theirs = getattr(getattr(flags_config, table), name), getattr(getattr(existing, table), name)
        else:
            mine, theirs = getattr(flags_config, key), getattr(existing, key)
        if mine != theirs:
            notes.append(f"{key}: the flags say {_plain(mine)} but {path} says {_plain(theirs)}; the existing config "
                         "is kept (edit it, or `mtgpu-setup uninstall --purge` to start over)")
    return ConfigPlan(path, existing, None, notes)


def _plain(value: Any) -> str:
    if isinstance(value, tuple):
        value = list(value)
    return toml_value(value) if isinstance(value, (str, Path, list, bool, int, float)) else repr(value)

"""Finding, reading and validating the config file; every problem becomes a ConfigError.

The path is the argument, else `MTGPU_CONFIG`, else `/etc/mtgpu/mtgpu.toml`.
A missing file is always an error (there is no silent all-defaults mode: a node
started without its config would join no cluster and say nothing). Validation
problems are all collected and reported together, one line each, naming the
dotted key (`SIMULATED_GPUS[1].vram`), the value and what is allowed.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from mtgpu.config.schema import CROSS_ERROR_TYPE, SECTION_MODELS, Config

DEFAULT_CONFIG_PATH = Path("/etc/mtgpu/mtgpu.toml")
CONFIG_ENV_VAR = "MTGPU_CONFIG"


class ConfigError(Exception):
    """A config that cannot be used. `problems` holds one line per problem;
    `source` is the file (or "<dict>"); `line`/`column` locate a TOML syntax error."""

    def __init__(self, problems: list[str], source: str = "<config>", *, line: int | None = None, column: int | None = None):
        self.problems = list(problems)
        self.source = source
        self.line = line
        self.column = column
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(f"{self.source}: {p}" for p in self.problems)

    def __reduce__(self):
        return (_rebuild_config_error, (self.problems, self.source, self.line, self.column))


def _rebuild_config_error(problems, source, line, column) -> ConfigError:
    return ConfigError(problems, source, line=line, column=column)


# ---------------------------------------------------------------- finding and reading


def resolve_config_path(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Path:
    """The config path a command uses: `path`, else $MTGPU_CONFIG, else the default."""
    return _resolve(path, env)[0]


def _resolve(path: str | Path | None, env: Mapping[str, str] | None) -> tuple[Path, str]:
    if path is not None and str(path) != "":
        return Path(path), "argument"
    environ = os.environ if env is None else env
    from_env = environ.get(CONFIG_ENV_VAR)
    if from_env:
        return Path(from_env), "env"
    return DEFAULT_CONFIG_PATH, "default"


_TOML_POSITION_RE = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Read and validate the config file; raises ConfigError with every problem found."""
    config_path, how = _resolve(path, env)
    source = str(config_path)
    try:
        raw = config_path.read_bytes()
    except FileNotFoundError:
        if how == "default":
            problem = (
                "no config file here; create one with `mtgpu-setup install --yes`, "
                f"or pass --config PATH or set {CONFIG_ENV_VAR}"
            )
        elif how == "env":
            problem = f"{CONFIG_ENV_VAR} names this file but it does not exist; fix {CONFIG_ENV_VAR} or unset it"
        else:
            problem = "the config file does not exist; check the path given to --config"
        raise ConfigError([problem], source) from None
    except OSError as exc:
        raise ConfigError([f"cannot read the config file: {exc.strerror or exc}"], source) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([f"not UTF-8 text (bad byte at offset {exc.start}); save the file as UTF-8"], source) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        m = _TOML_POSITION_RE.search(message)
        if m:
            line, column = int(m.group(1)), int(m.group(2))
            detail = message[: m.start()]
            raise ConfigError(
                [f"line {line}, column {column}: TOML syntax error: {detail}"], source, line=line, column=column
            ) from None
        raise ConfigError([f"TOML syntax error: {message}"], source) from None
    return config_from_dict(data, source=source)


def config_from_dict(d: Mapping[str, Any], source: str = "<dict>") -> Config:
    """Validate an already-parsed config (tests, the embedded demo config)."""
    if not isinstance(d, Mapping):
        raise ConfigError([f"the config must be a table of keys, not {type(d).__name__}"], source)
    try:
        return Config.model_validate(dict(d))
    except ValidationError as exc:
        raise ConfigError(validation_problems(exc), source) from None


# ---------------------------------------------------------------- pydantic errors -> our lines


_PLAIN_KEY_RE = re.compile(r"^[A-Za-z0-9_-]+$")


def dotted_key(loc: tuple[Any, ...]) -> str:
    """('SIMULATED_GPUS', 1, 'vram') -> 'SIMULATED_GPUS[1].vram'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY_RE.match(str(part)):
            out += f".{part}" if out else str(part)
        else:
            out += f"[{json.dumps(str(part))}]"
    return out


def _show(value: Any) -> str:
    """A value as it would look in TOML, shortened for one line."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (str, int, float, list, dict)):
        try:
            text = json.dumps(value, default=str, ensure_ascii=False)
        except (TypeError, ValueError):
            text = repr(value)
    else:
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _allowed_keys(model: type[BaseModel]) -> list[str]:
    return list(model.model_fields)


def _unknown_key(loc: tuple[Any, ...]) -> str:
    section = tuple(p for p in loc[:-1] if not isinstance(p, int))
    model = SECTION_MODELS.get(section)
    key = str(loc[-1])
    if model is None:
        return f"unknown key '{dotted_key(loc)}'"
    allowed = _allowed_keys(model)
    by_lower = {a.lower(): a for a in allowed}
    close = difflib.get_close_matches(key.lower(), list(by_lower), n=1, cutoff=0.6)
    hint = f"did you mean '{by_lower[close[0]]}'? " if close else ""
    return f"unknown key '{dotted_key(loc)}' ({hint}allowed: {', '.join(allowed)})"


_TYPE_MESSAGES = {
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": 'must be a string in quotes, e.g. "text"',
    "list_type": 'must be a list, e.g. ["a", "b"]',
    "dict_type": "must be a table",
    "model_type": "must be a table",
    "model_attributes_type": "must be a table",
    "path_type": 'must be a path string, e.g. "/var/lib/mtgpu"',
    "finite_number": "must be a finite number",
}


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _message(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind in _TYPE_MESSAGES:
        return _TYPE_MESSAGES[kind]
    if kind == "literal_error":
        return f"allowed: {ctx.get('expected', '')}".replace("'", '"')
    if kind == "greater_than":
        return f"must be more than {_number(ctx.get('gt'))}"
    if kind == "greater_than_equal":
        return f"must be at least {_number(ctx.get('ge'))}"
    if kind == "less_than":
        return f"must be less than {_number(ctx.get('lt'))}"
    if kind == "less_than_equal":
        return f"must be at most {_number(ctx.get('le'))}"
    if kind == "string_too_short":
        return "must not be empty"
    return str(error.get("msg", "is not allowed"))


def validation_problems(exc: ValidationError) -> list[str]:
    """One line per problem: `KEY = value: what is allowed` (or `KEY: ...` without a value)."""
    problems: list[str] = []
    for error in exc.errors(include_url=False):
        loc = tuple(error.get("loc", ()))
        kind = error["type"]
        if kind == "extra_forbidden":
            problems.append(_unknown_key(loc))
        elif kind == "missing":
            problems.append(f"{dotted_key(loc)}: is required but missing")
        elif kind == CROSS_ERROR_TYPE:
            for rel_key, value, message in (error.get("ctx") or {}).get("problems", []):
                key = dotted_key(loc + (rel_key,))
                problems.append(f"{key}: {message}" if value is None else f"{key} = {_show(value)}: {message}")
        elif error.get("input") is None:
            problems.append(f"{dotted_key(loc) or 'the config'}: {_message(error)}")
        else:
            key = dotted_key(loc) or "the config"
            problems.append(f"{key} = {_show(error.get('input'))}: {_message(error)}")
    return problems

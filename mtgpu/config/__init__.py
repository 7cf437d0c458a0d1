"""The node's TOML config (DESIGN §2): schema.py is the pydantic model, loader.py finds and reads it."""

from mtgpu.config.loader import (
    CONFIG_ENV_VAR,
    DEFAULT_CONFIG_PATH,
    ConfigError,
    config_from_dict,
    load_config,
    resolve_config_path,
)
from mtgpu.config.schema import Config, ContainersConfig, PythonInterpreter, SimulatedGpu, parse_address

__all__ = [
    "CONFIG_ENV_VAR",
    "DEFAULT_CONFIG_PATH",
    "Config",
    "ConfigError",
    "ContainersConfig",
    "PythonInterpreter",
    "SimulatedGpu",
    "config_from_dict",
    "load_config",
    "parse_address",
    "resolve_config_path",
]

"""Workspaces: long-running containers made from a template, an image or a
devcontainer.json (issue 11). For now, the devcontainer.json reader and the idle-culling decision (idle.py)."""

from mtgpu.workspaces.devcontainer import (
    CONFIG_LOCATIONS,
    Build,
    DevContainer,
    load_devcontainer,
    locate_devcontainer,
    parse_devcontainer,
)
from mtgpu.workspaces.errors import DevContainerError, Problem
from mtgpu.workspaces.mounts import Mount
from mtgpu.workspaces.sections import LIFECYCLE_HOOKS, AppPort, Command, HostRequirements, Reservation

__all__ = [
    "CONFIG_LOCATIONS",
    "LIFECYCLE_HOOKS",
    "AppPort",
    "Build",
    "Command",
    "DevContainer",
    "DevContainerError",
    "HostRequirements",
    "Mount",
    "Problem",
    "Reservation",
    "load_devcontainer",
    "locate_devcontainer",
    "parse_devcontainer",
]

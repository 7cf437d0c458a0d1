"""The host's CPUs and memory, as the scheduler sees them next to the GPUs."""

from __future__ import annotations

import os

import psutil

from mtgpu.model.gpu import HostInfo


def sample_host() -> HostInfo:
    """Measures now, without blocking: CPU utilization is since the previous call (0.0 on the first)."""
    mem = psutil.virtual_memory()
    return HostInfo(
        cpu_count=psutil.cpu_count(logical=True) or os.cpu_count() or 1,
        cpu_util_pct=float(psutil.cpu_percent(interval=None)),
        mem_total_bytes=int(mem.total),
        mem_available_bytes=int(mem.available),
    )

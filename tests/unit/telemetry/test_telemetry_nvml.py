"""Our translation of NVML's answers, with a stand-in for pynvml (no NVIDIA GPU here)."""

from __future__ import annotations

import types

import pynvml
import pytest

from mtgpu.agent.telemetry import TelemetryError, nvml
from mtgpu.model.gpu import GpuProcess

GiB = 1024**3


def make_fake_nvml(count=2, *, unsupported=(), lost=(), fail_init=False):
    """pynvml's functions used by the backend; real pynvml exception classes."""
    mod = types.SimpleNamespace(
        NVMLError=pynvml.NVMLError,
        NVMLError_NotSupported=pynvml.NVMLError_NotSupported,
        NVMLError_NoPermission=pynvml.NVMLError_NoPermission,
        shutdowns=0,
    )

    def check(name, handle=None):
        if name in unsupported:
            raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if handle in lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    def init():
        if fail_init:
            raise pynvml.NVMLError_LibraryNotFound(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    def shutdown():
        mod.shutdowns += 1

    def memory(h):
        check("memory", h)
        return types.SimpleNamespace(total=80 * GiB, used=(h + 1) * GiB, free=0)

    def utilization(h):
        check("utilization", h)
        return types.SimpleNamespace(gpu=30 + h, memory=5)

    def compute(h):
        check("compute", h)
        return [types.SimpleNamespace(pid=100, usedGpuMemory=GiB), types.SimpleNamespace(pid=101, usedGpuMemory=None)]

    def graphics(h):
        check("graphics", h)
        return [types.SimpleNamespace(pid=100, usedGpuMemory=GiB // 2)]

    def process_name(pid):
        if pid == 101:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return f"proc-{pid}"

    mod.nvmlInit = init
    mod.nvmlShutdown = shutdown
    mod.nvmlDeviceGetCount = lambda: count
    mod.nvmlDeviceGetHandleByIndex = lambda i: i
    mod.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3"
    mod.nvmlDeviceGetUUID = lambda h: f"GPU-{h:04d}"
    mod.nvmlDeviceGetMemoryInfo = memory
    mod.nvmlDeviceGetUtilizationRates = utilization
    mod.nvmlDeviceGetComputeRunningProcesses = compute
    mod.nvmlDeviceGetGraphicsRunningProcesses = graphics
    mod.nvmlSystemGetProcessName = process_name
    return mod


def test_nvml_gpus_map_to_gpu_info():
    gpu0, gpu1 = nvml.NvmlBackend(make_fake_nvml()).sample()
    assert (gpu0.index, gpu0.vendor, gpu0.model, gpu0.uuid) == (0, "nvidia", "NVIDIA H100 80GB HBM3", "GPU-0000")
    assert (gpu0.vram_total_bytes, gpu0.vram_used_bytes, gpu0.utilization_pct) == (80 * GiB, GiB, 30.0)
    # usedGpuMemory None reads 0; a pid in both compute and graphics lists is counted once.
    assert gpu0.processes == [GpuProcess(100, GiB, "proc-100"), GpuProcess(101, 0, "")]
    assert gpu1.index == 1 and gpu1.vram_used_bytes == 2 * GiB


def test_unsupported_fields_read_as_zero_or_empty():
    [gpu] = nvml.NvmlBackend(make_fake_nvml(count=1, unsupported=("utilization", "graphics"))).sample()
    assert gpu.utilization_pct == 0.0 and [p.pid for p in gpu.processes] == [100, 101]


def test_a_lost_gpu_is_left_out_and_the_others_still_report(caplog):
    backend = nvml.NvmlBackend(make_fake_nvml(count=3, lost=(1,)))
    assert [g.index for g in backend.sample()] == [0, 2]
    assert [g.index for g in backend.sample()] == [0, 2]
    assert sum("left out" in r.getMessage() for r in caplog.records) == 1


def test_close_shuts_nvml_down_once():
    fake = make_fake_nvml()
    backend = nvml.NvmlBackend(fake)
    backend.close()
    backend.close()
    assert fake.shutdowns == 1


def test_available_needs_init_and_a_gpu():
    assert nvml.available(make_fake_nvml())
    assert not nvml.available(make_fake_nvml(count=0))
    assert "did not initialize" in nvml.unavailable_reason(make_fake_nvml(fail_init=True))


def test_opening_without_a_driver_is_a_telemetry_error():
    with pytest.raises(TelemetryError, match="NVIDIA driver"):
        nvml.NvmlBackend(make_fake_nvml(fail_init=True))


def test_device_nodes_come_from_nvmls_minor_numbers_and_fall_back_to_the_index():
    fake = make_fake_nvml(count=3)

    def minor(h):
        if h == 2:
            raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 7 - h

    fake.nvmlDeviceGetMinorNumber = minor
    backend = nvml.NvmlBackend(fake)
    assert backend.device_nodes() == {0: "/dev/nvidia7", 1: "/dev/nvidia6", 2: "/dev/nvidia2"}

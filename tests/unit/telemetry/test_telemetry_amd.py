"""Our translation of AMD SMI's answers, with a stand-in amdsmi module (the real one needs ROCm)."""

from __future__ import annotations

import sys
import types

import pytest

from mtgpu.agent.telemetry import TelemetryError, amd, open_backend
from mtgpu.model.gpu import GpuProcess

MiB = 1024 * 1024


class FakeAmdSmiException(Exception):
    pass


def make_fake_amdsmi(handles=("h0", "h1"), *, unsupported=(), fail_init=False, legacy_process_handles=False,
                     bdfs=None):
    """A module with amdsmi's documented functions and dict shapes (ROCm 6.x); `unsupported`
    names functions that raise as a GPU without that sensor does; `bdfs`: handle -> the PCI
    address amdsmi_get_gpu_device_bdf prints (default 0000:c1:00.0, 0000:c2:00.0, ...)."""
    bdfs = bdfs if bdfs is not None else {h: f"0000:{0xc1 + i:02x}:00.0" for i, h in enumerate(handles)}
    mod = types.ModuleType("amdsmi")
    mod.AmdSmiException = FakeAmdSmiException
    mod.calls = []

    def api(fn):
        def wrapper(*args):
            mod.calls.append(fn.__name__)
            if fn.__name__ in unsupported:
                raise FakeAmdSmiException(f"{fn.__name__}: AMDSMI_STATUS_NOT_SUPPORTED")
            return fn(*args)

        wrapper.__name__ = fn.__name__
        setattr(mod, fn.__name__, wrapper)
        return wrapper

    @api
    def amdsmi_init(*_flags):
        if fail_init:
            raise FakeAmdSmiException("AMDSMI_STATUS_INIT_ERROR")

    @api
    def amdsmi_shut_down():
        pass

    @api
    def amdsmi_get_processor_handles():
        return list(handles)

    @api
    def amdsmi_get_gpu_asic_info(h):
        return {"market_name": "AMD Instinct MI300X", "vendor_id": "0x1002", "device_id": "0x74a1"}

    @api
    def amdsmi_get_gpu_device_uuid(h):
        return f"uuid-{h}"

    @api
    def amdsmi_get_gpu_device_bdf(h):
        return bdfs[h]

    @api
    def amdsmi_get_gpu_vram_usage(h):
        return {"vram_total": 192 * 1024, "vram_used": 2048 if h == "h0" else 0}  # MiB

    @api
    def amdsmi_get_gpu_activity(h):
        return {"gfx_activity": 87 if h == "h0" else "N/A", "umc_activity": 10, "mm_activity": "N/A"}

    @api
    def amdsmi_get_gpu_process_list(h):
        if h != "h0":
            return []
        procs = [
            {"name": "python", "pid": 4242, "mem": 999, "memory_usage": {"gtt_mem": 1, "cpu_mem": 2, "vram_mem": 1024 * MiB}},
            {"name": "N/A", "pid": 77, "mem": 5 * MiB},
        ]
        return [("proc", p) for p in procs] if legacy_process_handles else procs

    @api
    def amdsmi_get_gpu_process_info(h, proc):
        return proc[1]

    return mod


@pytest.fixture
def fake_amdsmi(monkeypatch):
    mod = make_fake_amdsmi()
    monkeypatch.setitem(sys.modules, "amdsmi", mod)
    return mod


def test_amd_gpus_map_to_gpu_info_in_handle_order(fake_amdsmi):
    backend = amd.AmdSmiBackend()
    gpu0, gpu1 = backend.sample()
    assert backend.name == "amd"
    assert (gpu0.index, gpu0.vendor, gpu0.model, gpu0.uuid) == (0, "amd", "AMD Instinct MI300X", "uuid-h0")
    assert gpu0.vram_total_bytes == 192 * 1024 * MiB and gpu0.vram_used_bytes == 2048 * MiB
    assert gpu0.utilization_pct == 87.0
    assert gpu0.processes == [GpuProcess(4242, 1024 * MiB, "python"), GpuProcess(77, 5 * MiB, "")]
    assert (gpu1.index, gpu1.utilization_pct, gpu1.processes) == (1, 0.0, [])  # "N/A" reads as 0
    backend.close()
    assert fake_amdsmi.calls[-1] == "amdsmi_shut_down"


def test_static_facts_are_read_once_not_per_sample(fake_amdsmi):
    backend = amd.AmdSmiBackend()
    fake_amdsmi.calls.clear()
    backend.sample()
    assert "amdsmi_get_gpu_asic_info" not in fake_amdsmi.calls
    assert "amdsmi_get_gpu_device_uuid" not in fake_amdsmi.calls
    assert "amdsmi_get_gpu_device_bdf" not in fake_amdsmi.calls


def test_older_amdsmi_process_handles_are_resolved(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", make_fake_amdsmi(legacy_process_handles=True))
    [gpu0, _] = amd.AmdSmiBackend().sample()
    assert [p.pid for p in gpu0.processes] == [4242, 77]


def test_an_unsupported_field_reads_as_empty_and_does_not_stop_sampling(monkeypatch):
    monkeypatch.setitem(
        sys.modules, "amdsmi", make_fake_amdsmi(unsupported=("amdsmi_get_gpu_activity", "amdsmi_get_gpu_process_list"))
    )
    gpu0, gpu1 = amd.AmdSmiBackend().sample()
    assert (gpu0.utilization_pct, gpu0.processes, gpu0.vram_used_bytes) == (0.0, [], 2048 * MiB)


def test_available_with_the_fake_module(fake_amdsmi):
    assert amd.available()


def test_available_is_false_when_amdsmi_is_not_importable(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # makes `import amdsmi` raise ImportError
    assert not amd.available()
    assert "not installed" in amd.unavailable_reason()


def test_available_is_false_without_gpus_or_driver(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", make_fake_amdsmi(handles=()))
    assert not amd.available()
    monkeypatch.setitem(sys.modules, "amdsmi", make_fake_amdsmi(fail_init=True))
    assert "did not initialize" in amd.unavailable_reason()


def test_explicit_amd_backend_opens_through_open_backend(fake_amdsmi, tmp_path):
    assert open_backend("amd", [], tmp_path, "n").name == "amd"


def test_explicit_amd_without_amdsmi_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    with pytest.raises(TelemetryError, match="GPU_BACKEND = 'amd'.*amdsmi.*Fix: install ROCm"):
        open_backend("amd", [], tmp_path, "n")

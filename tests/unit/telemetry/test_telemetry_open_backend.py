"""Choosing the backend from GPU_BACKEND."""

from __future__ import annotations

import pytest

from mtgpu.agent.telemetry import NoGpuBackend, SimulatedBackend, TelemetryError, amd, intel, nvml, open_backend

GiB = 1024**3
SIM = [{"model": "t4", "vendor": "nvidia", "vram_bytes": 16 * GiB, "count": 2, "used_vram_bytes": 0, "utilization_pct": 0}]


@pytest.fixture
def no_gpu_hardware(monkeypatch):
    """Every vendor probe says no, whatever machine the tests run on."""
    monkeypatch.setattr(nvml, "unavailable_reason", lambda: "NVML sees no NVIDIA GPU")
    monkeypatch.setattr(amd, "unavailable_reason", lambda: "the amdsmi Python module is not installed")
    monkeypatch.setattr(intel, "unavailable_reason", lambda: "neither xpu-smi nor an Intel GPU is present")


def any_real_gpu() -> bool:
    return nvml.available() or amd.available() or intel.available()


@pytest.mark.skipif(any_real_gpu(), reason="this machine has a GPU")
def test_auto_on_this_gpu_less_machine_gives_a_cpu_only_backend(tmp_path):
    backend = open_backend("auto", [], tmp_path, "node-a")
    assert isinstance(backend, NoGpuBackend) and backend.name == "none"
    assert backend.sample() == []
    backend.close()


def test_auto_without_any_vendor_gives_a_cpu_only_backend(tmp_path, no_gpu_hardware):
    assert open_backend("auto", SIM, tmp_path, "node-a").sample() == []


@pytest.mark.skipif(nvml.available(), reason="this machine has NVML")
def test_explicit_nvml_on_this_machine_names_the_setting_the_value_and_the_fix(tmp_path):
    with pytest.raises(TelemetryError) as err:
        open_backend("nvml", [], tmp_path, "node-a")
    message = str(err.value)
    assert "GPU_BACKEND" in message and "'nvml'" in message
    assert "NVIDIA driver" in message and 'GPU_BACKEND = "auto"' in message


@pytest.mark.parametrize("kind", ["nvml", "amd", "intel"])
def test_an_explicit_vendor_that_is_unavailable_is_a_clear_error(tmp_path, no_gpu_hardware, kind):
    with pytest.raises(TelemetryError, match=rf"GPU_BACKEND = '{kind}' .*Fix: "):
        open_backend(kind, [], tmp_path, "node-a")


def test_an_unknown_kind_lists_the_allowed_values(tmp_path):
    with pytest.raises(TelemetryError, match="allowed: auto, nvml, amd, intel, simulated"):
        open_backend("cuda", [], tmp_path, "node-a")


def test_simulated_uses_the_config_gpus_and_the_state_dir_override_file(tmp_path):
    backend = open_backend("simulated", SIM, tmp_path, "node-b")
    assert isinstance(backend, SimulatedBackend)
    assert backend.override_path == tmp_path / "simulated-gpus.json"
    assert [g.uuid for g in backend.sample()] == ["SIM-node-b-0", "SIM-node-b-1"]

"""Intel GPUs from xpu-smi JSON or xe sysfs, with stand-ins for both."""

from __future__ import annotations

import json

import pytest

from mtgpu.agent.telemetry import TelemetryError, intel

GiB = 1024**3


def make_card(root, name, vendor="0x8086", device="0xe20b", tiles=(12 * GiB,), nested=False):
    dev = root / name / "device"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text(vendor + "\n")
    (dev / "device").write_text(device + "\n")
    for t, size in enumerate(tiles):
        tile = dev / f"tile{t}" / ("memory" if nested else "")
        tile.mkdir(parents=True, exist_ok=True)
        (tile / "physical_vram_size_bytes").write_text(f"{size}\n")


def test_sysfs_lists_only_intel_cards_with_local_memory(tmp_path):
    make_card(tmp_path, "card0", tiles=())  # integrated: no VRAM
    make_card(tmp_path, "card1", tiles=(8 * GiB, 8 * GiB), nested=True)
    make_card(tmp_path, "card2", vendor="0x10de")
    (tmp_path / "card1-DP-1").mkdir()
    assert intel.sysfs_cards(tmp_path) == [("card1", "0xe20b", 16 * GiB)]


def test_not_available_when_neither_xpu_smi_nor_sysfs_cards_are_present(tmp_path, monkeypatch):
    monkeypatch.setattr(intel.shutil, "which", lambda _: None)
    assert not intel.available(tmp_path)
    with pytest.raises(TelemetryError):
        intel.IntelBackend(drm_root=tmp_path)


def test_sysfs_backend_reports_inventory(tmp_path, monkeypatch):
    monkeypatch.setattr(intel.shutil, "which", lambda _: None)
    make_card(tmp_path, "card1")
    [gpu] = intel.IntelBackend(drm_root=tmp_path).sample()
    assert (gpu.index, gpu.vendor, gpu.vram_total_bytes, gpu.vram_used_bytes) == (0, "intel", 12 * GiB, 0)


def test_xpu_smi_backend_maps_discovery_and_throttles_stats():
    calls = []
    now = [0.0]

    def run(args):
        calls.append(args)
        if args == ["discovery", "-j"]:
            return json.dumps({"device_list": [{"device_id": 0, "device_name": "Intel(R) Data Center GPU Max 1550", "uuid": "u0"}]})
        if args[:2] == ["discovery", "-d"]:
            return json.dumps({"memory_physical_size_byte": str(128 * GiB)})
        return json.dumps({"device_level": [{"metrics_type": "XPUM_STATS_MEMORY_USED", "value": 1024},
                                            {"metrics_type": "XPUM_STATS_GPU_UTILIZATION", "value": 42}]})

    backend = intel.IntelBackend(run=run, stats_interval_s=5, clock=lambda: now[0])
    [gpu] = backend.sample()
    assert (gpu.model, gpu.uuid, gpu.vram_total_bytes) == ("Intel(R) Data Center GPU Max 1550", "u0", 128 * GiB)
    assert (gpu.vram_used_bytes, gpu.utilization_pct) == (GiB, 42.0)
    backend.sample()
    now[0] = 6.0
    backend.sample()
    assert sum(c[0] == "stats" for c in calls) == 2

"""The simulated backend: inventory from [[SIMULATED_GPUS]], load from the override file."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from mtgpu.agent.telemetry import TelemetryError
from mtgpu.agent.telemetry.simulated import SimulatedBackend, write_simulated_load
from mtgpu.model.gpu import GpuProcess

GiB = 1024**3


def sim_entry(model="rtx4090", vendor="nvidia", vram_bytes=24 * GiB, count=1, used_vram_bytes=0, utilization_pct=0.0):
    return {
        "model": model,
        "vendor": vendor,
        "vram_bytes": vram_bytes,
        "count": count,
        "used_vram_bytes": used_vram_bytes,
        "utilization_pct": utilization_pct,
    }


def write_json_atomically(path: Path, doc) -> None:
    """As any careful writer would; a new inode, so the change is seen even within one mtime tick."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    os.replace(tmp, path)


def test_entries_expand_to_count_gpus_indexed_across_entries_with_stable_uuids(tmp_path):
    backend = SimulatedBackend(
        [sim_entry(count=2, used_vram_bytes=GiB, utilization_pct=5), sim_entry(model="h200", vram_bytes=141 * GiB, count=3)],
        override_path=tmp_path / "simulated-gpus.json",
        seed="node-a",
    )
    gpus = backend.sample()
    assert backend.name == "simulated"
    assert [g.index for g in gpus] == [0, 1, 2, 3, 4]
    assert [g.model for g in gpus] == ["rtx4090", "rtx4090", "h200", "h200", "h200"]
    assert [g.uuid for g in gpus] == [f"SIM-node-a-{i}" for i in range(5)]
    assert gpus[0].vram_used_bytes == GiB and gpus[0].utilization_pct == 5.0
    assert gpus[4].vram_total_bytes == 141 * GiB and gpus[4].vram_used_bytes == 0
    assert all(g.vendor == "nvidia" and g.processes == [] for g in gpus)
    assert [g.uuid for g in backend.sample()] == [g.uuid for g in gpus]


def test_optional_config_values_may_be_none():
    [gpu] = SimulatedBackend([{"model": "mi300x", "vendor": "amd", "vram_bytes": 192 * GiB, "count": None,
                               "used_vram_bytes": None, "utilization_pct": None}]).sample()
    assert (gpu.vendor, gpu.vram_used_bytes, gpu.utilization_pct) == ("amd", 0, 0.0)


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        ({**sim_entry(), "vram": "24G"}, "vram"),
        (sim_entry(vendor="acme"), "vendor"),
        (sim_entry(vram_bytes=0), "vram_bytes"),
        (sim_entry(used_vram_bytes=25 * GiB), "used_vram_bytes"),
        (sim_entry(utilization_pct=150), "utilization_pct"),
    ],
)
def test_a_bad_config_entry_is_refused_naming_the_key(entry, named):
    with pytest.raises(TelemetryError, match=named):
        SimulatedBackend([entry])


def test_override_file_changes_are_picked_up_without_restart(tmp_path):
    path = tmp_path / "simulated-gpus.json"
    backend = SimulatedBackend([sim_entry(count=2, used_vram_bytes=GiB)], override_path=path, seed="n")
    assert backend.sample()[1].vram_used_bytes == GiB

    write_json_atomically(path, {"1": {"used_vram_bytes": 10 * GiB, "utilization_pct": 80,
                                       "processes": [{"pid": 42, "used_vram_bytes": 9 * GiB, "name": "train.py"}]}})
    gpus = backend.sample()
    assert (gpus[1].vram_used_bytes, gpus[1].utilization_pct) == (10 * GiB, 80.0)
    assert gpus[1].processes == [GpuProcess(pid=42, used_vram_bytes=9 * GiB, name="train.py")]
    assert gpus[0].vram_used_bytes == GiB  # untouched GPU keeps its configured load

    write_json_atomically(path, {"1": {"utilization_pct": 3}})
    assert backend.sample()[1].utilization_pct == 3.0
    assert backend.sample()[1].vram_used_bytes == GiB  # back to the configured value


def test_processes_without_used_vram_add_to_the_configured_use(tmp_path):
    path = tmp_path / "simulated-gpus.json"
    backend = SimulatedBackend([sim_entry(used_vram_bytes=GiB)], override_path=path)
    write_json_atomically(path, {"0": {"processes": [{"pid": 7, "used_vram_bytes": 2 * GiB}]}})
    [gpu] = backend.sample()
    assert gpu.vram_used_bytes == 3 * GiB and gpu.processes == [GpuProcess(7, 2 * GiB, "")]


def test_an_unchanged_override_file_is_not_read_again(tmp_path, monkeypatch):
    path = tmp_path / "simulated-gpus.json"
    write_json_atomically(path, {"0": {"utilization_pct": 50}})
    backend = SimulatedBackend([sim_entry()], override_path=path)
    backend.sample()
    reads = []
    original = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: reads.append(self) or original(self, *a, **k))
    for _ in range(5):
        assert backend.sample()[0].utilization_pct == 50.0
    assert reads == []


def test_a_removed_override_file_means_the_configured_load(tmp_path):
    path = tmp_path / "simulated-gpus.json"
    backend = SimulatedBackend([sim_entry(utilization_pct=1)], override_path=path)
    write_json_atomically(path, {"0": {"utilization_pct": 99}})
    assert backend.sample()[0].utilization_pct == 99.0
    path.unlink()
    assert backend.sample()[0].utilization_pct == 1.0


@pytest.mark.parametrize(
    "broken",
    ["{not json", "[1, 2]", '{"zero": {}}', '{"0": {"used_vram_bytes": -1}}', '{"0": {"temperature": 80}}',
     '{"0": {"processes": [{"used_vram_bytes": 1}]}}', b"\xff\xfe"],
)
def test_a_broken_override_file_keeps_the_last_good_values_and_warns_once(tmp_path, caplog, broken):
    path = tmp_path / "simulated-gpus.json"
    backend = SimulatedBackend([sim_entry()], override_path=path)
    write_json_atomically(path, {"0": {"used_vram_bytes": 4 * GiB, "utilization_pct": 40}})
    assert backend.sample()[0].utilization_pct == 40.0

    tmp = path.with_name("x.tmp")
    tmp.write_bytes(broken if isinstance(broken, bytes) else broken.encode())
    os.replace(tmp, path)
    with caplog.at_level(logging.WARNING, logger="mtgpu.agent.telemetry.simulated"):
        for _ in range(3):
            [gpu] = backend.sample()
            assert (gpu.vram_used_bytes, gpu.utilization_pct) == (4 * GiB, 40.0)
    warnings = [r for r in caplog.records if "not usable" in r.getMessage()]
    assert len(warnings) == 1

    write_json_atomically(path, {"0": {"utilization_pct": 60}})
    assert backend.sample()[0].utilization_pct == 60.0


def test_write_simulated_load_round_trips_and_merges_per_field(tmp_path):
    path = tmp_path / "state" / "simulated-gpus.json"  # the directory is created
    backend = SimulatedBackend([sim_entry(count=2)], override_path=path, seed="n")

    write_simulated_load(path, 1, used_vram_bytes=5 * GiB, utilization_pct=70,
                         processes=[{"pid": 11, "used_vram_bytes": 5 * GiB, "name": "a"}])
    write_simulated_load(path, 1, utilization_pct=20)  # leaves used VRAM and processes alone
    write_simulated_load(path, 0, processes=[GpuProcess(12, GiB, "b")])

    assert json.loads(path.read_text()) == {
        "0": {"processes": [{"pid": 12, "used_vram_bytes": GiB, "name": "b"}]},
        "1": {"used_vram_bytes": 5 * GiB, "utilization_pct": 20,
              "processes": [{"pid": 11, "used_vram_bytes": 5 * GiB, "name": "a"}]},
    }
    gpus = backend.sample()
    assert (gpus[1].vram_used_bytes, gpus[1].utilization_pct) == (5 * GiB, 20.0)
    assert gpus[0].processes == [GpuProcess(12, GiB, "b")] and gpus[0].vram_used_bytes == GiB
    # Atomic: only the file and its lock remain, no temp files.
    assert sorted(p.name for p in path.parent.iterdir()) == ["simulated-gpus.json", "simulated-gpus.json.lock"]


def test_write_simulated_load_replaces_an_atomic_new_file_each_time(tmp_path):
    path = tmp_path / "simulated-gpus.json"
    write_simulated_load(path, 0, utilization_pct=1)
    first_inode = path.stat().st_ino
    write_simulated_load(path, 0, utilization_pct=2)
    assert path.stat().st_ino != first_inode  # replaced, never rewritten in place


def test_write_simulated_load_refuses_values_the_backend_would_not_read(tmp_path):
    path = tmp_path / "simulated-gpus.json"
    with pytest.raises(ValueError, match="utilization_pct"):
        write_simulated_load(path, 0, utilization_pct=101)
    with pytest.raises(ValueError, match="index"):
        write_simulated_load(path, -1, utilization_pct=1)
    assert not path.exists()


def test_write_simulated_load_recovers_a_broken_file(tmp_path):
    path = tmp_path / "simulated-gpus.json"
    path.write_text("{oops")
    write_simulated_load(path, 0, utilization_pct=9)
    assert json.loads(path.read_text()) == {"0": {"utilization_pct": 9}}

"""The terminal app's view model: rows of each view, their order and the filter."""

from __future__ import annotations

from mtgpu.tui.rows import (filter_rows, free_text, gpu_short_cells, job_rows, server_rows, short_model, snapshot_json,
                            sort_rows, workspace_rows)
from tests.unit.tui.tui_builders import make_gpu, make_job, make_node, make_snapshot, make_workspace


def test_server_row_shows_model_count_live_use_per_gpu_free_capacity_own_jobs_and_path():
    node = make_node("gpu1", gpus=2, model="H100")
    node["gpus"][0].update(utilization_pct=90.0, vram_used_bytes=20 * 1024**3, committed_fraction=1.0, exclusive=True)
    snap = make_snapshot("lab", [node], [make_job(7, nodes=("gpu1",)), make_job(8, state="completed",
                                                                                 nodes=("gpu1",))], path="relayed")
    [row] = server_rows([snap])
    assert row.key == "lab/gpu1"
    assert row.cells == ("lab", "gpu1", "up", "2x H100", "90 0", "20/80 0/80", "1/2 GPU, 140 GiB", "7", "relayed")


def test_an_unreachable_cluster_is_one_row_saying_so():
    rows = server_rows([make_snapshot("lab", [make_node()]), make_snapshot("far", error="cannot reach 10.0.0.1:9")])
    assert [r.key for r in rows] == ["lab/node-a", "far!"]
    assert rows[1].cells[2] == "unreachable" and rows[1].cells[-1] == "cannot reach 10.0.0.1:9"


def test_a_cluster_that_stops_answering_keeps_its_nodes_marked_stale():
    [row] = server_rows([make_snapshot("lab", [make_node()], error="timed out")])
    assert row.cells[2] == "stale (up)" and row.cells[-1] == "unreachable: timed out"


def test_free_capacity_counts_uncommitted_gpus_and_vram_left_after_use_or_commitment():
    gpus = [make_gpu(0, used_gib=30, total_gib=80), make_gpu(1, committed=0.5, total_gib=80)]
    gpus[1]["committed_vram_bytes"] = 40 * 1024**3
    assert free_text(gpus) == "1/2 GPU, 90 GiB"


def test_job_rows_leave_workspaces_to_their_view_and_show_the_reason():
    snap = make_snapshot("lab", [], [make_job(1, state="queued", nodes=(), reason="not enough vram"),
                                     make_job(2, workspace=True)], [make_workspace("web")])
    [job] = job_rows([snap])
    assert job.cells == ("lab", "1", "job-1", "queued", "-", "-", "-", "not enough vram")
    assert job.ref == {"cluster": "lab", "job_id": 1, "state": "queued"}
    [ws] = workspace_rows([snap])
    assert ws.cells[:4] == ("lab", "web", "running", "node-a") and ws.ref["ports"] == [8080]


def test_rows_of_several_clusters_are_labelled_with_their_cluster():
    rows = server_rows([make_snapshot("lab", [make_node("a")]), make_snapshot("home", [make_node("a")])])
    assert [(r.cells[0], r.cells[1]) for r in rows] == [("lab", "a"), ("home", "a")]
    assert len({r.key for r in rows}) == 2


def test_filter_keeps_rows_with_every_word_in_some_cell_case_insensitive():
    rows = server_rows([make_snapshot("lab", [make_node("gpu1", model="H100"), make_node("gpu2", model="T4")])])
    assert [r.cells[1] for r in filter_rows(rows, "h100")] == ["gpu1"]
    assert [r.cells[1] for r in filter_rows(rows, "lab t4")] == ["gpu2"]
    assert filter_rows(rows, "lab nothing") == []
    assert filter_rows(rows, "  ") == rows


def test_sort_orders_numbers_as_numbers_and_ties_by_key():
    snap = make_snapshot("lab", [], [make_job(i) for i in (10, 9, 100)])
    rows = job_rows([snap])
    assert [r.cells[1] for r in sort_rows(rows, 1)] == ["9", "10", "100"]
    assert [r.cells[1] for r in sort_rows(rows, 1, reverse=True)] == ["100", "10", "9"]
    assert [r.cells[1] for r in sort_rows(rows, 0)] == ["10", "100", "9"]  # same cluster: by key


def test_snapshot_json_gives_scripts_the_nodes_with_the_callers_jobs():
    d = snapshot_json(make_snapshot("lab", [make_node("gpu1")], [make_job(3, nodes=("gpu1",))]))
    assert d["cluster"] == "lab" and d["error"] is None and d["nodes"][0]["my_jobs"] == [3]


def test_a_narrow_screen_names_gpu_models_short_and_sums_a_node_up():
    assert [short_model(m) for m in ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "Tesla T4",
                                     "NVIDIA GeForce RTX 4090", "AMD Instinct MI300X", "NVIDIA A100 80GB PCIe")] == [
        "H100", "A100", "T4", "RTX 4090", "MI300X", "A100"]
    gpus = [make_gpu(0, "NVIDIA H100 80GB HBM3", util=30.0, used_gib=10),
            make_gpu(1, "NVIDIA H100 80GB HBM3", util=50.0),
            make_gpu(2, "Tesla T4", util=None, total_gib=16, committed=1.0)]
    assert gpu_short_cells(gpus) == ("2x H100+1x T4", "40", "10/176", "2/3 166G")
    assert gpu_short_cells([]) == ("none", "-", "-", "0/0 0G")

"""One-line builders for the terminal app's tests: the API's answers as dicts."""

from __future__ import annotations

from mtgpu.tui.rows import GIB, ClusterSnapshot


def make_gpu(index: int = 0, model: str = "H100", util: float | None = 0.0, used_gib: float = 0,
             total_gib: float = 80, committed: float = 0.0) -> dict:
    return {"index": index, "vendor": "nvidia", "model": model, "vram_total_bytes": int(total_gib * GIB),
            "vram_used_bytes": int(used_gib * GIB), "utilization_pct": util, "committed_fraction": committed,
            "committed_vram_bytes": 0, "exclusive": committed >= 1.0}


def make_node(name: str = "node-a", gpus: int = 2, state: str = "up", **gpu) -> dict:
    return {"name": name, "address": "127.0.0.1:1", "role": "scheduler", "state": state, "reason": None,
            "gpus": [make_gpu(i, **gpu) for i in range(gpus)], "running_jobs": []}


def make_job(job_id: int, state: str = "running", nodes: tuple[str, ...] = ("node-a",), name: str | None = None,
             workspace: bool = False, reason: str | None = None) -> dict:
    return {"id": job_id, "name": name or f"job-{job_id}", "state": state, "nodes": list(nodes),
            "gpus": [{"node": n, "index": 0} for n in nodes], "exit_code": None, "reason": reason,
            "spec": {"workspace": {"name": "w"} if workspace else None}}


def make_workspace(name: str, state: str = "running", ports: tuple[int, ...] = (8080,), node: str = "node-a",
                   container: str | None = "mtgpu-ws99") -> dict:
    return {"id": 99, "state": state, "reason": None,
            "workspace": {"name": name, "node": node, "image": "localhost/base", "container": container, "ports": [
                {"port": p, "host_port": 40000 + p, "url": None} for p in ports]}}


def make_snapshot(cluster: str = "lab", nodes=None, jobs=None, workspaces=None, error: str | None = None,
                  path: str = "direct") -> ClusterSnapshot:
    return ClusterSnapshot(cluster, "127.0.0.1:9", "alice", path, nodes, jobs, workspaces, error)


def screen_text(app) -> str:
    """What the terminal shows now, as text (textual's screenshot, without its styles): one
    line per row of the screen, trailing spaces kept so that a cut is seen."""
    import io

    from rich.console import Console

    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, color_system=None,
                      record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text(styles=False)

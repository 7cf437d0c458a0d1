"""`GET /metrics` on a real node (issue 15): the exposition passes `promtool check metrics`,
names no tenant by default, is refused where [METRICS] says, and a real Prometheus
(the Debian package's binary, started here on loopback and stopped by its PID) scrapes
the node so that every expression of the Grafana dashboard returns data."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import re
import tempfile
from pathlib import Path

import httpx
import pytest

from tests.support.node import free_port, running_node, wait_for

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "grafana" / "mtgpu.json"
GPUS = [{"model": "rtx4090", "vram": "24G", "count": 2}]


def dashboard_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", ())]


@pytest.fixture(scope="module")
def node(alice):
    with running_node(GPUS, METRICS={"enabled": True}) as n:
        n.url = f"http://127.0.0.1:{n.port}/metrics"
        n.tenant_name = alice.name
        yield n


def scrape(node) -> httpx.Response:
    return httpx.get(node.url, timeout=10)


def start_a_job(node, alice) -> int:
    job_id = node.submit_json(alice, "--wrap", "true")["job_id"]
    node.wait_state(job_id, {"running", "completed"})
    return job_id


def test_metrics_pass_promtool_and_name_no_tenant(node, alice):
    start_a_job(node, alice)
    r = scrape(node)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = r.text
    for name in ("mtgpu_gpu_utilization_ratio", "mtgpu_gpu_memory_total_bytes", "mtgpu_member_up",
                 "mtgpu_jobs", "mtgpu_job_queue_wait_seconds_bucket", "mtgpu_raft_commit_index",
                 "mtgpu_directlink_sessions"):
        assert f"\n{name}{{" in text or f"\n{name} " in text, name
    assert 'mtgpu_gpu_info{gpu="1",model="rtx4090",node="node-a",vendor="nvidia"} 1.0' in text
    started = re.search(r'^mtgpu_job_submit_to_start_seconds_count\{kind="job"\} (\S+)$', text, re.M)
    assert started and float(started.group(1)) >= 1, "the job's start was not observed"
    assert node.tenant_name not in text and "tenant=" not in text
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is missing: apt-get install prometheus (scripts/install.sh --test does)")
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr


def test_a_scrape_through_a_proxy_is_refused(node):
    r = httpx.get(node.url, headers={"X-Forwarded-For": "127.0.0.1"}, timeout=10)
    assert r.status_code == 403 and "proxy" in r.json()["error"]


def test_a_node_that_does_not_allow_the_scraper_refuses_it():
    with running_node([], name="node-m", METRICS={"enabled": True, "allow": ["192.0.2.7"]}) as n:
        r = httpx.get(f"http://127.0.0.1:{n.port}/metrics", timeout=10)
        assert r.status_code == 403 and "[METRICS] allow" in r.json()["error"], r.text


class Prometheus:
    """A Prometheus server of this test: its own config and storage in a temporary folder,
    on a free loopback port, scraping one target every second."""

    def __init__(self, binary: str, target: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="mtgpu-prom-"))
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        (self.dir / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"scrape_configs:\n  - job_name: mtgpu\n    static_configs:\n      - targets: ['{target}']\n")
        self.log = open(self.dir / "prometheus.log", "wb")
        self.proc = subprocess.Popen([binary, f"--config.file={self.dir / 'prometheus.yml'}",
                                      f"--storage.tsdb.path={self.dir / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def query(self, expr: str) -> list[dict]:
        r = httpx.get(f"{self.base}/api/v1/query", params={"query": expr}, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def up(self) -> bool:
        return any(s["value"][1] == "1" for s in self.query('up{job="mtgpu"}'))

    def text_log(self) -> str:
        return (self.dir / "prometheus.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def has_data(samples: list[dict]) -> bool:
    return any(not math.isnan(float(s["value"][1])) for s in samples)


def test_prometheus_scrapes_the_node_and_every_dashboard_expression_has_data(node, alice):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is missing: apt-get install prometheus (scripts/install.sh --test does)")
    prom = Prometheus(binary, f"127.0.0.1:{node.port}")
    try:
        wait_for("Prometheus to scrape the node (up == 1)", prom.up, timeout_s=20, interval_s=0.25)
        start_a_job(node, alice)  # a start (and a timed pass) inside the rate() windows
        expressions = dashboard_expressions()
        assert len(expressions) >= 20
        for expr in expressions:
            wait_for(f"data for {expr!r}", lambda: has_data(prom.query(expr)), timeout_s=10, interval_s=0.25)
        samples = prom.query("mtgpu_gpu_memory_total_bytes")
        assert {s["metric"]["gpu"] for s in samples} == {"0", "1"}
        assert float(samples[0]["value"][1]) == 24 * 2**30
    except AssertionError as e:
        raise AssertionError(f"{e}\nprometheus log:\n{prom.text_log()}") from None
    finally:
        prom.stop()
    assert prom.proc.returncode is not None  # stopped and waited for: nothing of it is left running

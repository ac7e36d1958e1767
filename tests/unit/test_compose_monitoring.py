"""The docker compose stack's monitoring without Docker: Prometheus scrapes the launcher's metrics
port, Grafana reads that Prometheus, and every dashboard query names a metric that Triton 2.51 or the
decoding backend exports, with the summaries it reads switched on."""
import json
import re

import pytest

from scripts import serve
from tests.unit.compose_files import COMPOSE, REPO, host_path, load

STREAM_METRICS = REPO / "backends" / "continuous_decoding" / "stream_metrics.py"

# The metric families on Triton 2.51's /metrics with the launcher's flags (summary latencies on, GPU
# metrics off), as a running server lists them under `# TYPE`.
TRITON_METRICS = {
    "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
    "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us", "nv_inference_pending_request_count",
    "nv_inference_request_summary_us", "nv_inference_queue_summary_us",
    "nv_inference_compute_input_summary_us", "nv_inference_compute_infer_summary_us",
    "nv_inference_compute_output_summary_us", "nv_pinned_memory_pool_total_bytes",
    "nv_pinned_memory_pool_used_bytes", "nv_cpu_utilization", "nv_cpu_memory_total_bytes",
    "nv_cpu_memory_used_bytes",
}
# What the dashboard must show (README, "docker compose").
DASHBOARD_METRICS = {
    "nv_inference_request_success", "nv_inference_request_summary_us", "nv_inference_queue_summary_us",
    "nv_inference_count", "nv_inference_exec_count", "nv_inference_pending_request_count",
    "batchwise_kv_blocks_used",
}


@pytest.fixture(scope="module")
def services():
    return load(COMPOSE)["services"]


def test_prometheus_scrapes_the_launchers_metrics_port(services):
    config = load(host_path(services["prometheus"], "/etc/prometheus/prometheus.yml"))
    targets = [t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert f"triton:{serve.DEFAULT_METRICS_PORT}" in targets


def grafana_datasource(services) -> dict:
    folder = host_path(services["grafana"], "/etc/grafana/provisioning/datasources")
    (source,) = [d for f in sorted(folder.glob("*.yml")) for d in load(f)["datasources"]]
    return source


def dashboards(services) -> list[dict]:
    grafana = services["grafana"]
    folder = host_path(grafana, "/etc/grafana/provisioning/dashboards")
    paths = [p["options"]["path"] for f in sorted(folder.glob("*.yml")) for p in load(f)["providers"]]
    found = [json.loads(f.read_text()) for p in paths for f in sorted(host_path(grafana, p).glob("*.json"))]
    assert found, f"no dashboard in {paths}"
    assert host_path(grafana, grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]).is_file()
    return found


def test_grafana_reads_the_stacks_prometheus_at_its_scrape_interval(services):
    source = grafana_datasource(services)
    prometheus = load(host_path(services["prometheus"], "/etc/prometheus/prometheus.yml"))
    assert source["url"] == "http://prometheus:9090"
    assert source["jsonData"]["timeInterval"] == prometheus["global"]["scrape_interval"]


def test_dashboard_queries_name_metrics_that_exist(services):
    batchwise_metrics = set(re.findall(r'"(batchwise_\w+)"', STREAM_METRICS.read_text()))
    assert "batchwise_kv_blocks_used" in batchwise_metrics
    uid = grafana_datasource(services)["uid"]
    used = set()
    for dashboard in dashboards(services):
        for panel in dashboard["panels"]:
            assert panel["datasource"]["uid"] == uid, f"panel {panel['title']!r}"
            assert panel["targets"], f"panel {panel['title']!r} has no query"
            for target in panel["targets"]:
                names = set(re.findall(r"\b(?:nv|batchwise)_\w+", target["expr"]))
                assert names, f"panel {panel['title']!r}: {target['expr']!r} reads no metric"
                unknown = names - TRITON_METRICS - batchwise_metrics
                assert not unknown, f"panel {panel['title']!r} reads {sorted(unknown)}, which nothing exports"
                used |= names
    assert DASHBOARD_METRICS <= used, f"the dashboard lacks {sorted(DASHBOARD_METRICS - used)}"


def test_latency_summaries_that_the_dashboard_reads_are_switched_on(services):
    queries = " ".join(t["expr"] for d in dashboards(services) for p in d["panels"] for t in p["targets"])
    assert 'nv_inference_request_summary_us{quantile="0.99"}' in queries
    assert "--metrics-config=summary_latencies=true" in services["triton"]["command"]

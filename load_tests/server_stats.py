"""The server's side of a measurement: Triton's /v2/models/<m>/stats and /metrics, read at window
boundaries and turned into per-point figures (executed batch size, queue and compute time per
request, engine batch size, failures). The statistics are clients/health.py's ModelStatistics (its
parser and its window math); the /metrics parsing is here. Fetching is thin; the math is pure."""
from __future__ import annotations

import json
import re
import urllib.request
from dataclasses import dataclass

from clients.health import ModelStatistics, parse_statistics

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def model_stats(http_url: str, model: str) -> ModelStatistics:
    """Triton's cumulative statistics of one model (subtract two for a window)."""
    with urllib.request.urlopen(f"http://{http_url}/v2/models/{model}/stats", timeout=5) as r:
        return parse_statistics(json.load(r)["model_stats"][0])


def parse_metrics(text: str, model: str) -> dict[str, float]:
    """Prometheus text -> {metric name: value} for one model's samples, summed over other labels
    (e.g. the failure reasons); summary quantiles are left out."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or not (m := _SAMPLE.match(line)):
            continue
        name, labels, value = m.group(1), dict(_LABEL.findall(m.group(2) or "")), m.group(3)
        if labels.get("model") != model or "quantile" in labels:
            continue
        values[name] = values.get(name, 0.0) + float(value)
    return values


def fetch_metrics(metrics_url: str, model: str) -> dict[str, float]:
    with urllib.request.urlopen(metrics_url, timeout=5) as r:
        return parse_metrics(r.read().decode(), model)


@dataclass(frozen=True)
class Snapshot:
    stats: ModelStatistics
    metrics: dict[str, float]


def take_snapshot(http_url: str, metrics_url: str | None, model: str) -> Snapshot:
    return Snapshot(model_stats(http_url, model), fetch_metrics(metrics_url, model) if metrics_url else {})


@dataclass(frozen=True)
class ServerFigures:
    avg_batch_size: float | None  # inferences per execution, as Triton's scheduler formed them
    avg_queue_us: float | None  # per request
    avg_compute_us: float | None  # per request: the compute time of the batch it ran in
    engine_batch_size: float | None  # generation only: mean sequences per engine step, sampled
    server_failures: int | None
    generated_tokens: float | None

    def as_point_fields(self) -> dict:
        return {"avg_batch_size": self.avg_batch_size, "avg_queue_us": self.avg_queue_us,
                "avg_compute_us": self.avg_compute_us, "engine_batch_size": self.engine_batch_size,
                "server_failures": self.server_failures}


def server_figures(snapshots: list[Snapshot]) -> ServerFigures:
    """What the server did between the first and the last snapshot."""
    first, last = snapshots[0], snapshots[-1]
    window = last.stats - first.stats

    def counter(name: str) -> float | None:
        if name not in last.metrics or name not in first.metrics:
            return None
        return last.metrics[name] - first.metrics[name]

    # The backend's gauge holds the last engine step only: one read says little, one per window more.
    steps = [s.metrics["batchwise_step_batch_size"] for s in snapshots[1:] if "batchwise_step_batch_size" in s.metrics]
    failures = counter("nv_inference_request_failure")
    return ServerFigures(
        avg_batch_size=window.avg_batch_size,
        avg_queue_us=window.avg_queue_us,
        avg_compute_us=window.avg_compute_us,
        engine_batch_size=sum(steps) / len(steps) if steps else None,
        server_failures=None if failures is None else int(failures),
        generated_tokens=counter("batchwise_generated_tokens_total"),
    )

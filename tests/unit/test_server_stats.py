"""Server-side figures from Triton's stats (parsed by clients/health.py) and metrics text, by hand."""
import pytest

from clients.health import ModelStatistics, parse_statistics
from load_tests.server_stats import Snapshot, parse_metrics, server_figures

METRICS = """\
# HELP nv_inference_request_failure Number of failed inference requests
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="gpt2",reason="REJECTED",version="1"} 2
nv_inference_request_failure{model="gpt2",reason="BACKEND",version="1"} 1
nv_inference_request_failure{model="minilm",reason="REJECTED",version="1"} 7
nv_inference_queue_summary_us{model="gpt2",version="1",quantile="0.5"} 148
batchwise_generated_tokens_total{model="gpt2"} 40
batchwise_generated_tokens_total{model="gpt2_static"} 99
batchwise_step_batch_size{model="gpt2"} 3
"""


def stats(inferences, executions, success, queue_ns, compute_ns) -> ModelStatistics:
    """One entry of /v2/models/m/stats as Triton sends it (64-bit numbers as strings, as its HTTP
    API may), through the parser that load_tests.server_stats.model_stats uses."""
    zero = {"count": "0", "ns": "0"}
    inference_stats = {"success": {"count": success, "ns": 0}, "queue": {"count": success, "ns": str(queue_ns)},
                       "compute_input": zero, "compute_infer": {"count": executions, "ns": compute_ns},
                       "compute_output": zero}
    return parse_statistics({"name": "m", "version": "1", "inference_count": inferences,
                             "execution_count": str(executions), "inference_stats": inference_stats})


def test_metrics_are_summed_per_model_without_quantiles():
    values = parse_metrics(METRICS, "gpt2")
    assert values == {"nv_inference_request_failure": 3.0, "batchwise_generated_tokens_total": 40.0,
                      "batchwise_step_batch_size": 3.0}
    assert parse_metrics(METRICS, "minilm") == {"nv_inference_request_failure": 7.0}


def test_figures_between_first_and_last_snapshot():
    first = Snapshot(stats(10, 10, 10, 1_000_000, 5_000_000),
                     {"nv_inference_request_failure": 1.0, "batchwise_generated_tokens_total": 100.0,
                      "batchwise_step_batch_size": 9.0})
    middle = Snapshot(first.stats, {"batchwise_step_batch_size": 4.0})
    last = Snapshot(stats(110, 35, 110, 21_000_000, 405_000_000),
                    {"nv_inference_request_failure": 3.0, "batchwise_generated_tokens_total": 260.0,
                     "batchwise_step_batch_size": 6.0})
    f = server_figures([first, middle, last])
    assert f.avg_batch_size == pytest.approx(100 / 25)
    assert f.avg_queue_us == pytest.approx(200.0)  # 20 ms over 100 requests
    assert f.avg_compute_us == pytest.approx(4000.0)
    assert f.engine_batch_size == pytest.approx(5.0)  # the samples after the first: 4 and 6
    assert (f.server_failures, f.generated_tokens) == (2, 160.0)


def test_no_traffic_gives_no_ratios():
    s = Snapshot(stats(5, 5, 5, 1, 1), {})
    f = server_figures([s, s])
    assert (f.avg_batch_size, f.avg_queue_us, f.avg_compute_us, f.engine_batch_size, f.server_failures) == \
        (None, None, None, None, None)

"""Server-side figures from Triton's stats and metrics text, by hand."""
import pytest

from load_tests.server_stats import Snapshot, parse_metrics, server_figures, stats_counters

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


def stats_body(inferences, executions, success, queue_ns, compute_ns):
    zero = {"count": 0, "ns": 0}
    inference_stats = {"success": {"count": success, "ns": 0}, "queue": {"count": 0, "ns": queue_ns},
                       "compute_input": zero, "compute_infer": {"count": 0, "ns": compute_ns}, "compute_output": zero}
    return {"model_stats": [{"name": "m", "inference_count": inferences, "execution_count": executions,
                             "inference_stats": inference_stats}]}


def test_metrics_are_summed_per_model_without_quantiles():
    values = parse_metrics(METRICS, "gpt2")
    assert values == {"nv_inference_request_failure": 3.0, "batchwise_generated_tokens_total": 40.0,
                      "batchwise_step_batch_size": 3.0}
    assert parse_metrics(METRICS, "minilm") == {"nv_inference_request_failure": 7.0}


def test_figures_between_first_and_last_snapshot():
    first = Snapshot(stats_counters(stats_body(10, 10, 10, 1_000_000, 5_000_000)),
                     {"nv_inference_request_failure": 1.0, "batchwise_generated_tokens_total": 100.0,
                      "batchwise_step_batch_size": 9.0})
    middle = Snapshot(first.stats, {"batchwise_step_batch_size": 4.0})
    last = Snapshot(stats_counters(stats_body(110, 35, 110, 21_000_000, 405_000_000)),
                    {"nv_inference_request_failure": 3.0, "batchwise_generated_tokens_total": 260.0,
                     "batchwise_step_batch_size": 6.0})
    f = server_figures([first, middle, last])
    assert f.avg_batch_size == pytest.approx(100 / 25)
    assert f.avg_queue_us == pytest.approx(200.0)  # 20 ms over 100 requests
    assert f.avg_compute_us == pytest.approx(4000.0)
    assert f.engine_batch_size == pytest.approx(5.0)  # the samples after the first: 4 and 6
    assert (f.server_failures, f.generated_tokens) == (2, 160.0)


def test_no_traffic_gives_no_ratios():
    s = Snapshot(stats_counters(stats_body(5, 5, 5, 1, 1)), {})
    f = server_figures([s, s])
    assert (f.avg_batch_size, f.avg_queue_us, f.engine_batch_size, f.server_failures) == (None, None, None, None)

"""Token statistics from request-event contexts, against hand-computed values; the worker-to-master
report round trip; the rows and CSV that the web UI and the end of a run show."""
import csv

import pytest

from clients.timing import RequestTiming
from load_tests.token_stats import TokenStats, summarize_row, timing_from_context, write_csv


def test_a_context_becomes_token_times_from_the_send():
    timing = timing_from_context({"ttft_ms": 100.0, "itl_ms": [20.0, 30.0], "num_output_tokens": 3}, 160.0)
    assert timing.token_times_s == pytest.approx((0.1, 0.12, 0.15))
    assert timing.e2e_s == pytest.approx(0.16) and timing.num_output_tokens == 3
    assert timing.ttft_s == pytest.approx(0.1) and timing.tpot_s == pytest.approx(0.025)
    assert timing.itls_s == pytest.approx([0.02, 0.03])


def test_contexts_without_token_timings_are_ignored():
    assert timing_from_context({}, 10.0) is None
    assert timing_from_context({"scheduled_at": 1.0, "late_ms": 0.2}, 10.0) is None
    assert timing_from_context({"ttft_ms": None, "itl_ms": []}, 10.0) is None


def test_a_row_has_hand_computed_percentiles_and_throughput():
    timings = [RequestTiming((0.1, 0.2, 0.3), 0.35, 3), RequestTiming((0.3, 0.5), 0.5, 2)]
    row = summarize_row("grpc-stream gpt2", timings, duration_s=2.0)
    assert (row["requests"], row["output_tokens"], row["output_tokens_per_s"]) == (2, 5, 2.5)
    assert row["ttft_p50_ms"] == pytest.approx(200.0)  # midway between 100 and 300
    assert row["ttft_p99_ms"] == pytest.approx(298.0)
    assert row["tpot_p50_ms"] == pytest.approx(150.0)  # per request: 100 and 200
    assert row["itl_p50_ms"] == pytest.approx(100.0)  # gaps 100, 100, 200
    assert row["itl_p90_ms"] == pytest.approx(180.0)
    assert row["e2e_p50_ms"] == pytest.approx(425.0)


def test_a_request_with_one_token_has_a_ttft_but_no_tpot():
    row = summarize_row("x", [RequestTiming((0.05,), 0.05, 1)], 1.0)
    assert row["ttft_p50_ms"] == pytest.approx(50.0) and row["tpot_p50_ms"] is None and row["itl_p50_ms"] is None


def test_worker_reports_merge_on_the_master_and_leave_the_worker_empty():
    worker, master = TokenStats(), TokenStats()
    worker.record("sse", "gpt2", RequestTiming((0.1, 0.2), 0.2, 2))
    worker.record("grpc-stream", "gpt2", RequestTiming((0.3,), 0.3, 1))
    master.merge_report(worker.take_report())
    assert worker.timings == {}
    worker.record("sse", "gpt2", RequestTiming((0.4, 0.6), 0.6, 2))
    master.merge_report(worker.take_report())
    assert [len(v) for _, v in sorted(master.timings.items())] == [1, 2]
    assert master.timings[("sse", "gpt2")][1].token_times_s == (0.4, 0.6)


def test_rows_end_with_the_aggregate_and_write_as_csv(tmp_path):
    stats = TokenStats()
    stats.record("sse", "gpt2", RequestTiming((0.1, 0.2), 0.2, 2))
    stats.record("sse", "gpt2_static", RequestTiming((0.3, 0.4), 0.4, 2))
    rows = stats.rows()
    assert [r["name"] for r in rows] == ["sse gpt2", "sse gpt2_static", "Aggregated"]
    assert rows[-1]["requests"] == 2 and rows[-1]["ttft_p50_ms"] == pytest.approx(200.0)
    write_csv(stats, tmp_path / "run_tokens.csv")
    with open(tmp_path / "run_tokens.csv") as f:
        written = list(csv.DictReader(f))
    assert [r["name"] for r in written] == ["sse gpt2", "sse gpt2_static", "Aggregated"]
    assert float(written[0]["ttft_p50_ms"]) == pytest.approx(100.0)
    stats.reset()
    assert stats.rows() == []

"""Token statistics from request-event contexts, against hand-computed values; the worker-to-master
report round trip; the rows and CSV that the web UI and the end of a run show; the bounded sample
behind the percentiles of a long run, against the exact percentiles of the same values."""
import csv

import numpy as np
import pytest

from clients.timing import RequestTiming
from load_tests.token_stats import Reservoir, TokenStats, summarize_row, timing_from_context, write_csv


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
    assert row["ttft_mean_ms"] == pytest.approx(200.0) and row["itl_mean_ms"] == pytest.approx(133.33)


def test_a_request_with_one_token_has_a_ttft_but_no_tpot():
    row = summarize_row("x", [RequestTiming((0.05,), 0.05, 1)], 1.0)
    assert row["ttft_p50_ms"] == pytest.approx(50.0) and row["tpot_p50_ms"] is None and row["itl_p50_ms"] is None


def test_worker_reports_merge_on_the_master_and_leave_the_worker_empty():
    worker, master = TokenStats(), TokenStats()
    worker.record("sse", "gpt2", RequestTiming((0.1, 0.2), 0.2, 2))
    worker.record("grpc-stream", "gpt2", RequestTiming((0.3,), 0.3, 1))
    master.merge_report(worker.take_report())
    assert worker.series == {} and worker.take_report() == []
    worker.record("sse", "gpt2", RequestTiming((0.4, 0.6), 0.6, 2))
    master.merge_report(worker.take_report())
    assert [s.requests for _, s in sorted(master.series.items())] == [1, 2]
    sse = master.series[("sse", "gpt2")]
    assert sse.output_tokens == 4 and sorted(sse.metrics["ttft"].values) == [0.1, 0.4]
    assert sorted(sse.metrics["itl"].values) == pytest.approx([0.1, 0.2])


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


def test_a_reservoir_keeps_exact_counts_and_sums_and_a_bounded_sample():
    values = np.random.default_rng(1).exponential(0.1, 50_000)
    reservoir = Reservoir(2000, seed="s")
    for v in values:
        reservoir.add(float(v))
    assert len(reservoir.values) == 2000 and reservoir.count == 50_000
    assert reservoir.mean == pytest.approx(values.mean(), rel=1e-9)
    # a sample of k = 2000 puts the q-th percentile's rank 100 * sqrt(q(1-q)/k) points off (1 sd):
    # 1.1 at p50, 0.22 at p99; allowed: 3 sd
    for q, tolerance in ((50, 3.4), (99, 0.67)):
        rank = 100 * (values < np.percentile(reservoir.values, q)).mean()
        assert rank == pytest.approx(q, abs=tolerance)


def test_the_same_seed_draws_the_same_sample():
    def filled(seed):
        r = Reservoir(10, seed=seed)
        for v in range(1000):
            r.add(float(v))
        return r.values

    assert filled("a") == filled("a") and filled("a") != filled("b")


def test_merged_samples_stay_uniform_over_both_populations():
    # 3000 values from one worker and 1000 from another: the merged sample holds about 3 of the
    # first for 1 of the second, as a sample of all 4000 would
    kept_from_first = []
    for seed in range(30):
        a, b = Reservoir(400, f"a{seed}"), Reservoir(400, f"b{seed}")
        for _ in range(3000):
            a.add(1.0)
        for _ in range(1000):
            b.add(2.0)
        a.merge(*b.to_report())
        assert len(a.values) == 400 and a.count == 4000 and a.total == 5000.0
        kept_from_first.append(a.values.count(1.0) / 400)
    assert np.mean(kept_from_first) == pytest.approx(0.75, abs=0.01)


def test_small_reports_merge_whole_so_that_short_runs_stay_exact():
    worker, master = TokenStats(capacity=100), TokenStats(capacity=100)
    timings = [RequestTiming((0.01 * i, 0.01 * i + 0.005), 0.01 * i + 0.005, 2) for i in range(1, 41)]
    for i, timing in enumerate(timings):
        worker.record("sse", "gpt2", timing)
        if i % 10 == 9:
            master.merge_report(worker.take_report())
    master.stopped_at = master.started_at + 2.0
    (row,) = master.rows()
    assert row == summarize_row("sse gpt2", timings, 2.0)
    assert row["requests"] == 40 and row["ttft_p50_ms"] == pytest.approx(205.0)


def test_a_long_run_keeps_at_most_capacity_values_per_statistic():
    stats = TokenStats(capacity=50)
    for _ in range(5000):
        stats.record("grpc-stream", "gpt2", RequestTiming(tuple(0.001 * k for k in range(1, 9)), 0.01, 8))
    (series,) = stats.series.values()
    assert series.requests == 5000 and series.output_tokens == 40_000
    assert all(len(r.values) == 50 for r in series.metrics.values())
    assert series.metrics["itl"].count == 35_000  # 7 gaps per request, all counted
    (row,) = stats.rows()
    assert row["itl_p50_ms"] == pytest.approx(1.0) and row["itl_mean_ms"] == pytest.approx(1.0)

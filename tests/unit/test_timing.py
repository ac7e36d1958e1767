"""The latency math against hand-computed values."""
import pytest

from clients.timing import RequestTiming, percentile, summarize


def test_ttft_tpot_and_itl_by_hand():
    t = RequestTiming(token_times_s=(0.5, 0.7, 1.0, 1.1), e2e_s=1.1, num_output_tokens=4)
    assert t.ttft_s == 0.5
    assert t.tpot_s == pytest.approx((1.1 - 0.5) / 3)
    assert t.itls_s == pytest.approx([0.2, 0.3, 0.1])


def test_single_token_and_missing_times():
    assert RequestTiming((0.3,), 0.3, 1).tpot_s is None
    untimed = RequestTiming(None, 2.0, 10)
    assert untimed.ttft_s is None and untimed.tpot_s is None and untimed.itls_s == []


def test_percentile_interpolates_and_skips_none():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([10.0, None, 20.0], 100) == 20.0
    assert percentile([None], 50) is None


def test_summary_by_hand():
    timings = [RequestTiming((0.1, 0.2, 0.3), 0.3, 3), RequestTiming((0.2, 0.6), 0.6, 2)]
    s = summarize(timings, duration_s=2.0)
    assert s["output_tokens"] == 5 and s["output_tokens_per_s"] == 2.5 and s["requests_per_s"] == 1.0
    assert s["ttft_p50_ms"] == pytest.approx(150.0)
    assert s["tpot_p50_ms"] == pytest.approx((100.0 + 400.0) / 2)
    assert s["e2e_p99_ms"] == pytest.approx(300.0 + 0.99 * 300.0)


def test_itl_percentile_over_all_gaps():
    timings = [RequestTiming((0.0, 0.1, 0.2), 0.2, 3), RequestTiming((0.0, 0.4), 0.4, 2)]
    # gaps: 0.1, 0.1, 0.4 -> p50 = 0.1
    assert summarize(timings, 1.0)["itl_p50_ms"] == pytest.approx(100.0)

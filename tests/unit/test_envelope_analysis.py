"""The envelope's analysis against hand-worked cases: the stability rule, the knee, the SLO choice,
the Pareto frontier, and how a point's figures come from its requests."""
import pytest

from load_tests.analysis import (
    Slo,
    WindowStats,
    best_under_slo,
    find_knee,
    is_stable,
    pareto_frontier,
    spread,
    summarize_envelope,
)
from load_tests.point import PointResult, RecordedRequest, summarize_point, window_stats


def windows(*pairs):
    """Windows of 2 s from (requests, p99_ms) pairs."""
    return [WindowStats(2.0 * i, 2.0, n, 0, p99) for i, (n, p99) in enumerate(pairs)]


def point(load, rps, p99, *, stable=True, errors=0, requests=100, **kw):
    return PointResult(load_kind="concurrency", load=load, duration_s=10.0, requests=requests, errors=errors,
                       throughput_rps=rps, p50_ms=p99 / 2, p90_ms=None, p95_ms=None, p99_ms=p99,
                       is_stable=stable, num_windows=3, **kw)


def test_spread_is_max_over_min_minus_one():
    assert spread([100.0, 105.0, 110.0]) == pytest.approx(0.10)
    assert spread([5.0, 5.0]) == 0.0
    assert spread([0.0, 1.0]) == float("inf")
    assert spread([0.0, 0.0]) == 0.0


def test_stable_when_last_three_within_ten_percent_inclusive():
    # throughput 100, 105, 110 req/s (spread exactly 10 %); p99 20, 21, 22 ms (exactly 10 %)
    assert is_stable(windows((200, 20.0), (210, 21.0), (220, 22.0)))
    # an early unstable window no longer counts once three steady ones follow it
    assert is_stable(windows((10, 500.0), (200, 20.0), (210, 21.0), (220, 22.0)))


def test_unstable_when_throughput_or_p99_spread_exceeds_ten_percent():
    assert not is_stable(windows((200, 20.0), (210, 21.0), (221, 22.0)))  # throughput 10.5 %
    assert not is_stable(windows((200, 20.0), (210, 21.0), (220, 22.1)))  # p99 10.5 %
    assert not is_stable(windows((200, 20.0), (200, 20.0)))  # fewer than 3 windows
    assert not is_stable(windows((0, None), (0, None), (0, None)))  # idle windows prove nothing


def test_tolerance_and_window_count_are_parameters():
    ws = windows((200, 20.0), (230, 20.0), (200, 20.0))
    assert not is_stable(ws) and is_stable(ws, tolerance=0.2)
    assert is_stable(ws[1:2] * 2, num_windows=2)


def test_knee_is_farthest_below_the_diagonal():
    # latency flat until 300 req/s, then steep: the knee is the last cheap point
    assert find_knee([100, 200, 300, 310, 315], [10, 11, 12, 50, 200]) == 2
    # throughput saturates and falls back while latency grows: still the bend
    assert find_knee([50, 100, 140, 150, 145], [20, 21, 25, 60, 120]) == 2
    # saturated from the start: throughput only falls as latency grows, the lightest load is the knee
    assert find_knee([42, 40, 30], [64, 240, 884]) == 0


def test_no_knee_for_straight_or_concave_curves_and_short_sweeps():
    assert find_knee([1, 2, 3, 4], [10, 20, 30, 40]) is None  # linear: no bend
    assert find_knee([1, 2, 3, 4], [10, 30, 37, 40]) is None  # concave: above the chord
    assert find_knee([1, 2], [10, 100]) is None
    assert find_knee([5, 5, 5], [1, 1, 1]) is None
    with pytest.raises(ValueError):
        find_knee([1, 2, 3], [1, 2])


def test_best_under_slo_takes_most_throughput_that_meets_it():
    points = [point(1, 50, 10), point(8, 300, 40), point(32, 400, 80), point(64, 390, 300)]
    assert best_under_slo(points, Slo(p99_ms=50)) is points[1]
    assert best_under_slo(points, Slo(p99_ms=80)) is points[2]  # the limit itself is allowed
    assert best_under_slo(points, Slo(p99_ms=5)) is None


def test_slo_prefers_stable_points_and_rejects_errors():
    points = [point(1, 50, 10), point(8, 300, 40, stable=False), point(16, 350, 45, errors=5)]
    assert best_under_slo(points, Slo(p99_ms=50)) is points[0]  # 8 unstable, 16 has errors
    assert best_under_slo(points, Slo(p99_ms=50, max_error_rate=0.05)) is points[2]
    only_unstable = [point(8, 300, 40, stable=False)]
    assert best_under_slo(only_unstable, Slo(p99_ms=50)) is only_unstable[0]


def test_slo_on_ttft_and_tpot():
    a = point(1, 2.0, 900, ttft_p99_ms=100.0, tpot_p99_ms=30.0)
    b = point(4, 6.0, 1500, ttft_p99_ms=400.0, tpot_p99_ms=35.0)
    assert best_under_slo([a, b], Slo(ttft_p99_ms=500)) is b
    assert best_under_slo([a, b], Slo(ttft_p99_ms=500, tpot_p99_ms=32)) is a
    assert best_under_slo([point(1, 2.0, 900)], Slo(ttft_p99_ms=500)) is None  # no TTFT measured


def test_slo_validates_its_limits():
    with pytest.raises(ValueError, match="p99_ms"):
        Slo(p99_ms=0)
    with pytest.raises(ValueError, match="max_error_rate"):
        Slo(p99_ms=10, max_error_rate=1.5)
    assert not Slo().is_set


def test_pareto_frontier_drops_dominated_points():
    a, b, c, d = point(1, 100, 10), point(2, 200, 30), point(3, 150, 40), point(4, 200, 35)
    assert pareto_frontier([a, b, c, d]) == [a, b]  # c and d are beaten by b
    assert pareto_frontier([point(1, 0, 5, requests=0)]) == []


def test_summarize_envelope_indices():
    points = [point(1, 100, 10), point(2, 200, 11), point(4, 300, 12, stable=False),
              point(8, 310, 50, client_cpu_fraction=0.95, is_client_bound=True), point(16, 315, 200)]
    s = summarize_envelope(points, Slo(p99_ms=60))
    assert (s.knee, s.best, s.unstable, s.client_bound) == (2, 3, (2,), (3,))
    assert s.as_dict(points)["knee_load"] == 4 and s.as_dict(points)["best_load"] == 8


def test_window_and_point_figures_by_hand():
    reqs = [RecordedRequest(0.5, 999.0, False),  # warm-up: before the measured span
            RecordedRequest(1.2, 10.0, False), RecordedRequest(1.5, 20.0, False),
            RecordedRequest(2.4, 30.0, False), RecordedRequest(2.9, 5.0, True),
            RecordedRequest(3.1, 40.0, False)]
    w = window_stats(reqs, 1.0, 1.0)
    assert (w.num_requests, w.num_errors, w.throughput_rps) == (2, 0, 2.0)
    assert w.p99_ms == pytest.approx(10.0 + 0.99 * 10.0)
    p = summarize_point(reqs, load_kind="concurrency", load=4, start_s=1.0, end_s=3.0, is_stable=True, num_windows=2)
    assert (p.requests, p.errors, p.throughput_rps) == (3, 1, 1.5)
    assert p.p50_ms == pytest.approx(20.0) and p.p90_ms == pytest.approx(28.0)
    assert p.error_rate == 0.25 and p.ttft_p50_ms is None and p.output_tokens_per_s is None


def test_generation_point_from_event_context():
    def event(done, e2e, ttft, itl, n):
        return RecordedRequest.from_event(done, e2e, None, {"ttft_ms": ttft, "itl_ms": itl, "num_output_tokens": n})
    reqs = [event(1.0, 300.0, 100.0, [50.0, 50.0, 100.0], 4), event(1.5, 500.0, 200.0, [300.0], 2)]
    p = summarize_point(reqs, load_kind="rate", load=2, start_s=0.0, end_s=2.0, is_stable=False, num_windows=1)
    assert p.ttft_p50_ms == pytest.approx(150.0)
    # TPOT: (200 - 0) / 3 = 66.7 ms and 300 ms
    assert p.tpot_p50_ms == pytest.approx((200.0 / 3 + 300.0) / 2)
    assert p.output_tokens_per_s == 3.0


def test_late_dispatches_and_failures_from_events():
    reqs = [RecordedRequest.from_event(1.0, 10.0, None, {"scheduled_at": 0.9, "late_ms": 50.0}),
            RecordedRequest.from_event(1.1, 10.0, None, {"late_ms": 1.0}),
            RecordedRequest.from_event(1.2, 3.0, RuntimeError("refused"), None)]
    p = summarize_point(reqs, load_kind="rate", load=3, start_s=0.0, end_s=2.0, is_stable=True, num_windows=1)
    assert (p.late_dispatches, p.errors, p.requests) == (1, 1, 2)

"""The envelope's analysis, pure: when a point is stable, where the latency curve bends (the knee),
which point carries the most throughput under an SLO, and which configurations sit on the
throughput/latency Pareto frontier. Numbers in, numbers out; no I/O."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

STABILITY_WINDOWS = 3
STABILITY_TOLERANCE = 0.10
_EPS = 1e-9  # 1.1 / 1.0 - 1 is 0.10000000000000009 in floating point: a 10 % spread must still pass


@dataclass(frozen=True)
class WindowStats:
    """The requests that completed in one measurement window."""

    start_s: float
    duration_s: float
    num_requests: int  # successful
    num_errors: int
    p99_ms: float | None

    @property
    def throughput_rps(self) -> float:
        return self.num_requests / self.duration_s


def spread(values: Sequence[float]) -> float:
    """max / min - 1: perf_analyzer's stability measure (its --stability-percentage compares the
    largest and smallest of the last 3 measurements). Infinite when the smallest is zero."""
    low, high = min(values), max(values)
    if low <= 0:
        return 0.0 if high == low else float("inf")
    return high / low - 1.0


def is_stable(windows: Sequence[WindowStats], num_windows: int = STABILITY_WINDOWS,
              tolerance: float = STABILITY_TOLERANCE) -> bool:
    """Stable when each of the last `num_windows` windows completed requests and both their
    throughputs and their p99 latencies have a spread (max / min - 1) of at most `tolerance`."""
    if len(windows) < num_windows:
        return False
    last = windows[-num_windows:]
    if any(w.num_requests == 0 or w.p99_ms is None for w in last):
        return False  # an idle window says nothing about the rate the system holds
    return (spread([w.throughput_rps for w in last]) <= tolerance + _EPS
            and spread([w.p99_ms for w in last]) <= tolerance + _EPS)


def find_knee(throughputs: Sequence[float], latencies: Sequence[float]) -> int | None:
    """Index of the knee of latency against throughput, the points given in order of offered load.

    Method (Kneedle's, Satopaa et al. 2011): scale both axes to [0, 1] over their ranges and take the
    point farthest below the diagonal from (least throughput, least latency) to (most throughput,
    most latency), i.e. the largest `throughput - latency` in scaled units. For the usual curve the
    diagonal is the chord from the lightest load's point to the heaviest's; the knee is where
    latency was still low for the throughput it gave, and past it each further request/s costs
    disproportionately more latency. When throughput only falls as load grows, the lightest load is
    the knee (the server was saturated from the start). None with fewer than 3 points, or when no
    point lies below the diagonal (latency grew no slower than throughput: there is no bend)."""
    if len(throughputs) != len(latencies):
        raise ValueError(f"{len(throughputs)} throughputs but {len(latencies)} latencies")
    if len(throughputs) < 3:
        return None
    xs, ys = _unit_scale(throughputs), _unit_scale(latencies)
    below = [x - y for x, y in zip(xs, ys)]  # sqrt(2) x the distance below the diagonal
    best = max(range(len(xs)), key=lambda i: below[i])
    return best if below[best] > _EPS else None


def _unit_scale(values: Sequence[float]) -> list[float]:
    low, high = min(values), max(values)
    return [0.0 if high == low else (v - low) / (high - low) for v in values]


@dataclass(frozen=True)
class Slo:
    """A latency budget: every limit that is set must hold at p99; errors at most max_error_rate."""

    p99_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    max_error_rate: float = 0.0

    def __post_init__(self):
        for name in ("p99_ms", "ttft_p99_ms", "tpot_p99_ms"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"SLO {name} must be > 0 ms, got {value}")
        if not 0 <= self.max_error_rate < 1:
            raise ValueError(f"SLO max_error_rate must be in [0, 1), got {self.max_error_rate}")

    @property
    def is_set(self) -> bool:
        return any(v is not None for v in (self.p99_ms, self.ttft_p99_ms, self.tpot_p99_ms))

    def describe(self) -> str:
        parts = [f"{label} p99 <= {v:g} ms" for label, v in
                 (("latency", self.p99_ms), ("TTFT", self.ttft_p99_ms), ("TPOT", self.tpot_p99_ms)) if v is not None]
        return ", ".join(parts) + f", errors <= {100 * self.max_error_rate:g} %"

    def is_met_by(self, point) -> bool:
        for limit, measured in ((self.p99_ms, point.p99_ms), (self.ttft_p99_ms, point.ttft_p99_ms),
                                (self.tpot_p99_ms, point.tpot_p99_ms)):
            if limit is not None and (measured is None or measured > limit):
                return False
        return point.requests > 0 and point.error_rate <= self.max_error_rate + _EPS


def best_under_slo(points: Sequence, slo: Slo):
    """The point with the most throughput among those that meet the SLO. Stable points win over
    unstable ones (an unstable point's figures may not hold); None when no point meets it."""
    meeting = [p for p in points if slo.is_met_by(p)]
    if not meeting:
        return None
    stable = [p for p in meeting if p.is_stable]
    return max(stable or meeting, key=lambda p: p.throughput_rps)


def pareto_frontier(points: Sequence) -> list:
    """The points that no other point beats on both axes (more throughput and lower p99, one of
    them strictly), in order of throughput. Points without a p99 are left out."""
    measured = [p for p in points if p.p99_ms is not None and p.requests > 0]
    frontier = [p for p in measured if not any(
        q.throughput_rps >= p.throughput_rps and q.p99_ms <= p.p99_ms
        and (q.throughput_rps > p.throughput_rps or q.p99_ms < p.p99_ms) for q in measured)]
    return sorted(frontier, key=lambda p: (p.throughput_rps, p.p99_ms))


@dataclass(frozen=True)
class EnvelopeSummary:
    """What the report says about a sweep of points; indices are into the points in load order."""

    knee: int | None
    best: int | None  # the most throughput under the SLO; None without an SLO or when none meets it
    unstable: tuple[int, ...]
    client_bound: tuple[int, ...]
    slo: Slo

    def as_dict(self, points: Sequence) -> dict:
        def load_of(i):
            return None if i is None else points[i].load
        return {"knee_load": load_of(self.knee), "best_load": load_of(self.best),
                "unstable_loads": [points[i].load for i in self.unstable],
                "client_bound_loads": [points[i].load for i in self.client_bound],
                "slo": {"p99_ms": self.slo.p99_ms, "ttft_p99_ms": self.slo.ttft_p99_ms,
                        "tpot_p99_ms": self.slo.tpot_p99_ms, "max_error_rate": self.slo.max_error_rate}}


def summarize_envelope(points: Sequence, slo: Slo) -> EnvelopeSummary:
    measured = [i for i, p in enumerate(points) if p.p99_ms is not None]
    knee = find_knee([points[i].throughput_rps for i in measured], [points[i].p99_ms for i in measured])
    best = best_under_slo(points, slo) if slo.is_set else None
    return EnvelopeSummary(
        knee=None if knee is None else measured[knee],
        best=None if best is None else next(i for i, p in enumerate(points) if p is best),
        unstable=tuple(i for i, p in enumerate(points) if not p.is_stable),
        client_bound=tuple(i for i, p in enumerate(points) if p.is_client_bound),
        slo=slo,
    )

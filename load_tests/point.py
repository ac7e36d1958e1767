"""One point of the envelope: the requests that completed while it ran, cut into time windows, and
the figures reported for it. Pure: Locust's request events come in, numbers go out.

The latency math is clients/timing.py's, and token times are read from an event's context as
load_tests/token_stats.py reads them; this module only decides which requests count."""
from __future__ import annotations

from dataclasses import dataclass, fields

from clients.timing import RequestTiming, percentile
from load_tests.analysis import WindowStats
from load_tests.token_stats import timing_from_context

QUANTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class RecordedRequest:
    done_s: float  # monotonic clock when its request event fired
    latency_ms: float  # from the (scheduled) send to the last byte
    is_error: bool
    token_timing: RequestTiming | None = None  # generation: when each token arrived
    late_ms: float | None = None  # open loop: how late the arrival scheduler dispatched it

    @classmethod
    def from_event(cls, done_s: float, response_time: float, exception, context: dict | None) -> "RecordedRequest":
        context = context or {}
        return cls(done_s=done_s, latency_ms=float(response_time), is_error=exception is not None,
                   token_timing=timing_from_context(context, float(response_time)), late_ms=context.get("late_ms"))

    def timing(self) -> RequestTiming:
        return self.token_timing or RequestTiming(None, self.latency_ms / 1e3, 0)


@dataclass
class PointResult:
    """What the report shows for one point; flat, so that it is one CSV row."""

    load_kind: str  # "concurrency" (closed loop) or "rate" (open loop, requests/s offered)
    load: float
    duration_s: float  # the measured windows only, warm-up excluded
    requests: int
    errors: int
    throughput_rps: float
    p50_ms: float | None
    p90_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    is_stable: bool
    num_windows: int
    variant: str = ""
    output_tokens_per_s: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    ttft_p95_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p90_ms: float | None = None
    tpot_p95_ms: float | None = None
    tpot_p99_ms: float | None = None
    late_dispatches: int = 0  # open loop: sent later than scheduled by more than the tolerance
    cap_hits: int = 0  # open loop, whole point: arrivals that found every user busy and waited
    avg_batch_size: float | None = None  # server: inferences per execution
    avg_queue_us: float | None = None  # server: per request
    avg_compute_us: float | None = None  # server: per request
    engine_batch_size: float | None = None  # server, generation: mean sequences per engine step
    server_failures: int | None = None
    client_cpu_fraction: float | None = None  # load generator CPU seconds per wall second
    is_client_bound: bool = False

    @property
    def error_rate(self) -> float:
        total = self.requests + self.errors
        return self.errors / total if total else 0.0


POINT_FIELDS = tuple(f.name for f in fields(PointResult))


def window_stats(requests: list[RecordedRequest], start_s: float, duration_s: float) -> WindowStats:
    inside = [r for r in requests if start_s <= r.done_s < start_s + duration_s]
    ok = [r.latency_ms for r in inside if not r.is_error]
    return WindowStats(start_s, duration_s, len(ok), len(inside) - len(ok), percentile(ok, 99))


def _ms_percentiles(values_s: list[float | None], prefix: str) -> dict:
    out = {}
    for q in QUANTILES:
        p = percentile(values_s, q)
        out[f"{prefix}p{q}_ms"] = None if p is None else 1e3 * p
    return out


def summarize_point(requests: list[RecordedRequest], *, load_kind: str, load: float, start_s: float,
                    end_s: float, is_stable: bool, num_windows: int, late_tolerance_ms: float = 10.0,
                    **extra) -> PointResult:
    """The figures of the requests that completed in [start_s, end_s); failures are counted, never
    averaged into latencies. `extra` carries the server and load-generator fields."""
    duration_s = end_s - start_s
    inside = [r for r in requests if start_s <= r.done_s < end_s]
    ok = [r for r in inside if not r.is_error]
    timings = [r.timing() for r in ok]
    figures = _ms_percentiles([t.e2e_s for t in timings], "")
    is_generation = any(t.token_times_s for t in timings)
    if is_generation:
        figures |= _ms_percentiles([t.ttft_s for t in timings], "ttft_")
        figures |= _ms_percentiles([t.tpot_s for t in timings], "tpot_")
        figures["output_tokens_per_s"] = sum(t.num_output_tokens for t in timings) / duration_s
    return PointResult(
        load_kind=load_kind, load=load, duration_s=duration_s, requests=len(ok), errors=len(inside) - len(ok),
        throughput_rps=len(ok) / duration_s, is_stable=is_stable, num_windows=num_windows,
        late_dispatches=sum(1 for r in inside if r.late_ms is not None and r.late_ms > late_tolerance_ms),
        **figures, **extra,
    )

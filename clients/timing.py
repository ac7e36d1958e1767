"""Latency math for generation, written once: TTFT, TPOT, inter-token latencies, percentiles and
throughput, from per-token timestamps measured from each request's scheduled send time."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RequestTiming:
    """One request: when each output token arrived, in seconds after the request was due to be sent
    (the scheduled time, so that queueing before the send counts: no coordinated omission)."""

    token_times_s: tuple[float, ...] | None  # None when the system reports no per-token times
    e2e_s: float
    num_output_tokens: int

    @property
    def ttft_s(self) -> float | None:
        return self.token_times_s[0] if self.token_times_s else None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (last - first) / (n - 1)."""
        times = self.token_times_s
        if not times or len(times) < 2:
            return None
        return (times[-1] - times[0]) / (len(times) - 1)

    @property
    def itls_s(self) -> list[float]:
        """Inter-token latencies: the gaps between consecutive tokens."""
        times = self.token_times_s or ()
        return [b - a for a, b in zip(times, times[1:])]


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (linear interpolation, as numpy), None for no values."""
    clean = [v for v in values if v is not None]
    return float(np.percentile(clean, q)) if clean else None


def summarize(timings: list[RequestTiming], duration_s: float) -> dict:
    """Throughput and latency percentiles of one run, in ms and per second."""
    def ms(values, q):
        p = percentile(values, q)
        return None if p is None else 1e3 * p

    ttfts = [t.ttft_s for t in timings]
    tpots = [t.tpot_s for t in timings]
    itls = [gap for t in timings for gap in t.itls_s]
    e2es = [t.e2e_s for t in timings]
    output_tokens = sum(t.num_output_tokens for t in timings)
    return {
        "requests": len(timings),
        "output_tokens": output_tokens,
        "duration_s": duration_s,
        "output_tokens_per_s": output_tokens / duration_s if duration_s > 0 else None,
        "requests_per_s": len(timings) / duration_s if duration_s > 0 else None,
        "ttft_p50_ms": ms(ttfts, 50), "ttft_p99_ms": ms(ttfts, 99),
        "tpot_p50_ms": ms(tpots, 50), "tpot_p99_ms": ms(tpots, 99),
        "itl_p50_ms": ms(itls, 50), "itl_p99_ms": ms(itls, 99),
        "e2e_p50_ms": ms(e2es, 50), "e2e_p99_ms": ms(e2es, 99),
    }

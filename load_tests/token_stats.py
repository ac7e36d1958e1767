"""Token-level statistics of generation requests (TTFT, TPOT, ITL, output tokens/s), kept apart from
Locust's request stats so that per-token numbers never count as requests.

Fed from the `context` of each successful request event ("ttft_ms", "itl_ms", "num_output_tokens"),
merged from workers to the master with their reports, shown in the web UI and written as
<csv prefix>_tokens.csv. The percentile math is clients/timing.py's.

Memory is bounded however long the run: counts, token totals and sums are exact, and each
percentile is computed from a seeded uniform sample (a reservoir) of at most `capacity` values per
statistic (10,000 by default). Up to `capacity` values the percentiles are exact; beyond, the
q-th percentile is the sample's, whose rank is off by about 100 * sqrt(q(1-q)/capacity) percentile
points (one standard deviation): ±0.1 at p99 and ±0.5 at p50 for 10,000, so the reported p99 lies
between the true p98.8 and p99.2 in about 19 runs of 20.
State lives on the gevent hub thread of its process.
"""
from __future__ import annotations

import csv
import random
import time
import weakref
from itertools import accumulate
from pathlib import Path

from clients.timing import RequestTiming, percentile

_REPORT_KEY = "batchwise_tokens"
PERCENTILES = (50, 90, 95, 99)
METRICS = ("ttft", "tpot", "itl", "e2e")
DEFAULT_CAPACITY = 10_000


def timing_from_context(context: dict, response_time_ms: float) -> RequestTiming | None:
    """The request's token times (seconds from its scheduled or actual send) from a request
    event's context; None when the event carries no token timings."""
    if not context or context.get("ttft_ms") is None:
        return None
    times_ms = list(accumulate([context["ttft_ms"], *context.get("itl_ms", ())]))
    return RequestTiming(tuple(t / 1e3 for t in times_ms), response_time_ms / 1e3,
                         int(context.get("num_output_tokens", len(times_ms))))


class Reservoir:
    """Every value's count and sum, and a uniform random sample of at most `capacity` of them
    (Vitter's algorithm R): each value seen so far is in the sample with the same probability."""

    def __init__(self, capacity: int, seed: str):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.count = 0
        self.total = 0.0
        self.values: list[float] = []
        self._rng = random.Random(seed)

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        if len(self.values) < self.capacity:
            self.values.append(value)
        elif (slot := self._rng.randrange(self.count)) < self.capacity:
            self.values[slot] = value

    def merge(self, count: int, total: float, values: list[float]) -> None:
        """Add another reservoir's contents (a sample of `values` out of `count`). The merged sample
        stays uniform over both: how many slots each side keeps is drawn as sampling without
        replacement from the two populations would draw it (hypergeometric)."""
        if count == 0:
            return
        mine, n_mine = self.values, self.count
        self.count += count
        self.total += total
        if len(mine) == n_mine and len(values) == count and self.count <= self.capacity:
            self.values = mine + list(values)  # both complete, and together they still fit
            return
        # Both samples hold min(their count, capacity) values (one capacity on master and workers),
        # so neither side is asked for more than it has.
        from_mine = sum(1 for i in self._rng.sample(range(self.count), self.capacity) if i < n_mine)
        from_other = self.capacity - from_mine
        assert from_mine <= len(mine) and from_other <= len(values), "reservoirs of different capacities"
        self.values = self._rng.sample(mine, from_mine) + self._rng.sample(list(values), from_other)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def to_report(self) -> list:
        return [self.count, self.total, list(self.values)]


class TokenSeries:
    """One (request type, name): exact request and token counts, a reservoir per statistic."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, seed: str = "0"):
        self.capacity, self.seed = capacity, seed
        self.requests = 0
        self.output_tokens = 0
        self.metrics = {m: Reservoir(capacity, f"{seed}/{m}") for m in METRICS}

    def add(self, timing: RequestTiming) -> None:
        self.requests += 1
        self.output_tokens += timing.num_output_tokens
        for metric, value in (("ttft", timing.ttft_s), ("tpot", timing.tpot_s), ("e2e", timing.e2e_s)):
            if value is not None:
                self.metrics[metric].add(value)
        for gap in timing.itls_s:
            self.metrics["itl"].add(gap)

    def merge_report(self, report: dict) -> None:
        self.requests += report["requests"]
        self.output_tokens += report["output_tokens"]
        for metric, (count, total, values) in report["metrics"].items():
            self.metrics[metric].merge(count, total, values)

    def to_report(self) -> dict:
        return {"requests": self.requests, "output_tokens": self.output_tokens,
                "metrics": {m: r.to_report() for m, r in self.metrics.items()}}

    def row(self, name: str, duration_s: float) -> dict:
        """Times in ms: the percentiles of each statistic's sample and the exact mean."""
        row = {"name": name, "requests": self.requests, "output_tokens": self.output_tokens,
               "output_tokens_per_s": round(self.output_tokens / duration_s, 2) if duration_s > 0 else None}
        for metric, reservoir in self.metrics.items():
            for q in PERCENTILES:
                p = percentile(reservoir.values, q)
                row[f"{metric}_p{q}_ms"] = None if p is None else round(1e3 * p, 2)
            row[f"{metric}_mean_ms"] = None if reservoir.mean is None else round(1e3 * reservoir.mean, 2)
        return row


class TokenStats:
    def __init__(self, capacity: int = DEFAULT_CAPACITY, seed: int = 0):
        self.capacity, self.seed = capacity, seed
        self.series: dict[tuple[str, str], TokenSeries] = {}
        self.started_at = time.time()
        self.stopped_at: float | None = None

    def reset(self) -> None:
        self.series.clear()
        self.started_at, self.stopped_at = time.time(), None

    def _series(self, request_type: str, name: str) -> TokenSeries:
        key = (request_type, name)
        if key not in self.series:
            self.series[key] = TokenSeries(self.capacity, f"{self.seed}/{request_type}/{name}")
        return self.series[key]

    def record(self, request_type: str, name: str, timing: RequestTiming) -> None:
        self._series(request_type, name).add(timing)

    @property
    def duration_s(self) -> float:
        return (self.stopped_at or time.time()) - self.started_at

    def take_report(self) -> list:
        """What a worker sends to the master: everything since its last report (then forgotten),
        at most `capacity` values per statistic and series."""
        report = [[t, n, series.to_report()] for (t, n), series in self.series.items()]
        self.series.clear()
        return report

    def merge_report(self, report: list) -> None:
        for request_type, name, data in report:
            self._series(request_type, name).merge_report(data)

    def rows(self) -> list[dict]:
        """One row per (request type, name), then "Aggregated"; times in ms."""
        rows = [s.row(f"{t} {n}", self.duration_s) for (t, n), s in sorted(self.series.items())]
        if len(rows) > 1:
            total = TokenSeries(self.capacity, f"{self.seed}/Aggregated")
            for _, series in sorted(self.series.items()):
                total.merge_report(series.to_report())
            rows.append(total.row("Aggregated", self.duration_s))
        return rows


def summarize_row(name: str, timings: list[RequestTiming], duration_s: float,
                  capacity: int = DEFAULT_CAPACITY) -> dict:
    """The row of a list of requests (exact below `capacity` values per statistic)."""
    series = TokenSeries(capacity)
    for timing in timings:
        series.add(timing)
    return series.row(name, duration_s)


def write_csv(token_stats: TokenStats, path: Path) -> None:
    rows = token_stats.rows()
    if rows:
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def format_table(rows: list[dict]) -> str:
    head = (f"{'Name':30s} {'reqs':>6s} {'tokens':>8s} {'tok/s':>8s} {'TTFT p50':>9s} {'p99':>8s} "
            f"{'TPOT p50':>9s} {'p99':>8s} {'ITL p50':>8s} {'p99':>8s}   (ms)")
    def f(v):
        return "-" if v is None else f"{v:.1f}"
    lines = [head] + [
        f"{r['name'][:30]:30s} {r['requests']:6d} {r['output_tokens']:8d} {f(r['output_tokens_per_s']):>8s} "
        f"{f(r['ttft_p50_ms']):>9s} {f(r['ttft_p99_ms']):>8s} {f(r['tpot_p50_ms']):>9s} {f(r['tpot_p99_ms']):>8s} "
        f"{f(r['itl_p50_ms']):>8s} {f(r['itl_p99_ms']):>8s}" for r in rows]
    return "\n".join(lines)


_stats: "weakref.WeakKeyDictionary[object, TokenStats]" = weakref.WeakKeyDictionary()


def for_environment(environment) -> TokenStats | None:
    return _stats.get(environment)


def attach(environment) -> TokenStats:
    """Collect token stats for this environment (once): from its request events, and on a master
    from the workers' reports."""
    if environment in _stats:
        return _stats[environment]
    stats = _stats[environment] = TokenStats()
    events = environment.events

    def on_request(request_type, name, response_time, exception=None, context=None, **_kw):
        if exception is None and (timing := timing_from_context(context, response_time)) is not None:
            stats.record(request_type, name, timing)

    def on_report_to_master(client_id, data, **_kw):
        data[_REPORT_KEY] = stats.take_report()

    def on_worker_report(client_id, data, **_kw):
        stats.merge_report(data.get(_REPORT_KEY, []))

    def on_stop(**_kw):
        stats.stopped_at = time.time()

    events.request.add_listener(on_request)
    events.report_to_master.add_listener(on_report_to_master)
    events.worker_report.add_listener(on_worker_report)
    events.test_start.add_listener(lambda **_kw: stats.reset())
    events.reset_stats.add_listener(lambda **_kw: stats.reset())
    events.test_stop.add_listener(on_stop)
    return stats

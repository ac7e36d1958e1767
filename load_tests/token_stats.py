"""Token-level statistics of generation requests (TTFT, TPOT, ITL, output tokens/s), kept apart from
Locust's request stats so that per-token numbers never count as requests.

Fed from the `context` of each successful request event ("ttft_ms", "itl_ms", "num_output_tokens"),
merged from workers to the master with their reports, shown in the web UI and written as
<csv prefix>_tokens.csv. The percentile math is clients/timing.py's.
State lives on the gevent hub thread of its process.
"""
from __future__ import annotations

import csv
import time
import weakref
from itertools import accumulate
from pathlib import Path

from clients.timing import RequestTiming, percentile

_REPORT_KEY = "batchwise_tokens"
PERCENTILES = (50, 90, 95, 99)


def timing_from_context(context: dict, response_time_ms: float) -> RequestTiming | None:
    """The request's token times (seconds from its scheduled or actual send) from a request
    event's context; None when the event carries no token timings."""
    if not context or context.get("ttft_ms") is None:
        return None
    times_ms = list(accumulate([context["ttft_ms"], *context.get("itl_ms", ())]))
    return RequestTiming(tuple(t / 1e3 for t in times_ms), response_time_ms / 1e3,
                         int(context.get("num_output_tokens", len(times_ms))))


class TokenStats:
    def __init__(self):
        self.timings: dict[tuple[str, str], list[RequestTiming]] = {}
        self.started_at = time.time()
        self.stopped_at: float | None = None

    def reset(self) -> None:
        self.timings.clear()
        self.started_at, self.stopped_at = time.time(), None

    def record(self, request_type: str, name: str, timing: RequestTiming) -> None:
        self.timings.setdefault((request_type, name), []).append(timing)

    @property
    def duration_s(self) -> float:
        return (self.stopped_at or time.time()) - self.started_at

    def take_report(self) -> list:
        """What a worker sends to the master: everything since its last report (then forgotten)."""
        report = [[t, n, [[list(x.token_times_s or ()), x.e2e_s, x.num_output_tokens] for x in xs]]
                  for (t, n), xs in self.timings.items()]
        self.timings.clear()
        return report

    def merge_report(self, report: list) -> None:
        for request_type, name, rows in report:
            for times, e2e_s, num_tokens in rows:
                self.record(request_type, name, RequestTiming(tuple(times), e2e_s, num_tokens))

    def rows(self) -> list[dict]:
        """One row per (request type, name), then "Aggregated"; times in ms."""
        rows = [summarize_row(f"{t} {n}", xs, self.duration_s) for (t, n), xs in sorted(self.timings.items())]
        if len(rows) > 1:
            rows.append(summarize_row("Aggregated", [x for xs in self.timings.values() for x in xs], self.duration_s))
        return rows


def summarize_row(name: str, timings: list[RequestTiming], duration_s: float) -> dict:
    def ms(values, q):
        p = percentile(values, q)
        return None if p is None else round(1e3 * p, 2)

    num_tokens = sum(t.num_output_tokens for t in timings)
    row = {"name": name, "requests": len(timings), "output_tokens": num_tokens,
           "output_tokens_per_s": round(num_tokens / duration_s, 2) if duration_s > 0 else None}
    series = {"ttft": [t.ttft_s for t in timings], "tpot": [t.tpot_s for t in timings],
              "itl": [gap for t in timings for gap in t.itls_s], "e2e": [t.e2e_s for t in timings]}
    for metric, values in series.items():
        for q in PERCENTILES:
            row[f"{metric}_p{q}_ms"] = ms(values, q)
    return row


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

"""Runs one point of the envelope with Locust as a library: start the users, discard the warm-up,
then close a window every `window_s` until the last windows are stable or the point has run every
whole window that its duration holds.

Everything here runs in Locust's gevent loop on one OS thread: the recorder's list is appended by
request-event listeners and read between windows by the same thread, so it needs no lock."""
from __future__ import annotations

import resource
import time
from dataclasses import dataclass
from typing import Callable

import gevent
from locust.env import Environment

from load_tests import open_loop

from load_tests.analysis import STABILITY_TOLERANCE, STABILITY_WINDOWS, WindowStats, is_stable
from load_tests.point import PointResult, RecordedRequest, summarize_point, window_stats
from load_tests.server_stats import Snapshot, server_figures, take_snapshot

CLIENT_BOUND_FRACTION = 0.9  # Locust drives all its users from one core per process
MAX_SPAWN_RATE = 100


def whole_windows(duration_s: float, warmup_s: float, window_s: float) -> int:
    """The whole windows that fit in a point's duration after its warm-up."""
    return int((duration_s - warmup_s) / window_s + 1e-9)  # 1e-9: (7 - 0.4) / 2.2 is 2.9999999999999996


@dataclass(frozen=True)
class PointTiming:
    duration_s: float  # warm-up and every window; the fetches of server stats between windows add a little
    warmup_s: float
    window_s: float
    tolerance: float = STABILITY_TOLERANCE

    def __post_init__(self):
        if self.max_windows < STABILITY_WINDOWS:
            raise ValueError(f"--duration {self.duration_s:g} s leaves no room for the warm-up ({self.warmup_s:g} s) "
                             f"and the {STABILITY_WINDOWS} windows of {self.window_s:g} s that stability needs")

    @property
    def max_windows(self) -> int:
        return whole_windows(self.duration_s, self.warmup_s, self.window_s)


@dataclass(frozen=True)
class ServerAddress:
    http_url: str  # HOST:PORT of Triton's HTTP endpoint: model stats
    metrics_url: str | None  # http://HOST:PORT/metrics, or None to skip the metrics
    model: str


class Recorder:
    """Every request event of one point, stamped with the monotonic time it fired."""

    def __init__(self):
        self.requests: list[RecordedRequest] = []
        self.first_error: str | None = None

    def on_request(self, response_time=0.0, exception=None, context=None, **_):
        self.requests.append(RecordedRequest.from_event(time.monotonic(), response_time, exception, context))
        if exception is not None and self.first_error is None:
            self.first_error = f"{type(exception).__name__}: {exception}"


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_point(user_class: type, user_count: int, load_kind: str, load: float, timing: PointTiming,
              server: ServerAddress, host: str,
              on_window: Callable[[int, WindowStats, float], None]) -> tuple[PointResult, str | None]:
    """One point: `user_count` users of `user_class` against `host`. Returns the point and the first
    error message seen (None when every request succeeded)."""
    env = Environment(user_classes=[user_class], host=host, catch_exceptions=True)
    recorder = Recorder()
    env.events.request.add_listener(recorder.on_request)
    runner = env.create_local_runner()
    # As fast as Locust allows (it warns past 100 users/s): the ramp is not what is measured, and the
    # point's clock starts once every user is running.
    runner.start(user_count, spawn_rate=min(user_count, MAX_SPAWN_RATE))
    runner.spawning_greenlet.join()
    started = time.monotonic()
    try:
        gevent.sleep(max(0.0, started + timing.warmup_s - time.monotonic()))
        windows: list[WindowStats] = []
        snapshots: list[Snapshot] = [take_snapshot(server.http_url, server.metrics_url, server.model)]
        cpu_marks = [(_cpu_s(), time.monotonic())]
        window_start = time.monotonic()
        while True:
            gevent.sleep(max(0.0, window_start + timing.window_s - time.monotonic()))
            window_end = time.monotonic()
            windows.append(window_stats(recorder.requests, window_start, window_end - window_start))
            snapshots.append(take_snapshot(server.http_url, server.metrics_url, server.model))
            cpu_marks.append((_cpu_s(), time.monotonic()))
            on_window(len(windows), windows[-1], window_end - started)
            stable = is_stable(windows, STABILITY_WINDOWS, timing.tolerance)
            # Counted, not timed against the duration: the stats fetches between windows take time, and
            # a point given room for 3 windows must get all 3.
            if stable or len(windows) >= timing.max_windows:
                break
            window_start = window_end
    finally:
        env.events.request.remove_listener(recorder.on_request)
        runner.quit()
    cap_hits = sum(s.cap_hits for s in open_loop.stats(env))
    # The point's figures come from the windows the stability rule judged, as perf_analyzer reports
    # its last measurements; an unstable point keeps those same windows, flagged.
    judged = windows[-STABILITY_WINDOWS:]
    first = len(windows) - len(judged)
    (cpu0, wall0), (cpu1, wall1) = cpu_marks[first], cpu_marks[-1]
    cpu_fraction = (cpu1 - cpu0) / (wall1 - wall0) if wall1 > wall0 else None
    figures = server_figures(snapshots[first:])
    point = summarize_point(
        recorder.requests, load_kind=load_kind, load=load, start_s=judged[0].start_s,
        end_s=judged[-1].start_s + judged[-1].duration_s, is_stable=stable, num_windows=len(windows),
        client_cpu_fraction=cpu_fraction, cap_hits=cap_hits,
        is_client_bound=cpu_fraction is not None and cpu_fraction >= CLIENT_BOUND_FRACTION,
        **figures.as_point_fields(),
    )
    return point, recorder.first_error

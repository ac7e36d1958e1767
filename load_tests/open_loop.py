"""The open-loop dispatcher: one greenlet per user class per Locust process sends requests at the
times of an ArrivalProcess, whatever the server's latency, by handing each arrival to an idle user
(the users are the pool of clients; one request in flight per user, so `-u` is the in-flight cap).

The rate is split across worker processes (worker index / `--expect-workers`, which `--processes N`
sets to N). When every user is busy at an arrival, the arrival waits for the next free user: it is
counted in `cap_hits` and sent late, and its latency still counts from its scheduled time.
State lives on the gevent hub thread of its process; counters reach the master in worker reports.
"""
from __future__ import annotations

import csv
import logging
import time
import weakref
from pathlib import Path

import gevent
from gevent.event import AsyncResult
from gevent.queue import Empty, Queue

from .arrivals import ArrivalProcess, OpenLoopStats

logger = logging.getLogger(__name__)
_REPORT_KEY = "batchwise_open_loop"


class Dispatcher:
    def __init__(self, process: ArrivalProcess, name: str, late_threshold_ms: float):
        self.process = process
        self.stats = OpenLoopStats(name, process.rate_per_s, late_threshold_ms=late_threshold_ms)
        self._idle: Queue = Queue()  # (user's slot, alive flag) of users waiting for an arrival
        self._greenlet: gevent.Greenlet | None = None
        self._started_at: float | None = None
        self._stopped_at: float | None = None
        self._num_users = 0
        self._window_s = process.pinned_window_s
        # pinned only: arrivals by the window of their scheduled time, requests by that of their send
        self._scheduled_per_window: list[int] = []
        self._sent_per_window: list[int] = []
        # unpinned: a second pass over the same seeded schedule counts the arrivals due so far, so a
        # dispatcher that falls behind (its loop waiting for a free user) shows as scheduled > sent
        self._due_offsets = None
        self._num_due = 0
        self._next_due_s = 0.0

    @property
    def is_stopped(self) -> bool:
        return self._stopped_at is not None

    def serve(self, user) -> None:
        """Run in a user's task greenlet: wait for an arrival, send it, repeat; return when the
        dispatcher stops (or the user's greenlet is killed)."""
        if self.is_stopped:
            return
        self._num_users += 1
        self.stats.num_users = max(self.stats.num_users, self._num_users)
        if self._greenlet is None:
            self._greenlet = gevent.spawn(self._run)
        alive = [True]
        try:
            while not self.is_stopped:
                slot = AsyncResult()
                self._idle.put((slot, alive))
                if (scheduled_at := slot.get()) is None:
                    return
                user.call(scheduled_at=scheduled_at)
        finally:
            alive[0] = False
            self._num_users -= 1

    def stop(self) -> None:
        """End the schedule; idle users return from serve(), busy ones after their request."""
        if self.is_stopped:
            return
        self._stopped_at = time.perf_counter()
        if self._greenlet is not None:
            self._greenlet.kill(block=False)
        while (slot := self._next_user(block=False)) is not None:
            slot.set(None)

    def snapshot(self) -> OpenLoopStats:
        stats = self.stats
        if self._started_at is not None:
            stats.elapsed_s = (self._stopped_at or time.perf_counter()) - self._started_at
            whole = int(stats.elapsed_s // self._window_s) if self._window_s else 0
            if whole:  # pinned: whole windows hold exactly their share of the target rate
                stats.measured_s = whole * self._window_s
                scheduled, sent = sum(self._scheduled_per_window[:whole]), sum(self._sent_per_window[:whole])
            else:
                stats.measured_s = stats.elapsed_s
                scheduled, sent = max(stats.scheduled, self._arrivals_due(stats.elapsed_s)), stats.sent
            if stats.measured_s > 0:
                stats.scheduled_rate_per_s = scheduled / stats.measured_s
                stats.achieved_rate_per_s = sent / stats.measured_s
            snapshot = OpenLoopStats.from_dict(stats.to_dict())
            if not whole:
                snapshot.scheduled = scheduled
            return snapshot
        return OpenLoopStats.from_dict(stats.to_dict())

    def _arrivals_due(self, elapsed_s: float) -> int:
        """How many arrivals the schedule holds at offsets <= elapsed_s, reached by the dispatcher
        or not."""
        if self._due_offsets is None:
            self._due_offsets = self.process.offsets()
            self._next_due_s = next(self._due_offsets)
        while self._next_due_s <= elapsed_s:
            self._num_due += 1
            self._next_due_s = next(self._due_offsets)
        return self._num_due

    def _next_user(self, block: bool) -> AsyncResult | None:
        """The slot of an idle user that is still alive; None when none is idle and not `block`."""
        while True:
            try:
                slot, alive = self._idle.get(block=block)
            except Empty:
                return None
            if alive[0]:
                return slot

    def _run(self) -> None:
        stats, threshold_s = self.stats, self.stats.late_threshold_ms / 1e3
        self._started_at = start = time.perf_counter()
        for offset in self.process.offsets():
            due = start + offset
            while (delay := due - time.perf_counter()) > 0:  # a timer may fire a little early
                gevent.sleep(delay)
            if self.is_stopped:  # stop() ran while this greenlet's kill was still pending
                return
            stats.scheduled += 1
            if self._window_s:
                _count(self._scheduled_per_window, int(offset // self._window_s))
            slot = self._next_user(block=False)
            if slot is None:
                if stats.cap_hits == 0:
                    logger.warning("open loop %s: all %d users busy at an arrival; arrivals now wait for a free "
                                   "user (latency still counts from the scheduled time): raise -u", stats.name,
                                   self._num_users)
                stats.cap_hits += 1
                slot = self._next_user(block=True)
            now = time.perf_counter()
            stats.late += now - due > threshold_s
            stats.max_late_ms = max(stats.max_late_ms, (now - due) * 1e3)
            stats.sent += 1
            if self._window_s:
                _count(self._sent_per_window, int((now - start) // self._window_s))
            slot.set(due)


def _count(per_window: list[int], window: int) -> None:
    per_window.extend([0] * (window + 1 - len(per_window)))
    per_window[window] += 1


class _State:
    """Per environment: the local dispatchers, and on a master the workers' latest counters."""

    def __init__(self):
        self.dispatchers: dict[str, Dispatcher] = {}
        self.worker_reports: dict[str, list[dict]] = {}


_states: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def worker_index(environment) -> int:
    """This process's index among the load-generating processes (0 when it runs alone)."""
    from locust.runners import WorkerRunner

    return environment.runner.worker_index if isinstance(environment.runner, WorkerRunner) else 0


def worker_slot(environment) -> tuple[int, int]:
    """(index, count) of this process among the load-generating processes, for splitting a rate."""
    from locust.runners import WorkerRunner

    if not isinstance(environment.runner, WorkerRunner):
        return 0, 1
    index, count = worker_index(environment), int(getattr(environment.parsed_options, "expect_workers", 1) or 1)
    if index >= count:
        raise RuntimeError(
            f"open loop: this is worker {index + 1} but the master expects {count} (--expect-workers {count}), "
            f"so the rate cannot be split evenly. Start the master with --expect-workers N, N the number of "
            f"workers (`--processes N` sets it; docker compose: LOCUST_WORKERS=N with --scale locust-worker=N)")
    return index, count


def _check_worker_count(environment) -> None:
    """On a master: warn when the workers that run an open-loop test are not the ones the rate was
    split for (each worker sends 1/--expect-workers of it, so fewer workers send less)."""
    from locust.runners import MasterRunner

    runner = environment.runner
    if not isinstance(runner, MasterRunner) or not any(getattr(u, "arrival_rate", 0) > 0
                                                        for u in environment.user_classes):
        return
    expected = int(getattr(environment.parsed_options, "expect_workers", 1) or 1)
    if runner.worker_count != expected:
        logger.warning("open loop: %d workers connected but the rate is split across --expect-workers %d: "
                       "set --expect-workers (docker compose: LOCUST_WORKERS) to the number of workers",
                       runner.worker_count, expected)


def dispatcher_for(user) -> Dispatcher:
    attach(user.environment)
    state = _states[user.environment]
    name = type(user).__name__
    if name not in state.dispatchers:
        index, count = worker_slot(user.environment)
        process = ArrivalProcess(user.arrival_rate, user.arrival_distribution, user.arrival_cv, user.arrival_seed,
                                 user.arrival_window_s).share(index, count)
        state.dispatchers[name] = Dispatcher(process, name, user.late_threshold_ms)
    return state.dispatchers[name]


def stats(environment) -> list[OpenLoopStats]:
    """The run's open-loop counters per user class: this process's dispatchers, or on a master the
    sum over the workers' latest reports. Empty for a closed-loop run."""
    state = _states.get(environment)
    if state is None:
        return []
    parts: dict[str, list[OpenLoopStats]] = {}
    for name, dispatcher in state.dispatchers.items():
        parts.setdefault(name, []).append(dispatcher.snapshot())
    for reports in state.worker_reports.values():
        for report in reports:
            parts.setdefault(report["name"], []).append(OpenLoopStats.from_dict(report))
    return [OpenLoopStats.combine(p) for _, p in sorted(parts.items())]


def write_csv(environment, path: Path) -> None:
    rows = [s.to_dict() for s in stats(environment)]
    if rows:
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def attach(environment) -> None:
    """Hook the dispatchers into the environment's events (once per environment)."""
    if environment in _states:
        return
    state = _states[environment] = _State()
    events = environment.events

    def on_test_start(**_kw):
        for dispatcher in state.dispatchers.values():
            dispatcher.stop()
        state.dispatchers.clear()
        state.worker_reports.clear()
        _check_worker_count(environment)

    def on_test_stopping(**_kw):
        for dispatcher in state.dispatchers.values():
            dispatcher.stop()

    def on_report_to_master(client_id, data, **_kw):
        data[_REPORT_KEY] = [d.snapshot().to_dict() for d in state.dispatchers.values()]

    def on_worker_report(client_id, data, **_kw):
        if data.get(_REPORT_KEY):
            state.worker_reports[client_id] = data[_REPORT_KEY]

    events.test_start.add_listener(on_test_start)
    events.test_stopping.add_listener(on_test_stopping)
    events.report_to_master.add_listener(on_report_to_master)
    events.worker_report.add_listener(on_worker_report)

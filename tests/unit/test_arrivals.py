"""The open-loop arrival process (rate, CV, seeding, the split across workers, unpinned by default,
pinned windows on request) and the dispatcher's bookkeeping, driven with fake users on plain gevent
(no Locust, no server)."""
import time

import gevent
import numpy as np
import pytest
from gevent.event import Event

from load_tests.arrivals import ArrivalProcess, OpenLoopStats, interarrival_stats
from load_tests.open_loop import Dispatcher

N = 50_000


@pytest.mark.parametrize("window_s", [0, None, 5.0])
def test_poisson_has_the_target_rate_and_a_cv_of_one(window_s):
    rate, cv = interarrival_stats(ArrivalProcess(40.0, seed=1, window_s=window_s).sample(N))
    assert rate == pytest.approx(40.0, rel=0.02)
    assert cv == pytest.approx(1.0, abs=0.05 if window_s is None else 0.03)  # auto: 20 arrivals per window


@pytest.mark.parametrize("set_cv", [0.5, 2.0, 3.0])
@pytest.mark.parametrize("window_s", [0, 50.0])
def test_gamma_has_the_target_rate_and_the_set_cv(set_cv, window_s):
    rate, cv = interarrival_stats(ArrivalProcess(40.0, "gamma", cv=set_cv, seed=2, window_s=window_s).sample(N))
    assert rate == pytest.approx(40.0, rel=0.05)
    assert cv == pytest.approx(set_cv, rel=0.06)


def test_unconditioned_poisson_gaps_are_exponential():
    gaps = np.diff(np.concatenate([[0.0], ArrivalProcess(10.0, seed=3, window_s=0).sample(N)]))
    # P(gap > mean) = 1/e for an exponential distribution
    assert (gaps > 0.1).mean() == pytest.approx(np.exp(-1), abs=0.01)


def test_by_default_counts_vary_as_a_poisson_process_does():
    process = ArrivalProcess(20.0, seed=4)
    assert process.window_s == 0 and process.pinned_window_s is None
    counts = np.bincount((process.sample(40_000) // 1.0).astype(int))[:-1]
    # a Poisson count's variance equals its mean: the noise that queueing answers to is all there
    assert counts.mean() == pytest.approx(20.0, rel=0.02)
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.1)
    pinned = np.bincount((ArrivalProcess(20.0, seed=4, window_s=1.0).sample(40_000) // 1.0).astype(int))[:-1]
    assert pinned.var() == 0.0  # the variance reduction that pinning is, and what it hides


def test_pinned_windows_hold_exactly_their_share_of_arrivals():
    times = ArrivalProcess(20.0, seed=4, window_s=2.0).sample(4000)
    counts = np.bincount((times // 2.0).astype(int))
    assert set(counts[:-1].tolist()) == {40}  # the last window may be cut off by the sample's end
    # a fractional share is carried over: 2.5 arrivals per 1 s window alternate 2 and 3
    counts = np.bincount((ArrivalProcess(2.5, seed=4, window_s=1.0).sample(1000) // 1.0).astype(int))[:-1]
    assert set(counts.tolist()) == {2, 3} and counts.mean() == pytest.approx(2.5, abs=0.01)


def test_arrival_times_increase():
    for process in (ArrivalProcess(100.0, "gamma", cv=3.0, seed=5), ArrivalProcess(100.0, window_s=0)):
        assert np.all(np.diff(process.sample(5000)) >= 0)


def test_the_same_seed_gives_the_same_arrivals_and_another_seed_others():
    a = ArrivalProcess(30.0, "gamma", cv=2.0, seed=7).sample(500)
    assert np.array_equal(a, ArrivalProcess(30.0, "gamma", cv=2.0, seed=7).sample(500))
    assert not np.allclose(a, ArrivalProcess(30.0, "gamma", cv=2.0, seed=8).sample(500))


def test_worker_shares_split_the_rate_and_draw_independent_streams():
    process = ArrivalProcess(90.0, seed=9)
    shares = [process.share(i, 3) for i in range(3)]
    assert [s.rate_per_s for s in shares] == [30.0] * 3
    samples = [s.sample(20_000) for s in shares]
    assert not np.allclose(samples[0], samples[1])
    horizon = min(s[-1] for s in samples)
    merged = np.sort(np.concatenate([s[s <= horizon] for s in samples]))
    rate, cv = interarrival_stats(merged)
    assert rate == pytest.approx(90.0, rel=0.02)
    assert cv == pytest.approx(1.0, abs=0.05)  # the superposition of Poisson streams is Poisson
    with pytest.raises(ValueError, match="worker index 3"):
        process.share(3, 3)


@pytest.mark.parametrize("kwargs, field", [
    ({"rate_per_s": 0}, "rate_per_s"), ({"rate_per_s": 1, "distribution": "normal"}, "distribution"),
    ({"rate_per_s": 1, "cv": 0}, "cv"), ({"rate_per_s": 1, "window_s": -1}, "window_s"),
])
def test_bad_settings_are_refused_with_the_field_named(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ArrivalProcess(**kwargs)


def test_combined_stats_add_up_the_workers():
    a = OpenLoopStats("U", 10.0, num_users=4, scheduled=100, sent=98, late=3, cap_hits=1, max_late_ms=12.0,
                      elapsed_s=10.0, scheduled_rate_per_s=10.0, achieved_rate_per_s=9.9, measured_s=10.0)
    b = OpenLoopStats("U", 10.0, num_users=4, scheduled=101, sent=101, late=0, cap_hits=0, max_late_ms=4.0,
                      elapsed_s=10.5, scheduled_rate_per_s=9.6, achieved_rate_per_s=10.0, measured_s=8.0)
    total = OpenLoopStats.combine([a, b])
    assert (total.target_rate_per_s, total.num_users, total.scheduled, total.sent) == (20.0, 8, 201, 199)
    assert (total.late, total.cap_hits, total.max_late_ms, total.elapsed_s) == (3, 1, 12.0, 10.5)
    assert total.achieved_rate_per_s == pytest.approx(19.9) and total.measured_s == 8.0
    assert total.scheduled_rate_per_s == pytest.approx(19.6)
    assert OpenLoopStats.from_dict(total.to_dict()) == total


class FakeUser:
    def __init__(self, release: Event | None = None):
        self.scheduled, self.called, self.release = [], [], release

    def call(self, scheduled_at):
        self.scheduled.append(scheduled_at)
        self.called.append(time.perf_counter())
        if self.release is not None:
            self.release.wait()


def run_dispatcher(process, seconds, num_users=8):
    """A dispatcher serving num_users idle fake users for `seconds`: (its final stats, the users)."""
    dispatcher = Dispatcher(process, "U", late_threshold_ms=1000.0)
    users = [FakeUser() for _ in range(num_users)]
    greenlets = [gevent.spawn(dispatcher.serve, u) for u in users]
    gevent.sleep(seconds)
    dispatcher.stop()
    gevent.killall(greenlets)
    return dispatcher.snapshot(), users


def test_the_dispatcher_hands_arrivals_to_idle_users_on_schedule():
    stats, users = run_dispatcher(ArrivalProcess(200.0, seed=1), seconds=0.5)
    scheduled = sorted(t for u in users for t in u.scheduled)
    assert stats.sent == len(scheduled) > 0 and stats.cap_hits == 0 and stats.num_users == 8
    assert np.all(np.diff(scheduled) >= 0)


def test_busy_users_make_arrivals_wait_at_the_cap_and_the_wait_is_counted():
    release = Event()
    dispatcher = Dispatcher(ArrivalProcess(1000.0, seed=1), "U", late_threshold_ms=5.0)
    users = [FakeUser(release) for _ in range(2)]
    greenlets = [gevent.spawn(dispatcher.serve, u) for u in users]
    gevent.sleep(0.1)
    stats = dispatcher.snapshot()
    assert (stats.sent, stats.cap_hits) == (2, 1)  # both users busy: the third arrival waits
    # every arrival due so far counts as scheduled, reached by the stuck dispatcher or not: the lag shows
    due = ArrivalProcess(1000.0, seed=1).sample(1000)
    assert stats.scheduled == int(np.sum(due <= stats.elapsed_s)) > 50 and stats.achieved_rate_per_s < 100
    release.set()
    gevent.sleep(0.05)
    dispatcher.stop()
    gevent.killall(greenlets)
    stats = dispatcher.snapshot()
    assert stats.sent > 3 and stats.late >= 1 and stats.max_late_ms > 50.0  # it waited 100 ms
    # the waiting arrival was sent about 100 ms late, still carrying its own scheduled time
    assert max(c - s for u in users for s, c in zip(u.scheduled, u.called)) > 0.05


@pytest.mark.parametrize("window_s", [0, 0.1])
def test_the_snapshot_gives_the_drawn_schedules_rate_beside_the_sent_one(window_s):
    stats, _ = run_dispatcher(ArrivalProcess(200.0, seed=2, window_s=window_s), seconds=0.55)
    if window_s:  # over the whole pinned windows, the schedule offers exactly the rate
        # whole windows only (at least 5 in 0.55 s; a slow machine may oversleep into a sixth)
        assert stats.measured_s == pytest.approx(window_s * int(stats.elapsed_s // window_s))
        assert stats.measured_s >= 0.5 - 1e-9
        assert stats.scheduled_rate_per_s == pytest.approx(200.0)
    else:  # over the whole run, the schedule's rate is what it drew
        assert stats.measured_s == stats.elapsed_s
        assert stats.scheduled_rate_per_s == pytest.approx(stats.scheduled / stats.elapsed_s)
        assert stats.achieved_rate_per_s == pytest.approx(stats.sent / stats.elapsed_s)
    # every arrival due well before the stop went out; only those due in its last moments may not have
    due = ArrivalProcess(200.0, seed=2, window_s=window_s).sample(2 * stats.scheduled + 50)
    assert np.sum(due <= stats.elapsed_s - 0.05) <= stats.sent <= stats.scheduled

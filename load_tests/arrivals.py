"""Open-loop arrival times: a Poisson process (exponential gaps) or a gamma renewal process with a
chosen coefficient of variation (CV > 1 is burstier than Poisson), at a target rate, seeded; and the
counters of the dispatcher that sends requests at those times.

By default the process is the renewal process itself: the number of arrivals in any stretch of time
varies as it does in production (a Poisson count of 200 has a standard deviation of 14, ±7 %), and
that variance is part of what queueing, and so p99, responds to. Pinning (`window_s` > 0, or None
for auto: 20 arrivals and at least 1 s) is an opt-in variance reduction: each window then holds
exactly its share of arrivals (fractions carried over), placed as the process conditioned on that
count would place them (uniform order statistics for Poisson, Dirichlet spacings for gamma). Within a
window the arrivals keep the process's burstiness, but across windows the count no longer varies, so
a pinned run understates queueing at time scales of a window and longer.
No gevent or Locust here: open_loop.py drives this from a greenlet.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterator

import numpy as np

DISTRIBUTIONS = ("poisson", "gamma")
_BLOCK = 4096  # gaps drawn per numpy call in the unconditioned process
MIN_ARRIVALS_PER_WINDOW = 20


@dataclass(frozen=True)
class ArrivalProcess:
    rate_per_s: float
    distribution: str = "poisson"
    cv: float = 1.0  # gamma only; Poisson's is 1
    seed: int = 0
    window_s: float | None = 0.0  # 0: no pinning (the process itself); > 0: pin per window; None: auto
    stream: int = 0  # which worker's share: independent draws per stream

    def __post_init__(self):
        if not self.rate_per_s > 0:
            raise ValueError(f"rate_per_s must be > 0, got {self.rate_per_s}")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {self.distribution!r}")
        if not self.cv > 0:
            raise ValueError(f"cv must be > 0, got {self.cv}")
        if self.window_s is not None and self.window_s < 0:
            raise ValueError(f"window_s must be >= 0 (0: no pinning, > 0: pinned, None: auto), got {self.window_s}")

    @property
    def pinned_window_s(self) -> float | None:
        """The window over which the count is pinned, None when it is not."""
        if self.window_s is None:
            return max(1.0, MIN_ARRIVALS_PER_WINDOW / self.rate_per_s)
        return self.window_s or None

    @property
    def gamma_shape(self) -> float:
        return 1.0 if self.distribution == "poisson" else 1.0 / self.cv**2

    def share(self, worker_index: int, worker_count: int) -> "ArrivalProcess":
        """This worker's part of the process: 1/worker_count of the rate, drawn from its own stream.
        The superposition of the workers' Poisson streams is Poisson at the full rate."""
        if not 0 <= worker_index < worker_count:
            raise ValueError(f"worker index {worker_index} is outside [0, {worker_count})")
        return ArrivalProcess(self.rate_per_s / worker_count, self.distribution, self.cv, self.seed,
                              self.window_s, worker_index)

    def offsets(self) -> Iterator[float]:
        """Arrival times in seconds from the start, increasing, without end."""
        rng = np.random.default_rng([self.seed, self.stream])
        if self.pinned_window_s is None:
            yield from self._renewal(rng)
        else:
            yield from self._pinned(rng, self.pinned_window_s)

    def sample(self, num: int) -> np.ndarray:
        """The first `num` arrival times."""
        times = self.offsets()
        return np.fromiter((next(times) for _ in range(num)), dtype=float, count=num)

    def _gaps(self, rng: np.random.Generator, size: int) -> np.ndarray:
        shape = self.gamma_shape
        return rng.gamma(shape, 1.0 / (shape * self.rate_per_s), size=size)  # mean 1/rate

    def _renewal(self, rng) -> Iterator[float]:
        t = 0.0
        while True:
            for gap in self._gaps(rng, _BLOCK):
                t += gap
                yield float(t)

    def _pinned(self, rng, window_s: float) -> Iterator[float]:
        per_window = self.rate_per_s * window_s
        start, window = 0.0, 0
        while True:
            # floor of the running total: fractional rates carry over so the long-run mean is exact
            count = int(np.floor((window + 1) * per_window + 1e-9) - np.floor(window * per_window + 1e-9))
            if count:
                gaps = self._gaps(rng, count + 1)  # the last gap runs to the end of the window
                times = start + window_s * np.cumsum(gaps[:-1]) / gaps.sum()
                yield from (float(t) for t in times)
            window += 1
            start = window * window_s


def interarrival_stats(offsets: np.ndarray) -> tuple[float, float]:
    """(rate per second, CV of the gaps) of a sequence of arrival times starting from 0."""
    gaps = np.diff(np.concatenate([[0.0], offsets]))
    return len(offsets) / offsets[-1], float(gaps.std() / gaps.mean())


@dataclass
class OpenLoopStats:
    """Counters of one dispatcher (or, combined, of a whole run). `scheduled` counts the arrivals
    the schedule held up to now, whether the dispatcher has reached them or not. An arrival is
    `late` when it was handed to a user more than `late_threshold_ms` after its scheduled time;
    `cap_hits` counts arrivals that found every user busy and waited for one (their latency still
    counts from the scheduled time). Over `measured_s` (the whole run; when pinned, the whole pinned windows that
    ended before it did): `scheduled_rate_per_s` is the rate of the schedule actually drawn, which
    differs from the target by the process's own noise (about 1/sqrt(arrivals) for Poisson) unless
    pinned, and `achieved_rate_per_s` the requests actually sent per second, which a dispatcher that
    keeps up holds to the schedule's rate whatever the server's latency."""

    name: str
    target_rate_per_s: float
    num_users: int = 0  # the in-flight cap: one request per user
    scheduled: int = 0
    sent: int = 0
    late: int = 0
    cap_hits: int = 0
    max_late_ms: float = 0.0
    elapsed_s: float = 0.0
    scheduled_rate_per_s: float = 0.0
    achieved_rate_per_s: float = 0.0
    measured_s: float = 0.0
    late_threshold_ms: float = 10.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "OpenLoopStats":
        return cls(**data)

    @classmethod
    def combine(cls, parts: list["OpenLoopStats"], name: str | None = None) -> "OpenLoopStats":
        """The run's total over the workers' dispatchers (which run side by side)."""
        if not parts:
            raise ValueError("nothing to combine")
        return cls(
            name=name or parts[0].name,
            target_rate_per_s=sum(p.target_rate_per_s for p in parts),
            num_users=sum(p.num_users for p in parts),
            scheduled=sum(p.scheduled for p in parts),
            sent=sum(p.sent for p in parts),
            late=sum(p.late for p in parts),
            cap_hits=sum(p.cap_hits for p in parts),
            max_late_ms=max(p.max_late_ms for p in parts),
            elapsed_s=max(p.elapsed_s for p in parts),
            scheduled_rate_per_s=sum(p.scheduled_rate_per_s for p in parts),
            achieved_rate_per_s=sum(p.achieved_rate_per_s for p in parts),
            measured_s=min(p.measured_s for p in parts),
            late_threshold_ms=parts[0].late_threshold_ms,
        )

    def summary(self) -> str:
        return (f"open loop {self.name}: target {self.target_rate_per_s:.2f} req/s, scheduled "
                f"{self.scheduled_rate_per_s:.2f} req/s, achieved {self.achieved_rate_per_s:.2f} req/s "
                f"(over {self.measured_s:.1f} of {self.elapsed_s:.1f} s); "
                f"scheduled {self.scheduled}, sent {self.sent}, late (> {self.late_threshold_ms:g} ms) {self.late}, "
                f"max lateness {self.max_late_ms:.1f} ms, waited at the in-flight cap ({self.num_users} users) "
                f"{self.cap_hits}")

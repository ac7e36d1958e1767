"""Retries with exponential backoff and full jitter, only for errors where a retry is safe (nothing
ran on the server: connection refused, UNAVAILABLE, queue full), bounded in attempts and in time."""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, TypeVar

from .errors import ClientError, to_client_error

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4  # the first try included; 1 turns retries off
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    multiplier: float = 2.0
    deadline_s: float | None = 30.0  # no retry starts after this long since the first try
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self):
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.initial_backoff_s < 0 or self.max_backoff_s < self.initial_backoff_s:
            raise ValueError("backoff must satisfy 0 <= initial_backoff_s <= max_backoff_s")
        if self.multiplier < 1:
            raise ValueError(f"multiplier must be >= 1, got {self.multiplier}")

    def backoff_s(self, retry: int) -> float:
        """Sleep before retry number `retry` (1 = the first retry): uniform in [0, cap], the cap
        growing exponentially ("full jitter"), so that many clients do not retry in step."""
        cap = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (retry - 1))
        return self.rng.uniform(0, cap)

    def next_sleep_s(self, error: ClientError, attempt: int, elapsed_s: float) -> float | None:
        """How long to sleep before trying again after `attempt` tries failed with `error`, or None
        when the error is final."""
        if not error.retryable or attempt >= self.max_attempts:
            return None
        sleep = self.backoff_s(attempt)
        if self.deadline_s is not None and elapsed_s + sleep > self.deadline_s:
            return None
        return sleep


NO_RETRY = RetryPolicy(max_attempts=1)
# The caller's own mistakes (a bad argument, a name the model lacks): raised as they are, never retried.
CALLER_MISTAKES = (ValueError, KeyError)


def call_with_retry(fn: Callable[[], T], policy: RetryPolicy, sleep=time.sleep, clock=time.monotonic) -> T:
    """`fn()`, retried per `policy`; raises the last ClientError."""
    start = clock()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except CALLER_MISTAKES:
            raise
        except Exception as exc:  # mapped: only ClientErrors (and the caller's mistakes) leave here
            error = to_client_error(exc)
            delay = policy.next_sleep_s(error, attempt, clock() - start)
            if delay is None:
                raise error from (None if error is exc else exc)
        sleep(delay)


async def acall_with_retry(fn: Callable[[], Awaitable[T]], policy: RetryPolicy, clock=time.monotonic) -> T:
    """The asyncio twin of `call_with_retry`."""
    start = clock()
    attempt = 0
    while True:
        attempt += 1
        try:
            return await fn()
        except CALLER_MISTAKES:
            raise
        except Exception as exc:
            error = to_client_error(exc)
            delay = policy.next_sleep_s(error, attempt, clock() - start)
            if delay is None:
                raise error from (None if error is exc else exc)
        await asyncio.sleep(delay)

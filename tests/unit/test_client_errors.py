"""Client error mapping and the retry policy: which errors retry, and that retries are bounded."""
import random
import socket

import aiohttp
import pytest
from geventhttpclient.response import HTTPConnectionClosed
from tritonclient.utils import InferenceServerException

from clients import errors
from clients.retry import NO_RETRY, RetryPolicy, acall_with_retry, call_with_retry


@pytest.mark.parametrize("status, message, expected", [
    ("StatusCode.INVALID_ARGUMENT", "max_tokens: must be in [1, 1024]", errors.InvalidArgumentError),
    ("400", "unexpected shape for input 'input_ids'", errors.InvalidArgumentError),
    ("StatusCode.NOT_FOUND", "Request for unknown model: 'nope' is not found", errors.NotFoundError),
    ("400", "Request for unknown model: 'nope' is not found", errors.NotFoundError),
    ("StatusCode.INVALID_ARGUMENT", "requested model 'nope' is not available", errors.NotFoundError),
    ("StatusCode.UNAVAILABLE", "Request for unknown model: 'minilm' has no available versions",
     errors.UnavailableError),
    ("StatusCode.UNAVAILABLE", "failed to connect to all addresses", errors.UnavailableError),
    ("503", "Server not ready", errors.UnavailableError),
    ("StatusCode.UNAVAILABLE", "Exceeds maximum queue size", errors.OverloadedError),
    ("400", "Exceeds maximum queue size", errors.OverloadedError),
    ("StatusCode.UNAVAILABLE", "Request timeout expired", errors.DeadlineExceededError),
    ("StatusCode.DEADLINE_EXCEEDED", "Deadline Exceeded", errors.DeadlineExceededError),
    ("StatusCode.CANCELLED", "Locally cancelled by application!", errors.CancelledError),
    ("StatusCode.INTERNAL", "model crashed", errors.ServerError),
    ("500", "model crashed", errors.ServerError),
    (None, "invalid argument: top_p: must be in (0, 1]", errors.InvalidArgumentError),
    (None, "something odd", errors.ServerError),
])
def test_server_errors_map_to_the_toolkit_hierarchy_keeping_the_message(status, message, expected):
    mapped = errors.to_client_error(InferenceServerException(msg=message, status=status))
    assert type(mapped) is expected
    assert mapped.message == message and mapped.status == status


@pytest.mark.parametrize("exc, expected", [
    (ConnectionRefusedError(111, "Connection refused"), errors.UnavailableError),
    (socket.gaierror(-2, "Name or service not known"), errors.UnavailableError),
    (socket.timeout("timed out"), errors.DeadlineExceededError),
    (ValueError("boom"), errors.ServerError),
    (aiohttp.ServerDisconnectedError(), errors.UnavailableError),
    (HTTPConnectionClosed("connection closed."), errors.UnavailableError),
])
def test_transport_errors_map_too(exc, expected):
    assert type(errors.to_client_error(exc)) is expected


def test_a_raw_grpc_error_maps_by_its_code():
    import grpc

    class RpcError(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.UNAVAILABLE

        def details(self):
            return "failed to connect to all addresses"

    mapped = errors.to_client_error(RpcError())
    assert type(mapped) is errors.UnavailableError and mapped.status == "StatusCode.UNAVAILABLE"


def test_only_unavailable_and_overloaded_are_retryable():
    retryable = {cls for cls in vars(errors).values()
                 if isinstance(cls, type) and issubclass(cls, errors.ClientError) and cls.retryable}
    assert retryable == {errors.UnavailableError, errors.OverloadedError}


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def sleep(self, s):
        self.sleeps.append(s)
        self.now += s

    def __call__(self):
        return self.now


def failing(errors_to_raise, result="ok"):
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= len(errors_to_raise):
            raise errors_to_raise[len(calls) - 1]
        return result
    return fn, calls


def test_a_retryable_error_is_retried_until_success():
    clock = FakeClock()
    fn, calls = failing([ConnectionRefusedError(111, "refused"), errors.OverloadedError("queue full")])
    assert call_with_retry(fn, RetryPolicy(max_attempts=5), sleep=clock.sleep, clock=clock) == "ok"
    assert len(calls) == 3 and len(clock.sleeps) == 2


def test_a_final_error_is_not_retried_and_comes_out_mapped():
    clock = FakeClock()
    fn, calls = failing([InferenceServerException(msg="bad input", status="StatusCode.INVALID_ARGUMENT")])
    with pytest.raises(errors.InvalidArgumentError, match="bad input"):
        call_with_retry(fn, RetryPolicy(max_attempts=5), sleep=clock.sleep, clock=clock)
    assert len(calls) == 1 and clock.sleeps == []


def test_the_callers_own_mistakes_pass_through_unmapped_and_unretried():
    clock = FakeClock()
    fn, calls = failing([ValueError("priority needs protocol grpc")])
    with pytest.raises(ValueError, match="priority"):
        call_with_retry(fn, RetryPolicy(max_attempts=5), sleep=clock.sleep, clock=clock)
    assert len(calls) == 1


def test_retries_are_bounded_in_count():
    clock = FakeClock()
    fn, calls = failing([errors.UnavailableError("down")] * 100)
    with pytest.raises(errors.UnavailableError):
        call_with_retry(fn, RetryPolicy(max_attempts=4, deadline_s=None), sleep=clock.sleep, clock=clock)
    assert len(calls) == 4
    fn, calls = failing([errors.UnavailableError("down")] * 100)
    with pytest.raises(errors.UnavailableError):
        call_with_retry(fn, NO_RETRY, sleep=clock.sleep, clock=clock)
    assert len(calls) == 1


def test_retries_are_bounded_in_time():
    clock = FakeClock()
    fn, calls = failing([errors.UnavailableError("down")] * 10_000)
    policy = RetryPolicy(max_attempts=10_000, initial_backoff_s=0.5, max_backoff_s=0.5, deadline_s=10.0,
                         rng=random.Random(1))
    with pytest.raises(errors.UnavailableError):
        call_with_retry(fn, policy, sleep=clock.sleep, clock=clock)
    assert clock.now <= 10.0 and 10 < len(calls) < 10_000


def test_backoff_grows_exponentially_under_a_cap_with_full_jitter():
    policy = RetryPolicy(initial_backoff_s=0.1, max_backoff_s=1.0, multiplier=2.0, rng=random.Random(0))
    for retry, cap in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)]:
        samples = [policy.backoff_s(retry) for _ in range(2000)]
        assert 0 <= min(samples) and max(samples) <= cap
        assert max(samples) > 0.9 * cap and min(samples) < 0.1 * cap  # spread over [0, cap]: jitter


@pytest.mark.parametrize("kwargs", [{"max_attempts": 0}, {"initial_backoff_s": 2, "max_backoff_s": 1},
                                    {"multiplier": 0.5}])
def test_bad_policies_are_refused(kwargs):
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)


def test_the_asyncio_variant_retries_the_same_way():
    import asyncio

    outcomes = [errors.UnavailableError("down"), errors.UnavailableError("down")]

    async def fn():
        if outcomes:
            raise outcomes.pop()
        return 42

    policy = RetryPolicy(max_attempts=3, initial_backoff_s=0.0, max_backoff_s=0.0)
    assert asyncio.run(acall_with_retry(fn, policy)) == 42
    outcomes[:] = [errors.UnavailableError("down")] * 3
    with pytest.raises(errors.UnavailableError):
        asyncio.run(acall_with_retry(fn, RetryPolicy(max_attempts=2, initial_backoff_s=0.0, max_backoff_s=0.0)))


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_stream_to_a_server_that_is_down_is_unavailable_after_its_retries(protocol):
    import asyncio

    from clients.async_generation import AsyncGenerationClient
    from clients.connection import Endpoint
    from clients.generation import GenerationClient

    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = Endpoint(f"127.0.0.1:{port}", protocol, timeout_s=5)
    policy = RetryPolicy(max_attempts=2, initial_backoff_s=0.0, max_backoff_s=0.0)
    with pytest.raises(errors.UnavailableError):
        GenerationClient(endpoint, retry=policy).generate("hi")
    with pytest.raises(errors.UnavailableError):
        asyncio.run(AsyncGenerationClient(endpoint, retry=policy).generate("hi"))

"""Locust users for the served models: embeddings over HTTP and gRPC, generation over gRPC streaming
and HTTP server-sent events. Locustfiles (load_tests/locustfiles/) subclass them; code can too.

Contract, for locustfiles and for drivers that run Locust in-process (Environment(user_classes=[cls],
host=...), create_local_runner(), runner.start(n, spawn_rate)):

- `EmbedHttpUser`, `EmbedGrpcUser`: `model` "embed" (text in) or "minilm" (token ids in, tokenized
  here); `GenerateGrpcUser`, `GenerateSseUser`: `model` "gpt2" or "gpt2_static".
- Hosts: HTTP users take "http://127.0.0.1:8000" (the default); gRPC users take "127.0.0.1:8001" (the
  default), with or without a "grpc://" or "http://" scheme, so `--host` works for both kinds.
- Settings are class attributes: model, workload (a path, a workload.Workload, or None for one made in
  memory), workload_order, workload_seed, priority, timeout_s, max_tokens, ignore_eos, spec (a ModelSpec
  for a model that is not checked in), and the open-loop ones: arrival_rate (requests/s for the whole
  run; 0 = closed loop), arrival_distribution, arrival_cv, arrival_seed, arrival_window_s,
  late_threshold_ms. Override them with `configured(cls, **settings)` or, in a locustfile, on the
  command line (load_tests/options.py).
- `call(scheduled_at=None)` sends one request and fires exactly one `request` event: request_type
  "http", "grpc", "grpc-stream" or "sse"; name = model; response_time in ms from `scheduled_at` (a
  time.perf_counter() value, open loop) or else from the send; failures in `exception=`; context
  {"ttft_ms", "itl_ms", "num_output_tokens"} for generation and {"scheduled_at", "late_ms"} in open loop.
- Closed loop: the task calls `call()` back to back (wait_time constant(0)). Open loop
  (arrival_rate > 0): the users form the pool that the process's dispatcher hands arrivals to, one
  request in flight per user; see open_loop.py.
- Results: Locust's stats for requests; `token_stats.for_environment(env)` for TTFT/TPOT/ITL;
  `open_loop.stats(env)` for the scheduler's counters. The users attach both to their environment
  on start; call `instrument.attach(env)` before `runner.start` to start the token clock with the run.
"""
from __future__ import annotations

import itertools
import json
import os
import time
from functools import lru_cache
from pathlib import Path

from gevent.queue import Empty, Queue
from geventhttpclient.url import URL
from locust import User, constant, task
from locust.contrib.fasthttp import FastHttpUser

from clients.model_spec import ModelSpec, load_spec
from clients.payloads import (Sampling, chunk_from_event, chunk_from_result, embedding_output, generate_body,
                              generate_values, parse_sse, tensors, text_values, token_values)

from . import open_loop
from .instrument import attach
from .prepared import prepared_requests

DEFAULT_HTTP_HOST = "http://127.0.0.1:8000"
DEFAULT_GRPC_HOST = "127.0.0.1:8001"


class RequestFailed(Exception):
    """The server answered, but not with a successful result."""


class LoadUser(User):
    """Settings and the request loop that the users below share."""

    abstract = True
    wait_time = constant(0)
    kind = "embed"  # which workload records the user sends
    request_type = ""
    model = "embed"
    spec: ModelSpec | None = None  # default: the checked-in config of `model`
    workload: str | Path | object | None = None
    workload_order = "round-robin"
    workload_seed = 0
    priority = 0
    timeout_s = 60.0
    arrival_rate = 0.0
    arrival_distribution = "poisson"
    arrival_cv = 1.0
    arrival_seed = 0
    arrival_window_s: float | None = None  # None: auto (arrivals.py); 0: no pinning
    late_threshold_ms = 10.0

    def on_start(self) -> None:
        attach(self.environment)
        self._requests = prepared_requests(self)

    @task
    def send_next(self) -> None:
        if self.arrival_rate > 0:
            open_loop.dispatcher_for(self).serve(self)  # returns only when the user is stopped
        else:
            self.call()

    def model_spec(self) -> ModelSpec:
        return self.spec or load_spec(self.model)

    def call(self, scheduled_at: float | None = None) -> None:
        started = time.perf_counter()
        t0 = started if scheduled_at is None else scheduled_at
        context = {} if scheduled_at is None else {"scheduled_at": scheduled_at, "late_ms": (started - t0) * 1e3}
        length, exception = 0, None
        try:
            length = self.send(self._requests.next(), t0, context)
        except Exception as e:  # any failure of this request is its result, reported once below
            exception = e
        self.environment.events.request.fire(
            request_type=self.request_type, name=self.model, response_time=(time.perf_counter() - t0) * 1e3,
            response_length=length, exception=exception, context=context)

    def prepare(self, record):
        """The request for one workload record, built once per process."""
        raise NotImplementedError

    def send(self, request, t0: float, context: dict) -> int:
        """Send one prepared request; return the response's length in bytes, raise on failure."""
        raise NotImplementedError


class _HttpUser(LoadUser, FastHttpUser):
    abstract = True
    host = DEFAULT_HTTP_HOST
    request_type = "http"

    def __init__(self, environment):
        self.network_timeout = self.connection_timeout = self.timeout_s
        super().__init__(environment)

    def on_start(self) -> None:
        super().on_start()
        # FastHttpUser's own connection pool, without its per-request event (call() fires ours)
        self._http = self.client.client.clientpool.get_client(URL(self.host))

    def post(self, path: str, body: bytes, headers: dict):
        response = self._http.request("POST", path, body=body, headers=headers)
        if response.status_code != 200:
            raise RequestFailed(f"HTTP {response.status_code}: {response.read()[:300].decode(errors='replace')}")
        return response


def _embedding_values(spec: ModelSpec, text: str) -> dict:
    """Text for a model with one string input (embed), token ids otherwise (minilm)."""
    (first, *rest) = spec.inputs
    return text_values(spec, [text]) if not rest and first.wire_dtype == "BYTES" else token_values(spec, [text])


class EmbedHttpUser(_HttpUser):
    """One text per request to /v2/models/<model>/infer, binary tensors both ways."""

    def prepare(self, record):
        import tritonclient.http as httpclient

        spec = self.model_spec()
        inputs = tensors(httpclient, spec, _embedding_values(spec, record.text))
        outputs = [httpclient.InferRequestedOutput(embedding_output(spec), binary_data=True)]
        body, json_size = httpclient.InferenceServerClient.generate_request_body(
            inputs, outputs=outputs, priority=self.priority)
        headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(json_size)}
        return f"/v2/models/{self.model}/infer", body, headers

    def send(self, request, t0, context) -> int:
        return len(self.post(*request).read())


def grpc_target(host: str | None) -> str:
    host = host or DEFAULT_GRPC_HOST
    for scheme in ("grpc://", "http://", "https://"):
        host = host.removeprefix(scheme)
    return host.rstrip("/")


_gevent_grpc_pid: int | None = None


@lru_cache(maxsize=1)
def _client_class():
    import tritonclient.grpc as grpcclient

    class Client(grpcclient.InferenceServerClient):
        """Closes its channel once, and never from __del__: in gRPC's gevent mode a channel closed
        a second time, or while the interpreter shuts down, can hang the process at exit."""

        _is_closed = False

        def close(self):
            if not self._is_closed:
                self._is_closed = True
                super().close()

        def __del__(self):
            pass

    return Client


def grpc_client(host: str | None):
    """A tritonclient.grpc client for this greenlet world: gRPC's gevent mode is switched on once per
    process (after any fork of `--processes`), before the first channel. Close it in on_stop."""
    global _gevent_grpc_pid
    if _gevent_grpc_pid != os.getpid():
        import grpc.experimental.gevent as grpc_gevent

        grpc_gevent.init_gevent()
        _gevent_grpc_pid = os.getpid()
    return _client_class()(grpc_target(host))


class _GrpcUser(LoadUser):
    abstract = True
    host = DEFAULT_GRPC_HOST

    def on_start(self) -> None:
        super().on_start()
        self._client = grpc_client(self.host)

    def on_stop(self) -> None:
        self._client.close()


class EmbedGrpcUser(_GrpcUser):
    """One text per unary ModelInfer call."""

    request_type = "grpc"

    def prepare(self, record):
        import tritonclient.grpc as grpcclient

        spec = self.model_spec()
        return (tensors(grpcclient, spec, _embedding_values(spec, record.text)),
                [grpcclient.InferRequestedOutput(embedding_output(spec))])

    def send(self, request, t0, context) -> int:
        inputs, outputs = request
        result = self._client.infer(self.model, inputs, outputs=outputs, priority=self.priority,
                                    client_timeout=self.timeout_s)
        return result.get_response().ByteSize()


class _GenerateUser(LoadUser):
    abstract = True
    kind = "generate"
    model = "gpt2"
    max_tokens: int | None = None  # default: each workload record's own
    ignore_eos = True  # the decoder's weights are random: without it, lengths would be luck

    def sampling(self, record) -> Sampling:
        return Sampling(max_tokens=self.max_tokens or record.max_tokens, ignore_eos=self.ignore_eos)


def record_tokens(context: dict, token_times_s: list[float], num_output_tokens: int) -> None:
    """Token timings of one request into its event's context (times from t0, in seconds)."""
    context["ttft_ms"] = token_times_s[0] * 1e3 if token_times_s else None
    context["itl_ms"] = [(b - a) * 1e3 for a, b in zip(token_times_s, token_times_s[1:])]
    context["num_output_tokens"] = num_output_tokens


class GenerateGrpcUser(_GenerateUser, _GrpcUser):
    """One bidirectional stream per user; one request on it at a time, one response per token."""

    request_type = "grpc-stream"

    def on_start(self) -> None:
        super().on_start()
        self._request_ids = itertools.count()
        self._responses: Queue = Queue()
        self._client.start_stream(callback=self._on_response)

    def _on_response(self, result, error) -> None:  # on tritonclient's stream thread (a greenlet here)
        self._responses.put((time.perf_counter(), result, error))

    def _restart_stream(self) -> None:
        self._client.stop_stream(cancel_requests=True)
        self._responses = Queue()  # whatever the abandoned request still sent is dropped with it
        self._client.start_stream(callback=self._on_response)

    def on_stop(self) -> None:
        self._client.stop_stream(cancel_requests=True)
        super().on_stop()

    def prepare(self, record):
        import tritonclient.grpc as grpcclient

        spec = self.model_spec()
        return tensors(grpcclient, spec, generate_values(spec, record.text, self.sampling(record), stream=True))

    def send(self, inputs, t0, context) -> int:
        request_id = str(next(self._request_ids))
        self._client.async_stream_infer(self.model, inputs, request_id=request_id)
        deadline = time.perf_counter() + self.timeout_s
        times, length = [], 0
        while True:
            try:
                arrived, result, error = self._responses.get(timeout=max(0.0, deadline - time.perf_counter()))
            except Empty:
                self._restart_stream()
                raise TimeoutError(f"no final response within {self.timeout_s} s") from None
            if error is not None:
                raise error  # one request in flight on this stream: the error is this request's
            chunk = chunk_from_result(result)
            times += [arrived - t0] * len(chunk.token_ids)
            length += result.get_response().ByteSize()
            if chunk.is_final:
                record_tokens(context, times, chunk.num_output_tokens or len(times))
                return length


class GenerateSseUser(_GenerateUser, _HttpUser):
    """POST /v2/models/<model>/generate_stream; one server-sent event per token."""

    host = DEFAULT_HTTP_HOST
    request_type = "sse"

    def prepare(self, record):
        body = generate_body(self.model_spec(), record.text, self.sampling(record), stream=True)
        return f"/v2/models/{self.model}/generate_stream", json.dumps(body).encode(), {"Content-Type": "application/json"}

    def send(self, request, t0, context) -> int:
        response = self.post(*request)
        length = 0

        def lines():
            nonlocal length
            while line := response.readline(b"\n"):
                length += len(line)
                yield line

        times = []
        for event in parse_sse(lines()):
            arrived = time.perf_counter()
            if "error" in event:
                raise RequestFailed(f"error event: {event['error']}")
            chunk = chunk_from_event(event)
            times += [arrived - t0] * len(chunk.token_ids)
            if chunk.is_final:
                response.read()  # the end of the chunked body, so the connection can be reused
                record_tokens(context, times, chunk.num_output_tokens or len(times))
                return length
        raise RequestFailed("the event stream ended without a final event")


def configured(cls: type[LoadUser], name: str | None = None, **settings) -> type[LoadUser]:
    """A subclass of `cls` with other settings, e.g. configured(EmbedHttpUser, model="minilm",
    arrival_rate=50). Unknown settings are refused."""
    unknown = sorted(k for k in settings if not hasattr(cls, k))
    if unknown:
        raise AttributeError(f"{cls.__name__} has no setting(s) {unknown}")
    return type(name or cls.__name__, (cls,), dict(settings))

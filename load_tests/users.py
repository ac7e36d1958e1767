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
  run; 0 = closed loop), arrival_distribution, arrival_cv, arrival_seed, arrival_window_s (0:
  unpinned, the default), late_threshold_ms. Override them with `configured(cls, **settings)` or, in a
  locustfile, on the command line (load_tests/options.py). Priority (and, over gRPC, the timeout) go to
  Triton with each request; HTTP's generate endpoint cannot carry a priority, so `GenerateSseUser`
  refuses a non-zero one at start.
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
import time

from gevent.queue import Empty, Queue

from clients.payloads import (Sampling, chunk_from_event, chunk_from_result, embedding_output, embedding_values,
                              generate_body, generate_values, parse_sse, tensors)

from .base_user import (DEFAULT_GRPC_HOST, DEFAULT_HTTP_HOST, GrpcLoadUser, HttpLoadUser, LoadUser,  # noqa: F401
                        RequestFailed, configured, grpc_client, grpc_target)


class EmbedHttpUser(HttpLoadUser):
    """One text per request to /v2/models/<model>/infer, binary tensors both ways."""

    def prepare(self, record):
        import tritonclient.http as httpclient

        spec = self.model_spec()
        inputs = tensors(httpclient, spec, embedding_values(spec, [record.text]))
        outputs = [httpclient.InferRequestedOutput(embedding_output(spec), binary_data=True)]
        body, json_size = httpclient.InferenceServerClient.generate_request_body(
            inputs, outputs=outputs, priority=self.priority)
        headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(json_size)}
        return f"/v2/models/{self.model}/infer", body, headers

    def send(self, request, t0, context) -> int:
        return len(self.post(*request).read())


class EmbedGrpcUser(GrpcLoadUser):
    """One text per unary ModelInfer call."""

    request_type = "grpc"

    def prepare(self, record):
        import tritonclient.grpc as grpcclient

        spec = self.model_spec()
        return (tensors(grpcclient, spec, embedding_values(spec, [record.text])),
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


class GenerateGrpcUser(_GenerateUser, GrpcLoadUser):
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
        if getattr(self, "_responses", None) is not None:  # on_start got as far as the stream
            self._client.stop_stream(cancel_requests=True)
        super().on_stop()

    def prepare(self, record):
        import tritonclient.grpc as grpcclient

        spec = self.model_spec()
        return tensors(grpcclient, spec, generate_values(spec, record.text, self.sampling(record), stream=True))

    def send(self, inputs, t0, context) -> int:
        request_id = str(next(self._request_ids))
        # Triton's own timeout (microseconds) lets the server drop a request that waited too long;
        # the client's deadline below ends the wait either way.
        self._client.async_stream_infer(self.model, inputs, request_id=request_id, priority=self.priority,
                                        timeout=int(self.timeout_s * 1e6))
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


class GenerateSseUser(_GenerateUser, HttpLoadUser):
    """POST /v2/models/<model>/generate_stream; one server-sent event per token."""

    host = DEFAULT_HTTP_HOST
    request_type = "sse"

    def on_start(self) -> None:
        if self.priority:
            # The generate extension turns extra JSON keys into request parameters, which the model
            # refuses as unknown: a priority cannot travel over HTTP, and dropping it would mislabel the run.
            raise ValueError(f"{type(self).__name__}: priority {self.priority} cannot be sent over HTTP's generate "
                             "endpoint; use --priority 0, or the gRPC streaming user (generate_grpc.py), which "
                             "sends Triton's request priority")
        super().on_start()

    def prepare(self, record):
        body = json.dumps(generate_body(self.model_spec(), record.text, self.sampling(record), stream=True))
        return f"/v2/models/{self.model}/generate_stream", body.encode(), {"Content-Type": "application/json"}

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

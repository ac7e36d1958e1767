"""Text generation from the decoding models (`gpt2`, `gpt2_static`): one call for the whole text, or a
stream of tokens with their arrival times, over gRPC streaming or HTTP server-sent events, sync or
asyncio. Leaving a stream early (cancel(), a `with` block, a cancelled task) cancels the request on
the server, which frees its KV blocks at the next step."""
from __future__ import annotations

import json
import queue
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Callable, Iterator

from .connection import Endpoint
from .embeddings import RequestOptions
from .errors import ClientError, DeadlineExceededError, error_class, http_error, to_client_error
from .model_spec import ModelSpec, load_spec
from .payloads import GENERATE_MODEL, Chunk, Sampling, chunk_from_event, chunk_from_result, generate_body, \
    generate_values, parse_sse, tensors
from .retry import RetryPolicy, call_with_retry
from .timing import RequestTiming


@dataclass(frozen=True)
class TokenEvent:
    """One streamed response: its tokens and text, and when it arrived (seconds after the send)."""

    token_ids: tuple[int, ...]
    text: str
    at_s: float
    is_final: bool
    finish_reason: str | None


@dataclass(frozen=True)
class Generation:
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None
    num_input_tokens: int | None
    num_output_tokens: int
    timing: RequestTiming


def _assemble(events: list[TokenEvent], last: Chunk | None, e2e_s: float, streamed: bool) -> Generation:
    token_ids = tuple(t for e in events for t in e.token_ids)
    # One arrival time per token: a response that carries k tokens gives k equal times.
    times = tuple(e.at_s for e in events for _ in e.token_ids) if streamed else None
    return Generation(
        text="".join(e.text for e in events),
        token_ids=token_ids,
        finish_reason=last.finish_reason if last else None,
        num_input_tokens=last.num_input_tokens if last else None,
        num_output_tokens=len(token_ids),
        timing=RequestTiming(token_times_s=times, e2e_s=e2e_s, num_output_tokens=len(token_ids)),
    )


def _stream_error(message: str) -> ClientError:
    # Errors inside a stream carry no status code, only the server's message.
    cls = error_class(None, message)
    return cls(message, "stream")


class TokenStream:
    """An iterator of TokenEvents; `result()` is the whole Generation once the stream has ended.
    `opener(on_chunk)` starts the request and returns (next_chunk, cancel)."""

    def __init__(self, opener: Callable, retry: RetryPolicy, timeout_s: float, streamed: bool = True):
        self._opener, self._retry, self._timeout_s, self._streamed = opener, retry, timeout_s, streamed
        self._events: list[TokenEvent] = []
        self._last: Chunk | None = None
        self._done = True  # until the request is open: a failed open leaves nothing to cancel
        self._sent = time.perf_counter()
        self._next, self._cancel = self._open()
        self._done = False

    def _open(self):
        def attempt():
            self._sent = time.perf_counter()
            next_chunk, cancel = self._opener()
            try:
                first = next_chunk()  # connection errors surface with the first response
            except Exception:
                cancel(True)
                raise
            return self._prepend(first, next_chunk), cancel

        return call_with_retry(attempt, self._retry)

    @staticmethod
    def _prepend(first, next_chunk):
        pending = [first]
        return lambda: pending.pop() if pending else next_chunk()

    def __iter__(self) -> Iterator[TokenEvent]:
        return self

    def __next__(self) -> TokenEvent:
        if self._done:
            raise StopIteration
        try:
            chunk, at = self._next()
        except BaseException:
            self.cancel()
            raise
        event = TokenEvent(chunk.token_ids, chunk.text, at - self._sent, chunk.is_final, chunk.finish_reason)
        self._events.append(event)
        if chunk.is_final:
            self._last, self._done = chunk, True
            self._cancel(False)
        return event

    def cancel(self) -> None:
        """Stop the request on the server (no-op once it has ended)."""
        if not self._done:
            self._done = True
            self._cancel(True)

    def result(self) -> Generation:
        for _ in self:
            pass
        e2e = self._events[-1].at_s if self._events else 0.0
        return _assemble(self._events, self._last, e2e, self._streamed)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cancel()

    def __del__(self):
        # A loop left with `break` and the stream dropped: the request must not run on unread.
        if not getattr(self, "_done", True):
            self.cancel()


class GenerationSettings:
    """What both generation clients are made of: where, which model, how to retry."""

    def __init__(self, endpoint: Endpoint | None = None, model: str = GENERATE_MODEL,
                 retry: RetryPolicy | None = None, spec: ModelSpec | None = None):
        """`spec`: the tensors of a model served under another name (a config variant)."""
        self.endpoint = endpoint or Endpoint.resolve()
        self.model = model
        self.spec = spec or load_spec(model)
        self.retry = retry or RetryPolicy()


class GenerationClient(GenerationSettings):
    """Sync generation client; each stream opens its own gRPC stream (tritonclient's gRPC client runs
    one stream at a time) or its own HTTP connection."""

    def stream(self, prompt: str | list[int], sampling: Sampling = Sampling(),
               options: RequestOptions = RequestOptions()) -> TokenStream:
        return self._start(prompt, sampling, options, stream=True)

    def generate(self, prompt: str | list[int], sampling: Sampling = Sampling(),
                 options: RequestOptions = RequestOptions()) -> Generation:
        return self._start(prompt, sampling, options, stream=False).result()

    def _start(self, prompt, sampling, options, stream: bool) -> TokenStream:
        timeout_s = options.timeout_s or self.endpoint.timeout_s
        if self.endpoint.protocol == "grpc":
            opener = lambda: self._open_grpc(prompt, sampling, options, stream, timeout_s)  # noqa: E731
        else:
            opener = lambda: self._open_sse(prompt, sampling, options, stream, timeout_s)  # noqa: E731
        return TokenStream(opener, self.retry, timeout_s, streamed=stream)

    def _open_grpc(self, prompt, sampling, options, stream, timeout_s):
        module = self.endpoint.module()
        inputs = tensors(module, self.spec, generate_values(self.spec, prompt, sampling, stream))
        client = self.endpoint.client()
        arrived: queue.Queue = queue.Queue()
        try:
            client.start_stream(callback=lambda result, error: arrived.put((result, error, time.perf_counter())))
            client.async_stream_infer(self.model, inputs, **options.triton_kwargs())
        except BaseException as exc:
            client.close()
            # A stream that failed at once (server down) reports why through the callback; the send
            # only says "no longer in valid state". Raise the reason, so that UNAVAILABLE is retried.
            try:
                _, error, _ = arrived.get(timeout=1.0)
            except queue.Empty:
                raise exc from None
            raise to_client_error(error) from exc

        def next_chunk():
            try:
                result, error, at = arrived.get(timeout=timeout_s)
            except queue.Empty:
                raise DeadlineExceededError(f"no response within {timeout_s} s", "client") from None
            if error is not None:
                raise _stream_error(error.message()) if not error.status() else to_client_error(error)
            return chunk_from_result(result), at

        def cancel(cancel_requests: bool):
            try:
                client.stop_stream(cancel_requests=cancel_requests)
            finally:
                client.close()

        return next_chunk, cancel

    def _open_sse(self, prompt, sampling, options, stream, timeout_s):
        path = "generate_stream" if stream else "generate"
        if options.priority or options.request_id or options.parameters:
            # The generate extension turns extra JSON keys into request parameters, which the model
            # refuses as unknown; Triton's priority and id travel over gRPC.
            raise ValueError("priority, request id and parameters need protocol grpc for generation")
        body = generate_body(self.spec, prompt, sampling, stream)
        request = urllib.request.Request(f"http://{self.endpoint.url}/v2/models/{self.model}/{path}",
                                         json.dumps(body).encode(), {"Content-Type": "application/json"})
        try:
            response = urllib.request.urlopen(request, timeout=timeout_s)
        except urllib.error.HTTPError as exc:
            raise http_error(exc.code, exc.read().decode(errors="replace")) from None
        except urllib.error.URLError as exc:
            raise to_client_error(exc.reason if isinstance(exc.reason, OSError) else exc) from None
        if not stream:
            at = time.perf_counter()
            whole = chunk_from_event(json.loads(response.read()), is_final=True)
            response.close()
            return (lambda: (whole, at)), (lambda cancel_requests: None)
        events = parse_sse(iter(response.readline, b""))

        def next_chunk():
            try:
                event = next(events)
            except StopIteration:
                raise ClientError("the server closed the stream before its final response") from None
            except OSError as exc:
                raise to_client_error(exc) from None
            if "error" in event:
                raise _stream_error(event["error"])
            return chunk_from_event(event), time.perf_counter()

        # Closing the connection is how an HTTP client cancels: Triton stops the request.
        return next_chunk, lambda cancel_requests: response.close()

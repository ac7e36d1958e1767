"""The asyncio generation client: the same streams as `generation`, over grpc.aio and aiohttp.
Cancelling the consuming task, or leaving `async with` early, cancels the request on the server."""
from __future__ import annotations

import time

from .embeddings import RequestOptions
from .errors import ClientError, http_error
from .generation import Generation, GenerationSettings, TokenEvent, _assemble, _stream_error
from .payloads import Chunk, Sampling, chunk_from_event, chunk_from_result, generate_body, \
    generate_values, parse_sse, tensors
from .retry import acall_with_retry


class AsyncTokenStream:
    """An async iterator of TokenEvents; `await result()` gives the whole Generation."""

    def __init__(self, client: "AsyncGenerationClient", prompt, sampling: Sampling, options: RequestOptions,
                 stream: bool):
        self._client, self._args, self._streamed = client, (prompt, sampling, options, stream), stream
        self._events: list[TokenEvent] = []
        self._last: Chunk | None = None
        self._chunks = None
        self._done = False
        self._sent = 0.0

    async def _open(self):
        async def attempt():
            self._sent = time.perf_counter()
            self._chunks = self._client._chunks(*self._args)
            try:
                return await anext(self._chunks)  # connection errors surface with the first response
            except Exception:
                await self._chunks.aclose()
                raise

        return await acall_with_retry(attempt, self._client.retry)

    def __aiter__(self):
        return self

    async def __anext__(self) -> TokenEvent:
        if self._done:
            raise StopAsyncIteration
        try:
            chunk = await (self._open() if self._chunks is None else anext(self._chunks))
        except BaseException:  # CancelledError included: the request must not outlive its task
            await self.aclose()
            raise
        event = TokenEvent(chunk.token_ids, chunk.text, time.perf_counter() - self._sent, chunk.is_final,
                           chunk.finish_reason)
        self._events.append(event)
        if chunk.is_final:
            self._last = chunk
            await self.aclose()
        return event

    async def aclose(self) -> None:
        """Cancel the request on the server if it is still running, and release the connection."""
        self._done = True
        if self._chunks is not None:
            await self._chunks.aclose()

    async def result(self) -> Generation:
        async for _ in self:
            pass
        e2e = self._events[-1].at_s if self._events else 0.0
        return _assemble(self._events, self._last, e2e, self._streamed)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()


class AsyncGenerationClient(GenerationSettings):
    def stream(self, prompt: str | list[int], sampling: Sampling = Sampling(),
               options: RequestOptions = RequestOptions()) -> AsyncTokenStream:
        return AsyncTokenStream(self, prompt, sampling, options, stream=True)

    async def generate(self, prompt: str | list[int], sampling: Sampling = Sampling(),
                       options: RequestOptions = RequestOptions()) -> Generation:
        return await AsyncTokenStream(self, prompt, sampling, options, stream=False).result()

    def _chunks(self, prompt, sampling, options, stream):
        if self.endpoint.protocol == "grpc":
            return self._grpc_chunks(prompt, sampling, options, stream)
        return self._sse_chunks(prompt, sampling, options, stream)

    async def _grpc_chunks(self, prompt, sampling, options, stream):
        module = self.endpoint.module(asyncio=True)
        request = {"model_name": self.model, **options.triton_kwargs(),
                   "inputs": tensors(module, self.spec, generate_values(self.spec, prompt, sampling, stream))}

        async def requests():
            yield request

        client = self.endpoint.client(asyncio=True)
        responses = None
        finished = False
        try:
            responses = client.stream_infer(requests(), stream_timeout=options.timeout_s or self.endpoint.timeout_s)
            async for result, error in responses:
                if error is not None:
                    raise _stream_error(error.message())
                chunk = chunk_from_result(result)
                finished = chunk.is_final
                yield chunk
                if finished:
                    return
            raise ClientError("the server closed the stream before its final response")
        finally:
            if responses is not None and not finished:
                responses.cancel()
            await client.close()

    async def _sse_chunks(self, prompt, sampling, options, stream):
        import aiohttp

        if options.priority or options.request_id or options.parameters:
            raise ValueError("priority, request id and parameters need protocol grpc for generation")
        path = "generate_stream" if stream else "generate"
        url = f"http://{self.endpoint.url}/v2/models/{self.model}/{path}"
        timeout = aiohttp.ClientTimeout(total=options.timeout_s or self.endpoint.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.post(url, json=generate_body(self.spec, prompt, sampling, stream)) as response:
                if response.status != 200:
                    raise http_error(response.status, await response.text())
                if not stream:
                    yield chunk_from_event(await response.json(), is_final=True)
                    return
                lines = []
                async for line in response.content:  # one line at a time, as the events arrive
                    lines.append(line)
                    if line.strip():
                        continue
                    for event in parse_sse(lines):
                        if "error" in event:
                            raise _stream_error(event["error"])
                        yield chunk_from_event(event)
                    lines = []
                for event in parse_sse(lines):
                    if "error" in event:
                        raise _stream_error(event["error"])
                    yield chunk_from_event(event)
                raise ClientError("the server closed the stream before its final response")
        # Leaving the session closes the connection, which is how an HTTP client cancels.

"""Embeddings from `embed` (text in) or `minilm` (token ids, tokenized here), over HTTP or gRPC, sync
or asyncio. Large inputs are split into requests of `batch_size` texts, sent `concurrency` at a time,
so that Triton's dynamic batcher sees many requests at once."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from .connection import ClientOwner, Endpoint
from .model_spec import ModelSpec, load_spec
from .payloads import EMBED_MODEL, embedding_output, embedding_values, tensors
from .retry import RetryPolicy, acall_with_retry, call_with_retry


@dataclass(frozen=True)
class RequestOptions:
    """Per-request Triton options: priority level (0 = the model's default), a timeout (a client
    deadline, and the server-side queue timeout where the model allows the override), request id and
    parameters."""

    priority: int = 0
    timeout_s: float | None = None
    request_id: str = ""
    parameters: dict | None = None

    def triton_kwargs(self) -> dict:
        """What travels in the request itself (infer() and the stream calls of tritonclient)."""
        kwargs = {"priority": self.priority, "request_id": self.request_id, "parameters": self.parameters}
        if self.timeout_s is not None:
            kwargs["timeout"] = int(self.timeout_s * 1e6)  # Triton's queue timeout, in microseconds
        return kwargs

    def infer_kwargs(self, endpoint: Endpoint) -> dict:
        return self.triton_kwargs() | endpoint.request_timeout(self.timeout_s)


def _values(spec: ModelSpec, texts: list[str], max_length: int) -> dict:
    if not texts:
        raise ValueError("no texts to embed")
    return embedding_values(spec, texts, max_length)


def _chunks(texts: list[str], size: int) -> list[list[str]]:
    return [texts[i:i + size] for i in range(0, len(texts), size)]


class _EmbeddingBase:
    def __init__(self, endpoint: Endpoint | None = None, model: str = EMBED_MODEL, batch_size: int = 8,
                 concurrency: int = 4, retry: RetryPolicy | None = None, max_length: int = 256,
                 spec: ModelSpec | None = None):
        """`spec`: the tensors of a model served under another name (a config variant); by default
        those of the checked-in model called `model`."""
        self.endpoint = endpoint or Endpoint.resolve()
        self.model = model
        self.spec = spec or load_spec(model)
        if self.spec.max_batch_size and batch_size > self.spec.max_batch_size:
            raise ValueError(f"batch_size {batch_size} exceeds {model}'s max_batch_size {self.spec.max_batch_size}")
        if batch_size < 1 or concurrency < 1:
            raise ValueError("batch_size and concurrency must be >= 1")
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.retry = retry or RetryPolicy()
        self.max_length = max_length
        self.output = embedding_output(self.spec)


class EmbeddingClient(_EmbeddingBase, ClientOwner):
    """Sync. Over gRPC, thread-safe, and the chunks of one call go `concurrency` at a time from a
    thread pool; over HTTP, one client per thread (tritonclient's HTTP client is gevent-based) and the
    chunks go one after another: AsyncEmbeddingClient keeps many in flight over either protocol."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.module = self.endpoint.module()
        self.client = self.endpoint.client(concurrency=self.concurrency)

    def embed(self, texts: list[str], options: RequestOptions = RequestOptions()) -> np.ndarray:
        """[len(texts), dim] float32, in the order of `texts`."""
        chunks = _chunks(list(texts), self.batch_size)
        if len(chunks) == 1 or self.endpoint.protocol == "http":
            return np.concatenate([self._embed_chunk(c, options) for c in chunks])
        with ThreadPoolExecutor(self.concurrency) as pool:
            return np.concatenate(list(pool.map(lambda c: self._embed_chunk(c, options), chunks)))

    def _embed_chunk(self, texts: list[str], options: RequestOptions) -> np.ndarray:
        inputs = tensors(self.module, self.spec, _values(self.spec, texts, self.max_length))
        kwargs = options.infer_kwargs(self.endpoint)
        result = call_with_retry(lambda: self.client.infer(self.model, inputs, **kwargs), self.retry)
        return result.as_numpy(self.output)


class AsyncEmbeddingClient(_EmbeddingBase):
    """asyncio, one client for any number of concurrent calls."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.module = self.endpoint.module(asyncio=True)
        self.client = self.endpoint.client(asyncio=True, concurrency=self.concurrency)
        self._slots = asyncio.Semaphore(self.concurrency)

    async def embed(self, texts: list[str], options: RequestOptions = RequestOptions()) -> np.ndarray:
        chunks = _chunks(list(texts), self.batch_size)
        parts = await asyncio.gather(*(self._embed_chunk(c, options) for c in chunks))
        return np.concatenate(parts)

    async def _embed_chunk(self, texts: list[str], options: RequestOptions) -> np.ndarray:
        inputs = tensors(self.module, self.spec, _values(self.spec, texts, self.max_length))
        kwargs = options.infer_kwargs(self.endpoint)
        async with self._slots:
            result = await acall_with_retry(lambda: self.client.infer(self.model, inputs, **kwargs), self.retry)
        return result.as_numpy(self.output)

    async def close(self) -> None:
        await self.client.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

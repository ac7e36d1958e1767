"""Offline batch jobs: records from a JSONL/CSV file through `embed`/`minilm` (embeddings) or a
decoding model (generated text), with bounded concurrency so that Triton's batcher forms full batches,
results appended durably as they complete. Restarted with the same output file, a job skips the ids
already written: nothing lost, nothing twice."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .async_generation import AsyncGenerationClient
from .connection import Endpoint
from .embeddings import AsyncEmbeddingClient, RequestOptions
from .errors import ClientError, NotFoundError, UnavailableError
from .model_spec import load_spec
from .payloads import Sampling
from .progress import Progress
from .records import Record, ResultWriter, read_records, resume_state, InputError
from .retry import RetryPolicy
from .timing import percentile


@dataclass(frozen=True)
class JobConfig:
    input: Path
    output: Path
    model: str = "embed"
    concurrency: int = 16  # requests in flight
    batch_size: int = 4  # records per embedding request (generation: always 1)
    id_field: str = "id"
    text_field: str = "text"
    skip_invalid: bool = False  # run the valid records when some lines have problems
    max_unavailable_s: float = 300.0  # keep retrying a down server this long, then stop (resumable)
    sampling: Sampling = Sampling()
    priority: int = 0

    def __post_init__(self):
        if self.concurrency < 1 or self.batch_size < 1:
            raise ValueError("concurrency and batch_size must be >= 1")


@dataclass
class JobSummary:
    total: int  # valid records in the input
    skipped: int  # already in the output from an earlier run
    done: int = 0  # written by this run, errors included
    errors: int = 0  # written with their error
    wall_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    stopped: ClientError | None = None  # why the run ended before finishing, if it did

    @property
    def remaining(self) -> int:
        return self.total - self.skipped - self.done

    def lines(self) -> list[str]:
        rate = self.done / self.wall_s if self.wall_s > 0 else 0.0
        p50, p99 = (percentile(self.latencies_s, q) for q in (50, 99))
        ms = lambda v: "-" if v is None else f"{1e3 * v:.0f} ms"  # noqa: E731
        return [
            f"records: {self.total} in the input, {self.skipped} done earlier, {self.done} done now, "
            f"{self.errors} errors, {self.remaining} remaining",
            f"throughput: {rate:.1f} records/s over {self.wall_s:.1f} s; latency p50 {ms(p50)}, p99 {ms(p99)}",
        ]


def _is_generation(model: str) -> bool:
    return load_spec(model).config.model_transaction_policy.decoupled  # the decoding models stream


def _error_result(record: Record, error: ClientError) -> dict:
    return {"id": record.id, "error": {"type": type(error).__name__, "message": error.message}}


class BatchJob:
    def __init__(self, config: JobConfig, endpoint: Endpoint | None = None, progress_stream=None):
        self.config = config
        self.endpoint = endpoint or Endpoint.resolve()
        self.progress_stream = progress_stream
        self.generation = _is_generation(config.model)
        # A down server (restart, crash) is waited out with backoff; anything else fails at once.
        self.retry = RetryPolicy(max_attempts=1 << 30, initial_backoff_s=0.2, max_backoff_s=5.0,
                                 deadline_s=config.max_unavailable_s)

    def prepare(self) -> tuple[list[Record], JobSummary]:
        """The records still to do. Raises InputError on an unreadable file or, unless
        `skip_invalid`, on any problem line (all of them listed)."""
        records, problems = read_records(self.config.input, self.config.id_field, self.config.text_field)
        if problems and not self.config.skip_invalid:
            listed = "\n".join(f"  {p}" for p in problems[:50])
            more = f"\n  ... and {len(problems) - 50} more" if len(problems) > 50 else ""
            raise InputError(f"{self.config.input}: {len(problems)} problem(s), nothing was sent "
                             f"(--skip-invalid runs the valid records):\n{listed}{more}")
        resume = resume_state(self.config.output)
        pending = [r for r in records if r.id not in resume.done_ids]
        summary = JobSummary(total=len(records), skipped=len(records) - len(pending),
                             problems=[str(p) for p in problems])
        if resume.truncated_bytes:
            summary.problems.append(f"removed a partial last line ({resume.truncated_bytes} bytes) from "
                                    f"{self.config.output}; its record runs again")
        return pending, summary

    def run(self, prepared: tuple[list[Record], JobSummary] | None = None) -> JobSummary:
        """Run what `prepare()` returned (called here if not given). Ctrl-C raises KeyboardInterrupt
        after the results so far are synced to the output."""
        pending, summary = prepared or self.prepare()
        return asyncio.run(self._run(pending, summary))

    async def _run(self, pending: list[Record], summary: JobSummary) -> JobSummary:
        size = 1 if self.generation else self.config.batch_size
        work: asyncio.Queue = asyncio.Queue()
        for i in range(0, len(pending), size):
            work.put_nowait(pending[i:i + size])
        progress = Progress(summary.total, stream=self.progress_stream, already_done=summary.skipped)
        start = time.monotonic()
        client = self._client()  # before the output is opened: a bad setting leaves no empty file
        writer = ResultWriter(self.config.output)
        workers = [asyncio.create_task(self._worker(client, work, writer, summary, progress))
                   for _ in range(self.config.concurrency)]
        try:
            await asyncio.gather(*workers)
        except UnavailableError as e:
            summary.stopped = type(e)(f"the server stayed unavailable for {self.config.max_unavailable_s:g} s: "
                                      f"{e.message}", e.status)
        except NotFoundError as e:
            summary.stopped = e
        finally:
            for task in workers:  # after a failure or Ctrl-C, what is in flight is dropped, not written
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            writer.close()
            summary.wall_s = time.monotonic() - start
            progress.close()
            if not self.generation:
                await client.close()
        return summary

    def _client(self):
        if self.generation:
            return AsyncGenerationClient(self.endpoint, self.config.model, retry=self.retry)
        return AsyncEmbeddingClient(self.endpoint, self.config.model, batch_size=self.config.batch_size,
                                    concurrency=self.config.concurrency, retry=self.retry)

    async def _worker(self, client, work: asyncio.Queue, writer: ResultWriter, summary: JobSummary,
                      progress: Progress) -> None:
        while not work.empty():
            batch: list[Record] = work.get_nowait()
            sent = time.perf_counter()
            results = await self._process(client, batch)
            latency = time.perf_counter() - sent
            errors = 0
            for result in results:
                if "error" in result:
                    errors += 1
                else:
                    result["latency_ms"] = round(1e3 * latency, 3)
                writer.write(result)
            summary.done += len(results)
            summary.errors += errors
            summary.latencies_s.append(latency)
            progress.update(len(results), errors)

    async def _process(self, client, batch: list[Record]) -> list[dict]:
        """Results for `batch`; a request refused for one bad record is split so that only that
        record is written with the error. Errors that are not about the records propagate and stop
        the job: the server unavailable past the retry deadline, or no such model."""
        options = RequestOptions(priority=self.config.priority)
        try:
            if self.generation:
                (record,) = batch
                g = await client.generate(record.text, self.config.sampling, options)
                return [{"id": record.id, "text": g.text, "token_ids": list(g.token_ids),
                         "finish_reason": g.finish_reason, "num_output_tokens": g.num_output_tokens}]
            vectors = await client.embed([r.text for r in batch], options)
            # 8 decimals hold float32's precision for unit vectors, and halve the JSON (and its cost).
            rows = vectors.astype(np.float64).round(8).tolist()
            return [{"id": r.id, "embedding": row} for r, row in zip(batch, rows)]
        except (UnavailableError, NotFoundError):
            raise
        except ClientError as error:
            if len(batch) > 1:
                return [result for r in batch for result in await self._process(client, [r])]
            return [_error_result(batch[0], error)]

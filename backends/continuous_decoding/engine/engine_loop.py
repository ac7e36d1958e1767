"""The engine's own thread: takes submitted requests, polls cancellation, steps the engine while
there is work, and hands each token to the request's sink. No Triton imports: the Triton edge
supplies sinks that encode and send responses."""
from __future__ import annotations

import queue
import threading
import traceback
from dataclasses import dataclass
from typing import Callable, Protocol

from .engine import LLMEngine, TokenOutput
from .sampling_params import InvalidRequest, SamplingParams
from .sequence import FinishReason


class Sink(Protocol):
    """Where one request's results go. Called on the engine thread only."""

    def on_token(self, output: TokenOutput) -> None: ...  # also carries the final output

    def on_error(self, message: str, invalid_argument: bool) -> None: ...  # ends the request

    def is_cancelled(self) -> bool: ...


@dataclass(frozen=True)
class Submission:
    prompt_token_ids: list[int]
    sampling: SamplingParams
    sink: Sink
    priority: int = 0


class EngineLoop:
    """Owns the engine; other threads only call submit() and stop()."""

    def __init__(self, engine: LLMEngine, on_step: Callable[[LLMEngine], None] | None = None,
                 idle_poll_s: float = 0.05):
        self.engine = engine
        self._inbox: queue.Queue[Submission | None] = queue.Queue()
        self._sinks: dict[int, Sink] = {}  # engine thread only
        self._next_id = 0  # engine thread only
        self._on_step = on_step
        self._idle_poll_s = idle_poll_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self) -> "EngineLoop":
        self._thread.start()
        return self

    def submit(self, submission: Submission) -> None:
        self._inbox.put(submission)

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopped.set()
        self._inbox.put(None)
        self._thread.join(timeout_s)

    @property
    def num_active(self) -> int:
        return len(self._sinks)

    def _run(self) -> None:
        while not self._stopped.is_set():
            # Block for new work only when idle; while decoding, take whatever has arrived.
            self._admit(block=not self.engine.has_unfinished())
            self._poll_cancellations()
            if not self.engine.has_unfinished():
                continue
            try:
                outputs = self.engine.step()
            except Exception:  # the step failed: every live request ends with the error
                self._fail_all(f"engine step failed: {traceback.format_exc(limit=3)}")
                continue
            for out in outputs:
                self._deliver(out)
            if self._on_step is not None:
                try:
                    self._on_step(self.engine)
                except Exception:  # metrics must never stop the engine
                    traceback.print_exc()
        self._fail_all("the model is shutting down")

    def _admit(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=self._idle_poll_s) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while item is not None:
            self._add(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _add(self, sub: Submission) -> None:
        seq_id = self._next_id
        self._next_id += 1
        try:
            self.engine.add_request(seq_id, sub.prompt_token_ids, sub.sampling, sub.priority)
        except InvalidRequest as e:
            sub.sink.on_error(str(e), invalid_argument=True)
            return
        self._sinks[seq_id] = sub.sink

    def _poll_cancellations(self) -> None:
        for seq_id, sink in list(self._sinks.items()):
            if sink.is_cancelled():
                out = self.engine.abort(seq_id)
                if out is not None:
                    self._deliver(out)
                else:
                    self._sinks.pop(seq_id, None)

    def _deliver(self, out: TokenOutput) -> None:
        sink = self._sinks.get(out.seq_id)
        if sink is None:
            return
        if out.finished:
            del self._sinks[out.seq_id]
        try:
            sink.on_token(out)
        except Exception:  # this request's sender broke (e.g. the client left): drop it, keep the rest
            traceback.print_exc()
            self._sinks.pop(out.seq_id, None)
            if not out.finished:
                self.engine.abort(out.seq_id)

    def _fail_all(self, message: str) -> None:
        for seq_id, sink in list(self._sinks.items()):
            try:
                self.engine.abort(seq_id)
                sink.on_error(message, invalid_argument=False)
            except Exception:
                traceback.print_exc()
        self._sinks.clear()


__all__ = ["EngineLoop", "Sink", "Submission", "FinishReason"]

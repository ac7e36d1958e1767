"""The engine's own thread: takes submitted requests, polls cancellation, steps the engine while
there is work, and hands each token to the request's sink. No Triton imports: the Triton edge
supplies sinks that encode and send responses."""
from __future__ import annotations

import queue
import sys
import threading
import traceback
from dataclasses import dataclass
from typing import Callable, Protocol

from .engine import LLMEngine, TokenOutput
from .sampling_params import InvalidRequest, SamplingParams


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
        if self._thread.is_alive():
            print(f"engine loop still running {timeout_s:.0f} s after stop()", file=sys.stderr)

    @property
    def num_active(self) -> int:
        return len(self._sinks)

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self._iterate()
            except Exception:  # never let the thread die: every later request would hang
                self._fail_all(f"engine step failed: {traceback.format_exc(limit=3)}")
        self._fail_all("the model is shutting down")
        self._refuse_queued("the model is shutting down")

    def _iterate(self) -> None:
        # Block for new work only when idle; while decoding, take whatever has arrived.
        self._admit(block=not self.engine.has_unfinished())
        changed = self._poll_cancellations()
        if not self.engine.has_unfinished():
            if changed:
                self._report()
            return
        outputs = self.engine.step()
        self._report()  # before delivery: a client that saw its final token sees the metrics of that step
        for out in outputs:
            self._deliver(out)

    def _report(self) -> None:
        if self._on_step is None:
            return
        try:
            self._on_step(self.engine)
        except Exception:  # metrics must never stop the engine
            traceback.print_exc()

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
            _send_error(sub.sink, str(e), invalid_argument=True)
            return
        except Exception as e:  # a bug, not the client's fault: this request alone fails
            traceback.print_exc()
            _send_error(sub.sink, f"could not start the request: {e}", invalid_argument=False)
            return
        self._sinks[seq_id] = sub.sink

    def _poll_cancellations(self) -> bool:
        """Abort the requests whose clients cancelled; True if any was."""
        changed = False
        for seq_id, sink in list(self._sinks.items()):
            try:
                cancelled = sink.is_cancelled()
            except Exception:
                traceback.print_exc()
                cancelled = True
            if cancelled:
                changed = True
                out = self.engine.abort(seq_id)
                if out is not None:
                    self._deliver(out)
                else:
                    self._sinks.pop(seq_id, None)
        return changed

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

    def _refuse_queued(self, message: str) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                _send_error(item.sink, message, invalid_argument=False)

    def _fail_all(self, message: str) -> None:
        for seq_id, sink in list(self._sinks.items()):
            try:
                self.engine.abort(seq_id)
            except Exception:
                traceback.print_exc()
            _send_error(sink, message, invalid_argument=False)
        self._sinks.clear()


def _send_error(sink: Sink, message: str, invalid_argument: bool) -> None:
    try:
        sink.on_error(message, invalid_argument)
    except Exception:  # the sender is gone too; nothing more can reach this client
        traceback.print_exc()


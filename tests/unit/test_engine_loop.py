"""The engine thread with sinks that misbehave: one broken sink must not stop the others."""
import threading

import pytest

from backends.continuous_decoding.engine.config import EngineConfig
from backends.continuous_decoding.engine.engine import LLMEngine
from backends.continuous_decoding.engine.engine_loop import EngineLoop, Submission
from backends.continuous_decoding.engine.sampling_params import SamplingParams
from backends.continuous_decoding.engine.sequence import FinishReason
from backends.continuous_decoding.engine.weights import load_weights
from scripts.make_decoder_weights import RandomShape, make_random_checkpoint


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    path = make_random_checkpoint(tmp_path_factory.mktemp("gpt2"),
                                  RandomShape(n_layer=1, n_embd=32, n_head=2, n_positions=64, vocab_size=200),
                                  seed=0, log=lambda *_: None)
    return load_weights(path)


class Sink:
    def __init__(self, fail_after=None):
        self.tokens, self.errors, self.done = [], [], threading.Event()
        self.fail_after = fail_after

    def on_token(self, out):
        if self.fail_after is not None and len(self.tokens) >= self.fail_after:
            raise ConnectionError("the client went away")
        self.tokens.append(out.token_id)
        if out.finished:
            self.done.set()

    def on_error(self, message, invalid_argument):
        self.errors.append((message, invalid_argument))
        self.done.set()

    def is_cancelled(self):
        return False


def test_a_broken_sink_is_dropped_and_the_others_finish(weights):
    config = EngineConfig.from_parameters({"max_model_len": "64", "kv_cache_bytes": str(1 << 20)})
    engine = LLMEngine(config, weights)
    loop = EngineLoop(engine).start()
    try:
        broken, good = Sink(fail_after=2), Sink()
        params = SamplingParams(max_tokens=10, ignore_eos=True)
        loop.submit(Submission([1, 2, 3], params, broken))
        loop.submit(Submission([4, 5, 6], params, good))
        assert good.done.wait(30), "the healthy request never finished"
        assert len(good.tokens) == 10
        deadline = threading.Event()
        for _ in range(300):
            if engine.block_manager.num_used_blocks == 0 and not engine.has_unfinished():
                break
            deadline.wait(0.01)
        assert engine.block_manager.num_used_blocks == 0, "the broken request's blocks were not freed"
    finally:
        loop.stop()


def test_an_invalid_request_is_answered_with_invalid_argument(weights):
    config = EngineConfig.from_parameters({"max_model_len": "64", "kv_cache_bytes": str(1 << 20)})
    loop = EngineLoop(LLMEngine(config, weights)).start()
    try:
        sink = Sink()
        loop.submit(Submission([1] * 80, SamplingParams(max_tokens=4), sink))
        assert sink.done.wait(30)
        (message, invalid), = sink.errors
        assert invalid and "prompt" in message
    finally:
        loop.stop()


class OrderedSink(Sink):
    """Records each output. Notes any call made while another is still running on it; with a
    barrier, its first token waits until every sink holds its first token at once."""

    def __init__(self, barrier=None, cancel_after=None):
        super().__init__()
        self.outputs, self.overlapped, self.barrier, self.cancel_after = [], False, barrier, cancel_after
        self._busy = threading.Lock()

    def on_token(self, out):
        if not self._busy.acquire(blocking=False):
            self.overlapped = True
            return
        try:
            if self.barrier is not None and not self.outputs:
                self.barrier.wait()  # BrokenBarrierError unless the sinks are called at once
            self.outputs.append(out)
            super().on_token(out)
        finally:
            self._busy.release()

    def is_cancelled(self):
        return self.cancel_after is not None and len(self.outputs) >= self.cancel_after


def run_loop(weights, sinks, sink_threads, max_tokens=12):
    config = EngineConfig.from_parameters({"max_model_len": "64", "kv_cache_bytes": str(1 << 20)})
    engine = LLMEngine(config, weights)
    loop = EngineLoop(engine, sink_threads=sink_threads)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for i, sink in enumerate(sinks):  # queued before the loop starts, so they share every step
        loop.submit(Submission([3 + i, 4, 5], params, sink))
    loop.start()
    try:
        for sink in sinks:
            assert sink.done.wait(30), "a request never finished"
        return engine
    finally:
        loop.stop()


def test_sink_threads_hand_a_step_to_its_sinks_at_once_and_in_order(weights):
    barrier = threading.Barrier(4, timeout=10)
    sinks = [OrderedSink(barrier) for _ in range(4)]
    engine = run_loop(weights, sinks, sink_threads=4)
    for sink in sinks:
        assert not sink.errors and not sink.overlapped
        assert [o.num_output_tokens for o in sink.outputs] == list(range(1, 13)), "tokens out of order"
        assert [o.finished for o in sink.outputs] == [False] * 11 + [True]
    assert engine.block_manager.num_used_blocks == 0


def test_more_sinks_than_sink_threads_each_get_every_token_once(weights):
    sinks = [OrderedSink() for _ in range(7)]
    run_loop(weights, sinks, sink_threads=3)
    for sink in sinks:
        assert not sink.overlapped
        assert [o.num_output_tokens for o in sink.outputs] == list(range(1, 13))


@pytest.mark.parametrize("sink_threads", [1, 3])
def test_a_cancelled_request_ends_once_with_its_blocks_free(weights, sink_threads):
    cancelled, others = OrderedSink(cancel_after=3), [OrderedSink() for _ in range(3)]
    engine = run_loop(weights, [cancelled, *others], sink_threads=sink_threads, max_tokens=20)
    assert cancelled.outputs[-1].finish_reason == FinishReason.CANCELLED
    assert [o.finished for o in cancelled.outputs].count(True) == 1 and len(cancelled.outputs) < 20
    for sink in others:
        assert len(sink.outputs) == 20 and sink.outputs[-1].finish_reason == FinishReason.LENGTH
    assert engine.block_manager.num_used_blocks == 0


def test_a_broken_sink_on_a_sink_thread_is_dropped_and_the_others_finish(weights):
    broken, good = Sink(fail_after=2), [OrderedSink() for _ in range(3)]
    config = EngineConfig.from_parameters({"max_model_len": "64", "kv_cache_bytes": str(1 << 20)})
    engine = LLMEngine(config, weights)
    loop = EngineLoop(engine, sink_threads=4)
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    for i, sink in enumerate([*good, broken]):
        loop.submit(Submission([3 + i, 4, 5], params, sink))
    loop.start()
    try:
        for sink in good:
            assert sink.done.wait(30) and len(sink.outputs) == 10
    finally:
        loop.stop()
    assert engine.block_manager.num_used_blocks == 0, "the broken request's blocks were not freed"


def test_fewer_than_one_sink_thread_is_refused(weights):
    config = EngineConfig.from_parameters({"max_model_len": "64", "kv_cache_bytes": str(1 << 20)})
    with pytest.raises(ValueError, match="sink_threads"):
        EngineLoop(LLMEngine(config, weights), sink_threads=0)

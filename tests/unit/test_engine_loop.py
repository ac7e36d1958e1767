"""The engine thread with sinks that misbehave: one broken sink must not stop the others."""
import threading

import pytest

from backends.continuous_decoding.engine.config import EngineConfig
from backends.continuous_decoding.engine.engine import LLMEngine
from backends.continuous_decoding.engine.engine_loop import EngineLoop, Submission
from backends.continuous_decoding.engine.sampling_params import SamplingParams
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

"""The whole engine (scheduler, paged cache, runner, sampler) against Hugging Face on the same
weights: 16 prompts of different lengths submitted at once, chunked prefill on, and a KV budget small
enough to force preemptions. Tokens must agree under the near-tie rule (tests/fixtures/token_agreement.py);
exact equality would be wrong, since batching changes the last bits of the logits."""
import numpy as np
import pytest
import torch
from transformers import GPT2LMHeadModel

from backends.continuous_decoding.engine.config import EngineConfig
from backends.continuous_decoding.engine.engine import LLMEngine
from backends.continuous_decoding.engine.sampling_params import InvalidRequest, SamplingParams
from backends.continuous_decoding.engine.sequence import FinishReason
from backends.continuous_decoding.engine.weights import load_weights
from scripts.make_decoder_weights import RandomShape
from tests.fixtures.small_gpt2 import make_test_checkpoint
from tests.fixtures.token_agreement import assert_greedy_agreement, log_softmax

SMALL = RandomShape(n_layer=2, n_embd=64, n_head=4, n_positions=128, vocab_size=1000)
BLOCK_SIZE = 4
BYTES_PER_BLOCK = 2 * SMALL.n_layer * BLOCK_SIZE * SMALL.n_embd * 4
NUM_PROMPTS, MAX_TOKENS = 16, 20


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_test_checkpoint(tmp_path_factory.mktemp("gpt2"), SMALL)


@pytest.fixture(scope="module")
def weights(checkpoint):
    return load_weights(checkpoint)


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(3)
    return [rng.integers(0, SMALL.vocab_size, size=n).tolist() for n in rng.integers(1, 60, size=NUM_PROMPTS)]


@pytest.fixture(scope="module")
def reference(checkpoint, prompts):
    """Hugging Face greedy decoding, one prompt at a time, with the log-probabilities of each step."""
    model = GPT2LMHeadModel.from_pretrained(checkpoint, attn_implementation="eager", dtype=torch.float32).eval()
    results = []
    for prompt in prompts:
        ids, tokens, rows = list(prompt), [], []
        with torch.no_grad():
            for _ in range(MAX_TOKENS):
                logits = model(torch.tensor([ids])).logits[0, -1].numpy()
                tokens.append(int(np.argmax(logits)))
                rows.append(log_softmax(logits))
                ids.append(tokens[-1])
        results.append((tokens, rows))
    return results


def engine_config(**overrides) -> EngineConfig:
    values = dict(block_size=str(BLOCK_SIZE), max_model_len="128", max_num_seqs="16",
                  max_num_batched_tokens="32", kv_cache_bytes=str(48 * BYTES_PER_BLOCK))
    values.update({k: str(v) for k, v in overrides.items()})
    return EngineConfig.from_parameters(values)


def run(engine, prompts, **sampling):
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, **sampling)
    return engine.generate(prompts, params)


@pytest.mark.parametrize("scheduling", ["continuous", "static"])
def test_greedy_agrees_with_hugging_face_under_chunking_and_preemption(weights, prompts, reference, scheduling):
    engine = LLMEngine(engine_config(scheduling=scheduling), weights, record_logprobs=True)
    results = run(engine, prompts)
    for i, (ref_tokens, ref_rows) in enumerate(reference):
        outs = results[i]
        assert outs[-1].finish_reason is FinishReason.LENGTH
        assert_greedy_agreement([o.token_id for o in outs], [o.logprobs for o in outs], ref_tokens, ref_rows,
                                label=f"prompt {i} ({len(prompts[i])} tokens): ")
        assert all(o.logprob == float(o.logprobs[o.token_id]) <= 0 for o in outs)
    # 48 blocks of 4 tokens hold 192 tokens; the 16 sequences need about 16 * 50 at once.
    if scheduling == "continuous":
        assert engine.stats.num_preemptions > 0, "the small cache must force preemptions"
    else:
        assert engine.stats.num_preemptions == 0, "a static batch is sized to never preempt"
    assert engine.block_manager.num_used_blocks == 0
    assert max(len(p) for p in prompts) > 32, "some prompt must need more than one prefill chunk"


def test_continuous_takes_fewer_steps_than_static(weights, prompts):
    """More requests than slots, of different lengths: a static batch holds its slots until its
    longest member finishes, continuous batching refills each slot as soon as it frees."""
    rng = np.random.default_rng(0)
    params = [SamplingParams(max_tokens=int(n), ignore_eos=True) for n in rng.integers(2, 40, size=len(prompts))]
    steps = {}
    for scheduling in ("continuous", "static"):
        engine = LLMEngine(engine_config(scheduling=scheduling, max_num_seqs=4,
                                         kv_cache_bytes=512 * BYTES_PER_BLOCK), weights)
        engine.generate(prompts, params)
        steps[scheduling] = engine.stats.num_steps
    assert steps["continuous"] < steps["static"]


def test_seeded_sampling_is_reproducible_and_differs_by_seed(weights, prompts):
    def sample_tokens(seed):
        engine = LLMEngine(engine_config(), weights)
        out = run(engine, prompts[:4], temperature=1.0, top_k=50, top_p=0.9, seed=seed)
        return [[o.token_id for o in out[i]] for i in range(4)]

    assert sample_tokens(7) == sample_tokens(7)
    assert sample_tokens(7) != sample_tokens(8)


def test_stop_tokens_and_eos_end_a_sequence(weights, prompts, reference):
    engine = LLMEngine(engine_config(), weights)
    ref_tokens = reference[0][0]
    stop_at = ref_tokens[5]
    out = engine.generate([prompts[0]], SamplingParams(max_tokens=MAX_TOKENS, stop_token_ids=(stop_at,)))[0]
    assert out[-1].finish_reason is FinishReason.STOP and out[-1].token_id == stop_at
    assert len(out) == ref_tokens.index(stop_at) + 1
    assert all(o.logprob is None and o.logprobs is None for o in out), "log-probabilities only when recorded"


def test_abort_frees_blocks_at_once(weights, prompts):
    engine = LLMEngine(engine_config(), weights)
    for i, p in enumerate(prompts[:4]):
        engine.add_request(i, p, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    for _ in range(5):
        engine.step()
    assert engine.block_manager.num_used_blocks > 0
    for i in range(4):
        out = engine.abort(i)
        assert out is not None and out.finish_reason is FinishReason.CANCELLED
    assert engine.block_manager.num_used_blocks == 0 and not engine.has_unfinished()
    assert engine.abort(0) is None


@pytest.mark.parametrize("prompt, sampling, field", [
    ([], SamplingParams(), "prompt"),
    ([1, SMALL.vocab_size], SamplingParams(), "input_ids"),
    ([1] * 128, SamplingParams(), "prompt"),
    ([1] * 100, SamplingParams(max_tokens=50), "max_tokens"),
    ([1, 2], SamplingParams(stop_token_ids=(-1,)), "stop_token_ids"),
])
def test_refused_at_once_with_the_field_named(weights, prompt, sampling, field):
    engine = LLMEngine(engine_config(), weights)
    with pytest.raises(InvalidRequest) as caught:
        engine.add_request(0, prompt, sampling)
    assert caught.value.field == field
    assert not engine.has_unfinished()


def test_max_model_len_beyond_the_positions_is_refused(weights):
    from backends.continuous_decoding.engine.config import ConfigError

    with pytest.raises(ConfigError, match="max_model_len"):
        LLMEngine(engine_config(max_model_len=256), weights)

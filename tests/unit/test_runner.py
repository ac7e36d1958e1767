"""CpuRunner against Hugging Face GPT2LMHeadModel on the same small random weights: prefill, ragged
batches over shuffled cache blocks, chunked prefill, greedy generation; and the weights script's output.

Tolerance: both sides compute in float32 and differ only in summation order; the measured max |diff| is
about 1e-6 on logits of standard deviation ~0.8 (the weights are scaled up below so that logits are
O(1) like a trained model's). LOGIT_ATOL leaves two orders of magnitude for other BLAS builds, while a
wrong mask, position, block or bias moves logits by 1e-2 or more."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer
from transformers import GPT2LMHeadModel

from backends.continuous_decoding.engine.batch import build_batch
from backends.continuous_decoding.engine.runner import CpuRunner, ModelRunner, kv_cache_bytes_per_block
from backends.continuous_decoding.engine.weights import WeightsError, load_weights
from scripts import make_decoder_weights as mdw
from tests.fixtures.small_gpt2 import make_test_checkpoint
from tests.fixtures.token_agreement import assert_greedy_agreement, log_softmax

SMALL = mdw.RandomShape(n_layer=2, n_embd=64, n_head=4, n_positions=128, vocab_size=1000)
BLOCK_SIZE = 4  # small, so that every sequence spans several blocks
NUM_BLOCKS = 256
LOGIT_ATOL = 1e-4


def _quiet(line: str) -> None:
    pass


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_test_checkpoint(tmp_path_factory.mktemp("gpt2"), SMALL)


@pytest.fixture(scope="module")
def hf_model(checkpoint):
    model = GPT2LMHeadModel.from_pretrained(checkpoint, attn_implementation="eager", dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def weights(checkpoint):
    return load_weights(checkpoint)


def hf_logits(model, token_ids: list[int]) -> np.ndarray:
    """[len(token_ids), vocab]: the reference's logits at every position, no cache."""
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].numpy()


class Blocks:
    """Hands out cache blocks in a shuffled order, so that tables are never contiguous."""

    def __init__(self, seed: int = 0):
        self.free = np.random.default_rng(seed).permutation(NUM_BLOCKS).tolist()

    def grow(self, table: list[int], num_tokens: int) -> list[int]:
        while len(table) * BLOCK_SIZE < num_tokens:
            table.append(self.free.pop())
        return table


def prompts(seed: int, lengths) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, SMALL.vocab_size, n).tolist() for n in lengths]


def test_single_prefill_matches_hf(weights, hf_model):
    runner = CpuRunner(weights, NUM_BLOCKS, BLOCK_SIZE)
    assert isinstance(runner, ModelRunner)
    (prompt,) = prompts(0, [23])
    table = Blocks().grow([], len(prompt))
    logits = runner.execute(build_batch([(prompt, 0, len(prompt), table)], BLOCK_SIZE))
    assert logits.shape == (1, SMALL.vocab_size) and logits.dtype == np.float32
    expected = hf_logits(hf_model, prompt)[-1]
    assert expected.std() > 0.3  # O(1) logits, so the tolerance is meaningful
    np.testing.assert_allclose(logits[0], expected, rtol=0, atol=LOGIT_ATOL)


def test_ragged_batch_then_decode_steps_match_hf(weights, hf_model):
    """Several prompts (one of a single token) prefilled together, then greedy decode steps for all of
    them, with a late prompt prefilled in the same step as the others' decodes."""
    runner, blocks = CpuRunner(weights, NUM_BLOCKS, BLOCK_SIZE), Blocks(seed=1)
    seqs = [{"tokens": p, "computed": 0, "table": []} for p in prompts(1, [1, 7, 13, 30])]
    late = {"tokens": prompts(2, [9])[0], "computed": 0, "table": []}
    max_diff = 0.0
    for step in range(7):
        if step == 3:
            seqs.append(late)
        scheduled = []
        for s in seqs:
            num_new = len(s["tokens"]) - s["computed"]
            scheduled.append((s["tokens"], s["computed"], num_new, blocks.grow(s["table"], len(s["tokens"]))))
        logits = runner.execute(build_batch(scheduled, BLOCK_SIZE))
        assert logits.shape == (len(seqs), SMALL.vocab_size)
        for s, row in zip(seqs, logits):
            expected = hf_logits(hf_model, s["tokens"])[-1]
            max_diff = max(max_diff, float(np.abs(row - expected).max()))
            s["computed"] = len(s["tokens"])
            s["tokens"] = s["tokens"] + [int(np.argmax(row))]
    assert max_diff < LOGIT_ATOL, max_diff


def test_chunked_prefill_matches_one_chunk(weights, hf_model):
    (prompt,) = prompts(3, [23])
    whole = CpuRunner(weights, NUM_BLOCKS, BLOCK_SIZE)
    table = Blocks(seed=2).grow([], len(prompt))
    one_chunk = whole.execute(build_batch([(prompt, 0, len(prompt), table)], BLOCK_SIZE))[0]
    chunked, table = CpuRunner(weights, NUM_BLOCKS, BLOCK_SIZE), Blocks(seed=3).grow([], len(prompt))
    reference = hf_logits(hf_model, prompt)
    for start in range(0, len(prompt), 5):
        num_new = min(5, len(prompt) - start)
        last = chunked.execute(build_batch([(prompt, start, num_new, table)], BLOCK_SIZE))[0]
        # Each chunk's last token sees all earlier chunks through the cache.
        np.testing.assert_allclose(last, reference[start + num_new - 1], rtol=0, atol=LOGIT_ATOL)
    np.testing.assert_allclose(last, one_chunk, rtol=0, atol=LOGIT_ATOL)


def test_greedy_generation_agrees_with_hf_generate(weights, hf_model):
    """All prompts decoded together in one ragged batch per step, each compared with HF alone."""
    max_new_tokens, eos = 20, hf_model.config.eos_token_id
    batch_prompts = prompts(4, [3, 11, 25, 40])
    runner, blocks = CpuRunner(weights, NUM_BLOCKS, BLOCK_SIZE), Blocks(seed=4)
    seqs = [{"tokens": list(p), "computed": 0, "table": [], "out": [], "logprobs": []} for p in batch_prompts]
    for _ in range(max_new_tokens):
        live = [s for s in seqs if len(s["out"]) < max_new_tokens and eos not in s["out"]]
        if not live:
            break
        scheduled = [(s["tokens"], s["computed"], len(s["tokens"]) - s["computed"],
                      blocks.grow(s["table"], len(s["tokens"]))) for s in live]
        logits = runner.execute(build_batch(scheduled, BLOCK_SIZE))
        for s, row in zip(live, logits):
            token = int(np.argmax(row))
            s["computed"] = len(s["tokens"])
            s["tokens"].append(token)
            s["out"].append(token)
            s["logprobs"].append(log_softmax(row))
    for i, (prompt, s) in enumerate(zip(batch_prompts, seqs)):
        with torch.no_grad():
            ref = hf_model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                                    output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        ref_tokens = ref.sequences[0, len(prompt):].tolist()
        ref_logprobs = [log_softmax(step[0].numpy()) for step in ref.logits]
        assert_greedy_agreement(s["out"], s["logprobs"], ref_tokens, ref_logprobs, label=f"prompt {i}: ")


def test_token_agreement_rule():
    near_tie = np.log(np.array([0.4, 0.3998, 0.2, 0.0002]))
    clear = np.log(np.array([0.6, 0.2, 0.1, 0.1]))
    assert assert_greedy_agreement([0, 2], [clear, clear], [0, 2], [clear, clear]) is None
    assert assert_greedy_agreement([0, 0], [clear, near_tie], [0, 1], [clear, near_tie]) == 1
    with pytest.raises(AssertionError, match="not a near-tie"):
        assert_greedy_agreement([0], [clear], [1], [clear])
    with pytest.raises(AssertionError, match="top 2"):
        assert_greedy_agreement([0], [near_tie], [3], [near_tie], top_k=2, max_logprob_gap=10.0)


def test_runner_refuses_positions_past_the_table_and_short_block_tables(weights):
    runner = CpuRunner(weights, NUM_BLOCKS, BLOCK_SIZE)
    assert runner.kv_cache_bytes == NUM_BLOCKS * kv_cache_bytes_per_block(weights.config, BLOCK_SIZE)
    too_long = [0] * (SMALL.n_positions + 1)
    table = list(range(-(-len(too_long) // BLOCK_SIZE)))
    with pytest.raises(ValueError, match="n_positions"):
        runner.execute(build_batch([(too_long, 0, len(too_long), table)], BLOCK_SIZE))
    with pytest.raises(ValueError, match="block table"):
        batch = build_batch([([1] * 9, 0, 9, [0, 1, 2])], BLOCK_SIZE)
        runner.execute(dataclasses.replace(batch, block_tables=((0, 1),)))
    with pytest.raises(ValueError, match="context_lens"):  # fewer cached tokens than new ones
        batch = build_batch([([1] * 9, 0, 9, [0, 1, 2])], BLOCK_SIZE)
        runner.execute(dataclasses.replace(batch, context_lens=(5,)))


def test_script_default_output_loads_in_transformers_with_a_matching_tokenizer(tmp_path, capsys):
    """The default vocabulary (the MiniLM tokenizer's) at small dimensions, through the command line."""
    argv = ["--output", str(tmp_path), "--n-layer", "1", "--n-embd", "32", "--n-head", "2",
            "--n-positions", "64", "--skip-if-current"]
    assert mdw.main(argv) == 0
    model, info = GPT2LMHeadModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()  # tied
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["architectures"] == ["GPT2LMHeadModel"]
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == config["vocab_size"] == 30522
    assert config["eos_token_id"] == config["bos_token_id"] == tokenizer.token_to_id("[SEP]")
    ids = tokenizer.encode("continuous batching").ids
    assert config["eos_token_id"] not in ids and 0 not in ids  # no [SEP] appended, no padding
    assert load_weights(tmp_path).config.n_embd == 32
    capsys.readouterr()
    assert mdw.main(argv) == 0
    assert "skipping" in capsys.readouterr().out


def test_checkpoint_copy_converts_pytorch_bin(tmp_path, checkpoint, weights):
    source = tmp_path / "source"
    source.mkdir()
    (source / "config.json").write_text((checkpoint / "config.json").read_text())
    torch.save(GPT2LMHeadModel.from_pretrained(checkpoint).state_dict(), source / "pytorch_model.bin")
    copied = load_weights(mdw.copy_checkpoint(source, tmp_path / "out", log=_quiet))
    assert not (tmp_path / "out" / "tokenizer.json").exists()
    np.testing.assert_array_equal(copied.layers[1].fc_weight, weights.layers[1].fc_weight)
    np.testing.assert_array_equal(copied.wte, weights.wte)


def test_weights_without_the_transformer_prefix_load_the_same(tmp_path, checkpoint, weights):
    tensors = load_file(str(checkpoint / "model.safetensors"))
    unprefixed = {k.removeprefix("transformer."): v for k, v in tensors.items()}  # as GPT2Model saves
    save_file(unprefixed, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((checkpoint / "config.json").read_text())
    np.testing.assert_array_equal(load_weights(tmp_path).layers[0].qkv_weight, weights.layers[0].qkv_weight)


def test_weights_refuse_what_the_runner_cannot_run(tmp_path, checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match="model.safetensors: missing"):
        load_weights(tmp_path)
    (tmp_path / "model.safetensors").write_bytes((checkpoint / "model.safetensors").read_bytes())
    for key, value, field in (("model_type", "bert", "model_type"), ("activation_function", "relu",
                              "activation_function"), ("n_head", 5, "n_embd: 64 is not divisible"),
                              ("n_embd", 48, "config.json implies")):
        (tmp_path / "config.json").write_text(json.dumps({**config, key: value}))
        with pytest.raises(WeightsError, match=field):
            load_weights(tmp_path)

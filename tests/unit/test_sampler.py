"""The sampler on hand-made logits: log-probabilities, greedy, top-k and top-p filtering."""
from __future__ import annotations

import numpy as np

from backends.continuous_decoding.engine.sampler import filtered_probs, log_softmax, make_generator, sample
from backends.continuous_decoding.engine.sampling_params import SamplingParams


def test_log_softmax_is_stable_where_a_plain_one_overflows():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((5, 1000)) * 8).astype(np.float32)
    logits[2, 7] = 90.0  # a dominant logit: exp(90) overflows float32 without the max shift
    as_64 = logits.astype(np.float64)
    reference = as_64 - as_64.max(axis=1, keepdims=True)
    reference -= np.log(np.exp(reference).sum(axis=1, keepdims=True))
    result = log_softmax(logits)
    assert np.isfinite(result).all()
    np.testing.assert_allclose(result, reference, rtol=0, atol=1e-5)


def test_greedy_takes_the_argmax_of_each_row():
    logits = np.array([[0.0, 3.0, 1.0], [2.0, 0.0, 2.5]], dtype=np.float32)
    params = [SamplingParams(max_tokens=1)] * 2
    assert sample(logits, params, [make_generator(p) for p in params]).tolist() == [1, 2]


def test_top_k_and_top_p_keep_only_the_head_of_the_distribution():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    top_k = filtered_probs(logits, SamplingParams(max_tokens=1, temperature=1.0, top_k=2))
    np.testing.assert_allclose(top_k, [0.5 / 0.8, 0.3 / 0.8, 0, 0], atol=1e-12)
    top_p = filtered_probs(logits, SamplingParams(max_tokens=1, temperature=1.0, top_p=0.85))
    np.testing.assert_allclose(top_p, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0], atol=1e-12)  # crosses at the 3rd

"""Turns the last-token logits of each sequence into its next token: greedy, or temperature with
top-k and top-p, from a per-request random generator so that a seed reproduces a request."""
from __future__ import annotations

import numpy as np

from .sampling_params import SamplingParams


def log_softmax(logits: np.ndarray) -> np.ndarray:
    # [n, vocab] float32 -> [n, vocab]
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def make_generator(params: SamplingParams) -> np.random.Generator:
    """Seeded when the request gives a seed (reproducible), from OS entropy otherwise."""
    return np.random.default_rng(params.seed)


def filtered_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """[vocab] logits -> [vocab] probabilities after temperature, top-k and top-p."""
    scaled = logits.astype(np.float64) / params.temperature
    if 0 < params.top_k < scaled.shape[0]:
        kth = np.partition(scaled, -params.top_k)[-params.top_k]
        scaled = np.where(scaled < kth, -np.inf, scaled)
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        # Keep the smallest prefix whose mass reaches top_p (the token that crosses it included).
        keep = order[: int(np.searchsorted(cumulative, params.top_p) + 1)]
        mask = np.zeros_like(probs, dtype=bool)
        mask[keep] = True
        probs = np.where(mask, probs, 0.0)
        probs /= probs.sum()
    return probs


def sample(logits: np.ndarray, params: list[SamplingParams], generators: list[np.random.Generator]) -> np.ndarray:
    """[num_seqs, vocab] logits -> token ids [num_seqs]."""
    tokens = np.empty(len(params), dtype=np.int64)
    for i, (p, rng) in enumerate(zip(params, generators)):
        if p.is_greedy:
            tokens[i] = int(np.argmax(logits[i]))
        else:
            probs = filtered_probs(logits[i], p)
            tokens[i] = int(rng.choice(probs.shape[0], p=probs))
    return tokens

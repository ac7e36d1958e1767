"""Attention over a paged KV cache in numpy: new keys and values go into their cache slots, and each
sequence's queries read its own blocks through its block table."""
from __future__ import annotations

import numpy as np


def write_kv_cache(k_cache: np.ndarray, v_cache: np.ndarray, k: np.ndarray, v: np.ndarray,
                   slot_mapping: np.ndarray) -> None:
    """k_cache, v_cache: [num_blocks, block_size, n_head, head_dim] (one layer); k, v: [num_tokens,
    n_head, head_dim]; slot_mapping: [num_tokens], slot = block * block_size + offset."""
    num_blocks, block_size = k_cache.shape[:2]
    assert k_cache.flags.c_contiguous and v_cache.flags.c_contiguous  # else reshape copies, writes vanish
    # A reshape of the contiguous per-layer cache is a view, so the assignment lands in the cache.
    k_cache.reshape(num_blocks * block_size, *k_cache.shape[2:])[slot_mapping] = k
    v_cache.reshape(num_blocks * block_size, *v_cache.shape[2:])[slot_mapping] = v


def _gather(cache: np.ndarray, blocks: np.ndarray, context_len: int) -> np.ndarray:
    """[context_len, n_head, head_dim]: a sequence's cached tokens in position order (a copy)."""
    gathered = cache[blocks]  # [num_blocks, block_size, n_head, head_dim]
    return gathered.reshape(-1, *cache.shape[2:])[:context_len]


def _softmax_inplace(scores: np.ndarray) -> np.ndarray:
    # float32 throughout; subtracting the row max keeps exp() from overflowing.
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


def attend_one_query(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """A decode token: q [n_head, head_dim] against every cached key k, v [context_len, n_head, head_dim].
    einsum beats matmul here (measured): the [head_dim, context_len] operand is strided."""
    probs = _softmax_inplace(np.einsum("hd,chd->hc", q, k))  # [n_head, context_len]
    return np.einsum("hc,chd->hd", probs, v)


def attend_queries(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """A prefill chunk, causal: q [num_new, n_head, head_dim] for the last num_new of the context_len
    positions, so the query at position p sees keys at positions <= p. Returns q's shape."""
    num_new, context_len = q.shape[0], k.shape[0]
    scores = np.matmul(q.transpose(1, 0, 2), k.transpose(1, 2, 0))  # [n_head, num_new, context_len]
    query_pos = np.arange(context_len - num_new, context_len)
    future = np.arange(context_len)[None, :] > query_pos[:, None]  # [num_new, context_len]
    scores[:, future] = -np.inf  # every row keeps its own position, so no row is all -inf
    probs = _softmax_inplace(scores)
    return np.matmul(probs, v.transpose(1, 0, 2)).transpose(1, 0, 2)  # [num_new, n_head, head_dim]


def paged_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, query_lens, context_lens,
                    blocks_per_seq) -> np.ndarray:
    """q: [num_tokens, n_head, head_dim], the packed queries of all sequences, already scaled by
    1/sqrt(head_dim); the caches (one layer) already hold this step's keys and values;
    blocks_per_seq[i]: int array of the blocks that hold sequence i's context_lens[i] tokens.
    Returns [num_tokens, n_head, head_dim].

    One sequence at a time on purpose: gathering every sequence's blocks into one padded array and
    attending in one call measured 2-3x slower (padding, and 20 MB temporaries that leave the CPU
    cache), while per-sequence gathers of a few hundred KB stay in it."""
    out = np.empty_like(q)
    start = 0
    for query_len, context_len, blocks in zip(query_lens, context_lens, blocks_per_seq):
        k = _gather(k_cache, blocks, context_len)  # [context_len, n_head, head_dim]
        v = _gather(v_cache, blocks, context_len)
        if query_len == 1:
            out[start] = attend_one_query(q[start], k, v)
        else:
            out[start:start + query_len] = attend_queries(q[start:start + query_len], k, v)
        start += query_len
    return out

"""Attention over a paged KV cache: new keys and values go into their cache slots, and each sequence's
queries read its own blocks through its block table.

Decode rows (one new token per sequence, most rows of most steps) go through one compiled kernel that
reads keys and values in place from their blocks, split across the CPU's cores by context length.
Prefill chunks gather their blocks and attend with BLAS matmuls, which beat a loop at many queries."""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache

import numba
import numpy as np

from .cpu import available_cores

# Below this many cached tokens across a step's decode rows, one thread is faster than handing work
# to the others (measured: 4 rows of 100 tokens take 0.14 ms alone, 0.7 ms split in two).
_SPLIT_MIN_TOKENS = 2048
# Reassociation lets LLVM vectorise the head_dim dot products. No "nnan"/"ninf": with them LLVM may
# assume no NaN or infinity ever occurs and drop the comparisons that would show one.
_FASTMATH = {"reassoc", "contract", "arcp", "nsz"}
# The compiled kernel is not cached on disk: numba's cache is keyed by source file, but what it stores
# names the importing module, and this package is imported as `engine` by the backend and the scripts
# and as `backends.continuous_decoding.engine` by the tests; a cache written under one name fails to
# load under the other. The runner compiles it once at model load instead (about 2 s).


def write_kv_cache(k_cache: np.ndarray, v_cache: np.ndarray, k: np.ndarray, v: np.ndarray,
                   slot_mapping: np.ndarray) -> None:
    """k_cache, v_cache: [num_blocks, block_size, n_head, head_dim] (one layer); k, v: [num_tokens,
    n_head, head_dim]; slot_mapping: [num_tokens], slot = block * block_size + offset."""
    num_blocks, block_size = k_cache.shape[:2]
    assert k_cache.flags.c_contiguous and v_cache.flags.c_contiguous  # else reshape copies, writes vanish
    # A reshape of the contiguous per-layer cache is a view, so the assignment lands in the cache.
    k_cache.reshape(num_blocks * block_size, *k_cache.shape[2:])[slot_mapping] = k
    v_cache.reshape(num_blocks * block_size, *v_cache.shape[2:])[slot_mapping] = v


@numba.njit(nogil=True, fastmath=_FASTMATH)
def _decode_rows(q, rows, k_cache, v_cache, block_tables, context_lens, out, first, last):
    """Decode rows first..last-1: row i is q[rows[i]], [n_head, head_dim], a sequence's only new token,
    attending to its context_lens[i] cached tokens in the blocks block_tables[i]. Reads each cached
    token's keys and values once, in place, as one contiguous [n_head * head_dim] row."""
    n_head, head_dim = q.shape[1], q.shape[2]
    block_size = k_cache.shape[1]
    for i in range(first, last):
        row, n = rows[i], context_lens[i]
        scores = np.empty((n_head, n), np.float32)
        for p in range(n):
            block, offset = block_tables[i, p // block_size], p % block_size
            for h in range(n_head):
                acc = np.float32(0.0)
                for d in range(head_dim):
                    acc += q[row, h, d] * k_cache[block, offset, h, d]
                scores[h, p] = acc
        for h in range(n_head):  # softmax per head, float32, shifted by the row max
            top = scores[h, 0]
            for p in range(1, n):
                top = max(top, scores[h, p])
            total = np.float32(0.0)
            for p in range(n):
                e = np.float32(math.exp(scores[h, p] - top))
                scores[h, p] = e
                total += e
            for p in range(n):
                scores[h, p] /= total
        out[row] = 0.0
        for p in range(n):
            block, offset = block_tables[i, p // block_size], p % block_size
            for h in range(n_head):
                weight = scores[h, p]
                for d in range(head_dim):
                    out[row, h, d] += weight * v_cache[block, offset, h, d]


@cache
def _workers() -> tuple[int, ThreadPoolExecutor | None]:
    """The cores this process may use, and a pool for all but the calling thread's share."""
    cores = available_cores()
    return cores, ThreadPoolExecutor(cores - 1, thread_name_prefix="attention") if cores > 1 else None


@dataclass(frozen=True)
class AttentionLayout:
    """How one step's packed rows split into decode rows and prefill chunks: built once per step,
    read by every layer."""

    decode_rows: np.ndarray  # [num_decodes] int64: packed row of each decoding sequence
    decode_tables: np.ndarray  # [num_decodes, max_blocks] int32, padded with 0 past each table
    decode_context_lens: np.ndarray  # [num_decodes] int32
    decode_splits: tuple[int, ...]  # boundaries of the per-thread ranges of decode rows, 0 .. num_decodes
    prefills: tuple[tuple[int, int, int, np.ndarray], ...]  # (first row, query_len, context_len, blocks)

    @classmethod
    def build(cls, query_lens, context_lens, block_tables, block_size: int) -> AttentionLayout:
        decode, prefills, start = [], [], 0
        for query_len, context_len, table in zip(query_lens, context_lens, block_tables):
            blocks = table[: -(-context_len // block_size)]
            if query_len == 1:
                decode.append((start, context_len, blocks))
            else:
                prefills.append((start, query_len, context_len, np.asarray(blocks, dtype=np.intp)))
            start += query_len
        width = max((len(blocks) for _, _, blocks in decode), default=0)
        tables = np.zeros((len(decode), width), dtype=np.int32)
        for i, (_, _, blocks) in enumerate(decode):
            tables[i, : len(blocks)] = blocks
        lens = np.array([n for _, n, _ in decode], dtype=np.int32)
        return cls(decode_rows=np.array([row for row, _, _ in decode], dtype=np.int64), decode_tables=tables,
                   decode_context_lens=lens, decode_splits=balanced_splits(lens, _workers()[0]),
                   prefills=tuple(prefills))


def balanced_splits(context_lens: np.ndarray, cores: int) -> tuple[int, ...]:
    """Contiguous ranges of decode rows with about equal cached tokens, one per core; one range when
    the work is too small to be worth the hand-off."""
    total = int(context_lens.sum())
    if cores == 1 or total < _SPLIT_MIN_TOKENS:
        return (0, len(context_lens))
    midpoints = np.cumsum(context_lens) - context_lens / 2  # each row goes where most of its tokens fall
    inner = np.searchsorted(midpoints, [total * k / cores for k in range(1, cores)])
    return (0, *sorted({int(b) for b in inner}), len(context_lens))


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


def paged_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                    layout: AttentionLayout) -> np.ndarray:
    """q: [num_tokens, n_head, head_dim], the packed queries of all sequences, already scaled by
    1/sqrt(head_dim), C-contiguous float32; the caches (one layer) already hold this step's keys and
    values. Returns [num_tokens, n_head, head_dim]."""
    out = np.empty_like(q)
    splits = layout.decode_splits
    if len(layout.decode_rows):
        args = (q, layout.decode_rows, k_cache, v_cache, layout.decode_tables, layout.decode_context_lens, out)
        _, pool = _workers()
        ranges = list(zip(splits[:-1], splits[1:]))
        # Every range but the first to the pool; the first on this thread, while they run. Without a
        # pool (one core), all of them on this thread.
        mine, theirs = (ranges, []) if pool is None else (ranges[:1], ranges[1:])
        others = [pool.submit(_decode_rows, *args, first, last) for first, last in theirs]
        for first, last in mine:
            _decode_rows(*args, first, last)
        for done in others:
            done.result()
    for start, query_len, context_len, blocks in layout.prefills:
        k = _gather(k_cache, blocks, context_len)  # [context_len, n_head, head_dim]
        v = _gather(v_cache, blocks, context_len)
        out[start:start + query_len] = attend_queries(q[start:start + query_len], k, v)
    return out

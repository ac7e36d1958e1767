"""Paged attention against dense float64 attention over each sequence's contiguous keys and values:
decode rows through the compiled kernel (one thread and split across threads), prefill chunks through
the gather path, mixed in one packed batch over shuffled blocks.

Tolerance: float32 sums in another order than the float64 reference; with unit-variance keys and
queries scaled by 1/sqrt(head_dim) the measured max |diff| is about 3e-7. ATOL leaves a wide margin,
while reading a wrong block, an off-by-one position or a missing causal mask moves outputs by 1e-2 or
more (each output is a weighted mean of unit-variance values over a few hundred positions at most)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.continuous_decoding.engine.cpu import cpu_quota
from backends.continuous_decoding.engine.paged_attention import (
    AttentionLayout,
    balanced_splits,
    paged_attention,
    write_kv_cache,
)

N_HEAD, HEAD_DIM, BLOCK_SIZE = 4, 16, 4
ATOL = 1e-5


def dense_reference(q, k, v):
    """q [num_new, H, D] for the last num_new of k's positions; causal; float64."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    num_new, context_len = q.shape[0], k.shape[0]
    scores = np.einsum("qhd,khd->hqk", q, k)
    visible = np.arange(context_len)[None, :] <= np.arange(context_len - num_new, context_len)[:, None]
    scores = np.where(visible[None], scores, -np.inf)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", probs, v)


def run_packed(seqs, rng, splits_cores=None, cut_points=None):
    """seqs: (query_len, context_len) per sequence. Writes every sequence's keys and values into
    shuffled blocks, attends once through the paged path, and returns (paged, reference) outputs."""
    tables, next_block = [], 0
    blocks_needed = [-(-context // BLOCK_SIZE) for _, context in seqs]
    num_blocks = sum(blocks_needed) + 3
    order = rng.permutation(num_blocks)
    for n in blocks_needed:
        tables.append(tuple(int(b) for b in order[next_block:next_block + n]))
        next_block += n
    k_cache = rng.standard_normal((num_blocks, BLOCK_SIZE, N_HEAD, HEAD_DIM), dtype=np.float32)  # stale data
    v_cache = rng.standard_normal((num_blocks, BLOCK_SIZE, N_HEAD, HEAD_DIM), dtype=np.float32)
    qs, expected = [], []
    for (query_len, context_len), table in zip(seqs, tables):
        k = rng.standard_normal((context_len, N_HEAD, HEAD_DIM), dtype=np.float32)
        v = rng.standard_normal((context_len, N_HEAD, HEAD_DIM), dtype=np.float32)
        positions = np.arange(context_len)
        slots = np.asarray(table)[positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE
        write_kv_cache(k_cache, v_cache, k, v, slots)
        q = rng.standard_normal((query_len, N_HEAD, HEAD_DIM), dtype=np.float32) / np.sqrt(HEAD_DIM)
        qs.append(q)
        expected.append(dense_reference(q, k, v))
    layout = AttentionLayout.build([s[0] for s in seqs], [s[1] for s in seqs], tables, BLOCK_SIZE)
    num_decodes = len(layout.decode_rows)
    if splits_cores is not None:
        splits = balanced_splits(layout.decode_context_lens, splits_cores)
    elif cut_points is not None:  # any ranges at all, as the threads would take them
        splits = (0, *sorted({min(c, num_decodes) for c in cut_points}), num_decodes)
    else:
        splits = layout.decode_splits
    layout = AttentionLayout(layout.decode_rows, layout.decode_tables, layout.decode_context_lens, splits,
                             layout.prefills)
    q = np.ascontiguousarray(np.concatenate(qs))
    return paged_attention(q, k_cache, v_cache, layout), np.concatenate(expected)


@pytest.mark.parametrize("cores", [1, 2, 3])
def test_mixed_decodes_and_prefill_chunks_match_dense_attention(cores):
    rng = np.random.default_rng(0)
    # decodes at block boundaries and inside blocks, a one-token context, prefill chunks that start
    # mid-sequence (chunked prefill) and at its start; many long decodes so that the splits are used
    seqs = [(1, 1), (1, 4), (1, 5), (7, 7), (1, 600), (3, 10), (1, 16), (1, 17), (5, 40)] + [(1, 700)] * 6
    paged, expected = run_packed(seqs, rng, splits_cores=cores)
    np.testing.assert_allclose(paged, expected, rtol=0, atol=ATOL)


@settings(max_examples=30, deadline=None)
@given(seqs=st.lists(st.tuples(st.integers(1, 9), st.integers(0, 80)), min_size=1, max_size=12),
       cut_points=st.lists(st.integers(0, 12), max_size=3), seed=st.integers(0, 2**31))
def test_any_ragged_batch_split_anywhere_matches_dense_attention(seqs, cut_points, seed):
    seqs = [(query_len, query_len + earlier) for query_len, earlier in seqs]  # context >= new tokens
    paged, expected = run_packed(seqs, np.random.default_rng(seed), cut_points=cut_points)
    np.testing.assert_allclose(paged, expected, rtol=0, atol=ATOL)


def test_splits_balance_cached_tokens_and_cover_every_row():
    lens = np.array([3000, 10, 10, 10, 3000, 3000, 10, 3000], dtype=np.int32)
    splits = balanced_splits(lens, 2)
    assert splits[0] == 0 and splits[-1] == len(lens) and list(splits) == sorted(splits)
    halves = [int(lens[a:b].sum()) for a, b in zip(splits, splits[1:])]
    assert len(halves) == 2 and max(halves) <= sum(halves) / 2 + lens.max() / 2  # off by half a row at most
    assert balanced_splits(np.array([100] * 4, dtype=np.int32), 2) == (0, 4)  # too little work to split
    assert balanced_splits(lens, 1) == (0, len(lens))


def test_cpu_quota_reads_cgroup_v2_and_v1(tmp_path):
    v2 = tmp_path / "cpu.max"
    v2.write_text("150000 100000\n")
    assert cpu_quota(v2, tmp_path) == 1.5
    v2.write_text("max 100000\n")
    assert cpu_quota(v2, tmp_path) is None
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("200000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota(tmp_path / "absent", v1) == 2.0
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_quota(tmp_path / "absent", v1) is None

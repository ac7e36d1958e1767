"""The packed, ragged batch of one engine step, as the runner consumes it: the new tokens of every
scheduled sequence back to back, with no padding."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BatchInput:
    token_ids: np.ndarray  # [num_tokens] int64: each sequence's new tokens, sequences back to back
    positions: np.ndarray  # [num_tokens] int64: position of each token in its sequence
    slot_mapping: np.ndarray  # [num_tokens] int64: cache slot (block * block_size + offset) of each token
    query_lens: tuple[int, ...]  # new tokens per sequence; they sum to num_tokens
    context_lens: tuple[int, ...]  # tokens in the cache per sequence after this step (old + new)
    block_tables: tuple[tuple[int, ...], ...]  # per sequence: its cache blocks in token order

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])


def build_batch(scheduled: list[tuple[list[int], int, int, list[int]]], block_size: int) -> BatchInput:
    """scheduled: per sequence (all token ids, num_computed_tokens, num_new_tokens, block_table).
    The new tokens are token_ids[num_computed : num_computed + num_new]."""
    tokens, positions, slots, query_lens, context_lens, tables = [], [], [], [], [], []
    for token_ids, num_computed, num_new, block_table in scheduled:
        pos = np.arange(num_computed, num_computed + num_new, dtype=np.int64)
        tokens.append(np.asarray(token_ids[num_computed : num_computed + num_new], dtype=np.int64))
        positions.append(pos)
        blocks = np.asarray(block_table, dtype=np.int64)
        slots.append(blocks[pos // block_size] * block_size + pos % block_size)
        query_lens.append(num_new)
        context_lens.append(num_computed + num_new)
        tables.append(tuple(block_table))
    empty = np.zeros(0, dtype=np.int64)
    return BatchInput(
        token_ids=np.concatenate(tokens) if tokens else empty,
        positions=np.concatenate(positions) if positions else empty,
        slot_mapping=np.concatenate(slots) if slots else empty,
        query_lens=tuple(query_lens),
        context_lens=tuple(context_lens),
        block_tables=tuple(tables),
    )

"""The model runner: one GPT-2 forward pass over a packed ragged batch, reading and writing the paged
KV cache, on the CPU: the dense layers through ONNX Runtime (dense_layers.py), attention over the
paged cache in a compiled kernel (paged_attention.py). A GPU runner implements the same interface."""
from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import numpy as np

from .batch import BatchInput, build_batch
from .dense_layers import DenseLayers
from .paged_attention import AttentionLayout, paged_attention, write_kv_cache
from .weights import ModelConfig, ModelWeights


@runtime_checkable
class ModelRunner(Protocol):
    """What the engine needs from a runner. It owns the KV cache memory but not the blocks: the block
    manager hands them out, and a freed block's stale contents are overwritten by its next owner."""

    config: ModelConfig
    num_blocks: int
    block_size: int

    @property
    def kv_cache_bytes(self) -> int: ...

    def execute(self, batch: BatchInput) -> np.ndarray:
        """Logits [num_seqs, vocab_size] float32 of the last new token of each sequence."""
        ...


def kv_cache_bytes_per_block(config: ModelConfig, block_size: int, itemsize: int = 4) -> int:
    """Keys and values of block_size tokens in every layer: what one block costs, to size num_blocks."""
    return 2 * config.n_layer * block_size * config.n_embd * itemsize


class CpuRunner:
    """Owned by the engine thread: execute() mutates the KV cache."""

    def __init__(self, weights: ModelWeights, num_blocks: int, block_size: int):
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks: must be a positive integer, got {num_blocks!r}")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size: must be a positive integer, got {block_size!r}")
        # The embeddings stay here; every other weight lives (packed) in the dense layers' sessions,
        # so the caller's ModelWeights can be freed.
        self.wte, self.wpe = weights.wte, weights.wpe
        self.config = weights.config
        self.num_blocks = num_blocks
        self.block_size = block_size
        c = self.config
        shape = (c.n_layer, num_blocks, block_size, c.n_head, c.head_dim)
        self.k_cache = np.zeros(shape, dtype=np.float32)
        self.v_cache = np.zeros(shape, dtype=np.float32)
        self.dense = DenseLayers(weights)
        # The decode attention kernel compiles on first use, about 2 s: pay it here, at model load,
        # not in the first request's step. Block 0's first slot gets stale data, which its first
        # owner overwrites, as after any freed block.
        self.execute(build_batch([([0], 0, 1, [0])], block_size))

    @property
    def kv_cache_bytes(self) -> int:
        return self.k_cache.nbytes + self.v_cache.nbytes

    def execute(self, batch: BatchInput) -> np.ndarray:
        c = self.config
        if batch.num_seqs == 0:
            return np.zeros((0, c.vocab_size), dtype=np.float32)
        self._check(batch)
        self._check_block_tables(batch)
        num_tokens, n_embd = batch.num_tokens, c.n_embd
        last_rows = np.cumsum(batch.query_lens) - 1  # [num_seqs]: each sequence's last new token
        x = self.wte[batch.token_ids] + self.wpe[batch.positions]  # [num_tokens, n_embd] residual stream
        scale = np.float32(1.0 / math.sqrt(c.head_dim))
        layout = AttentionLayout.build(batch.query_lens, batch.context_lens, batch.block_tables, self.block_size)
        # The last layer attends with each sequence's last query alone (see below).
        last_layout = AttentionLayout.build((1,) * batch.num_seqs, batch.context_lens, batch.block_tables,
                                            self.block_size)
        qkv = self.dense.first_qkv(x)  # [num_tokens, 3 * n_embd]
        for i in range(c.n_layer):
            q, k, v = (qkv[:, j * n_embd:(j + 1) * n_embd].reshape(-1, c.n_head, c.head_dim) for j in range(3))
            write_kv_cache(self.k_cache[i], self.v_cache[i], k, v, batch.slot_mapping)
            if i < c.n_layer - 1:
                attn = paged_attention(q * scale, self.k_cache[i], self.v_cache[i], layout)
                x, qkv = self.dense.next_layer(i, x, attn.reshape(num_tokens, n_embd))
        # Only the last token of each sequence reaches the LM head, so in the last layer the other rows
        # are dead: attend with the last queries alone (they see the whole context).
        attn = paged_attention(q[last_rows] * scale, self.k_cache[-1], self.v_cache[-1], last_layout)
        return self.dense.logits(x[last_rows], attn.reshape(batch.num_seqs, n_embd))  # [num_seqs, vocab_size]

    def _check(self, batch: BatchInput) -> None:
        """The scheduler should never build these; a clear error beats numpy wrapping a negative index
        or writing another sequence's cache slot."""
        c = self.config
        if sum(batch.query_lens) != batch.num_tokens or min(batch.query_lens) < 1:
            raise ValueError(f"query_lens {batch.query_lens} do not split {batch.num_tokens} tokens")
        if any(context < new for new, context in zip(batch.query_lens, batch.context_lens)):
            raise ValueError(f"context_lens {batch.context_lens} must include each sequence's new tokens "
                             f"{batch.query_lens}")
        bounds = (("positions", batch.positions, "n_positions", c.n_positions),
                  ("token_ids", batch.token_ids, "vocab_size", c.vocab_size),
                  ("slot_mapping", batch.slot_mapping, "num_slots", self.num_blocks * self.block_size))
        for name, values, limit_name, limit in bounds:
            if int(values.min()) < 0 or int(values.max()) >= limit:
                raise ValueError(f"{name} must lie in [0, {limit_name}={limit}), "
                                 f"got [{values.min()}, {values.max()}]")

    def _check_block_tables(self, batch: BatchInput) -> None:
        """Each sequence's table must hold its context_len tokens in blocks that exist: the attention
        kernel reads the cache through them unchecked."""
        for context_len, table in zip(batch.context_lens, batch.block_tables):
            num_blocks = -(-context_len // self.block_size)
            blocks = table[:num_blocks]
            if len(blocks) < num_blocks or min(blocks) < 0 or max(blocks) >= self.num_blocks:
                raise ValueError(f"block table {table} cannot hold {context_len} tokens in blocks "
                                 f"[0, {self.num_blocks})")

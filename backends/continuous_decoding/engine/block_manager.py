"""The paged KV cache's bookkeeping: which fixed-size block belongs to which sequence. It holds no
arrays; the runner's cache is indexed by the block ids handed out here. No prefix caching."""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from .sequence import Sequence


class BlockManager:
    """Owned by the engine thread, through its scheduler."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        # Mirrors _free so that a double free is caught at once rather than as a shared block later.
        self._is_free = [True] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0.0 to 1.0."""
        return self.num_used_blocks / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold num_tokens tokens."""
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        """Blocks seq still lacks to hold its computed tokens plus num_new_tokens more."""
        needed = self.blocks_for(seq.num_computed_tokens + num_new_tokens)
        return max(0, needed - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.num_new_blocks(seq, num_new_tokens) <= len(self._free)

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Appends blocks to seq.block_table so that it covers num_computed_tokens + num_new_tokens."""
        count = self.num_new_blocks(seq, num_new_tokens)
        if count > len(self._free):
            raise RuntimeError(f"sequence {seq.seq_id} needs {count} blocks, {len(self._free)} are free; "
                               "the scheduler must check can_allocate first")
        for _ in range(count):
            block = self._free.popleft()
            self._is_free[block] = False
            seq.block_table.append(block)

    def free(self, seq: Sequence) -> None:
        """Returns all of seq's blocks; its cached tokens are gone, so nothing counts as computed."""
        for block in seq.block_table:
            if self._is_free[block]:
                raise RuntimeError(f"block {block} of sequence {seq.seq_id} is already free")
            self._is_free[block] = True
            self._free.append(block)
        seq.block_table.clear()
        seq.num_computed_tokens = 0

    def check_invariants(self, live_seqs: Iterable[Sequence]) -> None:
        """For tests: every block is free or owned by exactly one live sequence, none twice."""
        owner: dict[int, int] = {}
        for seq in live_seqs:
            for block in seq.block_table:
                if block in owner:
                    raise AssertionError(f"block {block} held by sequences {owner[block]} and {seq.seq_id}")
                if self._is_free[block]:
                    raise AssertionError(f"block {block} of sequence {seq.seq_id} is on the free list")
                owner[block] = seq.seq_id
            if len(seq.block_table) < self.blocks_for(seq.num_computed_tokens):
                raise AssertionError(f"sequence {seq.seq_id} has computed tokens outside its blocks")
        if len(set(self._free)) != len(self._free):
            raise AssertionError("a block is on the free list twice")
        if len(owner) + len(self._free) != self.num_blocks:
            raise AssertionError(f"{self.num_blocks - len(owner) - len(self._free)} blocks are neither "
                                 "free nor owned by a live sequence (leaked)")

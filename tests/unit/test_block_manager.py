"""The KV-cache block manager: blocks cover exactly the tokens asked for, frees return everything,
and no block is ever owned twice, checked rule by rule and under random allocate/free sequences."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.continuous_decoding.engine.block_manager import BlockManager
from backends.continuous_decoding.engine.sampling_params import SamplingParams
from backends.continuous_decoding.engine.sequence import Sequence


def make_seq(seq_id: int, num_prompt_tokens: int = 1) -> Sequence:
    return Sequence(seq_id, list(range(num_prompt_tokens)), SamplingParams())


def test_a_fresh_manager_has_every_block_free():
    bm = BlockManager(num_blocks=5, block_size=4)
    assert (bm.num_free_blocks, bm.num_used_blocks, bm.usage) == (5, 0, 0.0)
    bm.check_invariants([])


@pytest.mark.parametrize("num_blocks, block_size", [(0, 4), (4, 0), (-1, 16)])
def test_sizes_must_be_positive(num_blocks, block_size):
    with pytest.raises(ValueError, match="num_blocks and block_size"):
        BlockManager(num_blocks, block_size)


@pytest.mark.parametrize("num_tokens, num_blocks", [(1, 1), (4, 1), (5, 2), (8, 2), (9, 3)])
def test_allocate_covers_the_tokens_with_as_few_blocks_as_possible(num_tokens, num_blocks):
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq(0)
    bm.allocate(seq, num_tokens)
    assert len(seq.block_table) == num_blocks
    assert bm.num_used_blocks == num_blocks
    assert len(set(seq.block_table)) == num_blocks


def test_allocate_adds_only_what_the_computed_tokens_do_not_already_cover():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq(0)
    bm.allocate(seq, 3)
    first = list(seq.block_table)
    seq.num_computed_tokens = 3
    bm.allocate(seq, 1)  # token 4 still fits the first block
    assert seq.block_table == first
    seq.num_computed_tokens = 4
    bm.allocate(seq, 1)  # token 5 opens a second block, and the first stays where it was
    assert seq.block_table[:1] == first and len(seq.block_table) == 2


def test_can_allocate_is_exact_at_the_boundary():
    bm = BlockManager(num_blocks=3, block_size=4)
    seq = make_seq(0)
    assert bm.can_allocate(seq, 12)
    assert not bm.can_allocate(seq, 13)
    other = make_seq(1)
    bm.allocate(other, 5)  # two blocks
    assert bm.can_allocate(seq, 4) and not bm.can_allocate(seq, 5)


def test_allocate_without_room_raises_instead_of_handing_out_a_block_twice():
    bm = BlockManager(num_blocks=2, block_size=4)
    with pytest.raises(RuntimeError, match="needs 3 blocks, 2 are free"):
        bm.allocate(make_seq(0), 9)
    assert bm.num_free_blocks == 2


def test_free_returns_the_blocks_and_forgets_the_computed_tokens():
    bm = BlockManager(num_blocks=4, block_size=2)
    seq = make_seq(0, 5)
    bm.allocate(seq, 5)
    seq.num_computed_tokens = 5
    assert bm.usage == 0.75
    bm.free(seq)
    assert seq.block_table == [] and seq.num_computed_tokens == 0
    assert bm.num_free_blocks == 4
    bm.check_invariants([seq])


def test_freeing_a_block_twice_is_caught():
    bm = BlockManager(num_blocks=4, block_size=2)
    seq = make_seq(0)
    bm.allocate(seq, 3)
    stale = list(seq.block_table)
    bm.free(seq)
    seq.block_table.extend(stale)
    with pytest.raises(RuntimeError, match="already free"):
        bm.free(seq)


def test_check_invariants_catches_a_shared_block_and_a_leak():
    bm = BlockManager(num_blocks=4, block_size=2)
    a, b = make_seq(0), make_seq(1)
    bm.allocate(a, 2)
    b.block_table.append(a.block_table[0])
    with pytest.raises(AssertionError, match="held by sequences 0 and 1"):
        bm.check_invariants([a, b])
    with pytest.raises(AssertionError, match="leaked"):
        bm.check_invariants([])


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), st.integers(1, 5),
       st.lists(st.tuples(st.sampled_from(["grow", "free"]), st.integers(0, 5), st.integers(1, 9)), max_size=60))
def test_random_allocations_and_frees_never_share_or_lose_a_block(num_blocks, block_size, ops):
    bm = BlockManager(num_blocks, block_size)
    seqs = [make_seq(i) for i in range(6)]
    for op, index, num_new in ops:
        seq = seqs[index]
        if op == "free":
            bm.free(seq)
        else:
            fits = bm.can_allocate(seq, num_new)
            assert fits == (bm.blocks_for(seq.num_computed_tokens + num_new) - len(seq.block_table)
                            <= bm.num_free_blocks)
            if fits:
                bm.allocate(seq, num_new)
                seq.num_computed_tokens += num_new
                assert len(seq.block_table) == -(-seq.num_computed_tokens // block_size)
        bm.check_invariants(seqs)
        assert bm.num_used_blocks == sum(len(s.block_table) for s in seqs)
    for seq in seqs:
        bm.free(seq)
    assert bm.num_free_blocks == num_blocks
    bm.check_invariants(seqs)

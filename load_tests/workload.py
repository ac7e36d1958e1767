"""Seeded workload files: the texts (embeddings) and prompts (generation) that the Locust users send,
with lengths drawn from a chosen distribution, so that a load test can be repeated request for request.

Texts are made of whole words of the MiniLM WordPiece vocabulary (each one token), so a record of
`num_tokens` words tokenizes to exactly that many tokens plus [CLS] and [SEP].

    python -m load_tests.workload --kind embed --num 1000 --seed 0 --lengths lognormal:24,0.6 --out embed.jsonl
    python -m load_tests.workload --kind generate --num 200 --seed 0 --lengths uniform:16,128 \\
        --max-tokens fixed:32 --out generate.jsonl

A file is JSON lines: one header object {"workload": {...how it was made...}}, then one record per line.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

KINDS = ("embed", "generate")
MAX_EMBED_TOKENS = 254  # `embed` takes 256 tokens, [CLS] and [SEP] included
MAX_PROMPT_TOKENS = 512
DEFAULT_LENGTHS = {"embed": "lognormal:24,0.6", "generate": "uniform:16,64"}
DEFAULT_MAX_TOKENS = "fixed:32"


@dataclass(frozen=True)
class Lengths:
    """A length distribution, written `fixed:N`, `uniform:LOW,HIGH`, `lognormal:MEDIAN,SIGMA` or
    `normal:MEAN,STD`; draws are rounded and clipped to [1, limit]."""

    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, text: str) -> "Lengths":
        kind, _, args = text.partition(":")
        try:
            values = [float(v) for v in args.split(",")] if args else []
        except ValueError:
            raise ValueError(f"length distribution {text!r}: the parameters must be numbers") from None
        arity = {"fixed": 1, "uniform": 2, "lognormal": 2, "normal": 2}
        if kind not in arity:
            raise ValueError(f"length distribution {text!r}: the kind must be one of {sorted(arity)}")
        if len(values) != arity[kind]:
            raise ValueError(f"length distribution {text!r}: {kind} takes {arity[kind]} parameter(s)")
        if values[0] <= 0 or (kind == "uniform" and values[1] < values[0]) or (kind != "fixed" and values[1] < 0):
            raise ValueError(f"length distribution {text!r}: parameters out of range")
        return cls(kind, *values)

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"fixed:{self.a:g}"
        return f"{self.kind}:{self.a:g},{self.b:g}"

    def draw(self, rng: np.random.Generator, size: int, limit: int) -> np.ndarray:
        if self.kind == "fixed":
            values = np.full(size, self.a)
        elif self.kind == "uniform":
            values = rng.integers(int(self.a), int(self.b) + 1, size=size)
        elif self.kind == "lognormal":
            values = self.a * np.exp(self.b * rng.standard_normal(size))
        else:
            values = rng.normal(self.a, self.b, size=size)
        return np.clip(np.rint(values), 1, limit).astype(int)


@dataclass(frozen=True)
class Record:
    text: str
    num_tokens: int  # without [CLS] and [SEP]
    max_tokens: int | None = None  # generation only


@dataclass(frozen=True)
class Workload:
    kind: str
    records: tuple[Record, ...]
    meta: dict

    def save(self, path: Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            f.write(json.dumps({"workload": self.meta}) + "\n")
            for record in self.records:
                f.write(json.dumps({k: v for k, v in asdict(record).items() if v is not None}) + "\n")
        return path


@lru_cache(maxsize=4)
def vocabulary_words(tokenizer_path: Path | None = None) -> tuple[str, ...]:
    """Whole lowercase words of the tokenizer's vocabulary (default: the served `minilm`'s), in id
    order, which is roughly by frequency."""
    from clients.payloads import load_tokenizer

    vocab = (load_tokenizer(tokenizer_path) if tokenizer_path else load_tokenizer()).get_vocab()
    words = (w for w, _ in sorted(vocab.items(), key=lambda kv: kv[1]))
    return tuple(w for w in words if w.isascii() and w.isalpha() and len(w) > 1)


def make_workload(kind: str, num: int, seed: int = 0, lengths: str | None = None,
                  max_tokens: str | None = None, tokenizer_path: Path | None = None) -> Workload:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if num < 1:
        raise ValueError(f"num must be at least 1, got {num}")
    lengths = lengths or DEFAULT_LENGTHS[kind]
    rng = np.random.default_rng(seed)
    words = vocabulary_words(tokenizer_path)
    # Zipf-like word choice over the id order, so that common words are common.
    weights = 1.0 / (np.arange(len(words)) + 10.0)
    weights /= weights.sum()
    limit = MAX_EMBED_TOKENS if kind == "embed" else MAX_PROMPT_TOKENS
    num_tokens = Lengths.parse(lengths).draw(rng, num, limit)
    outputs = [None] * num
    if kind == "generate":
        max_tokens = max_tokens or DEFAULT_MAX_TOKENS
        outputs = [int(m) for m in Lengths.parse(max_tokens).draw(rng, num, 1024 - MAX_PROMPT_TOKENS)]
    records = tuple(
        Record(" ".join(words[i] for i in rng.choice(len(words), size=int(n), p=weights)), int(n), m)
        for n, m in zip(num_tokens, outputs)
    )
    meta = {"kind": kind, "num": num, "seed": seed, "lengths": lengths,
            "max_tokens": max_tokens if kind == "generate" else None}
    return Workload(kind, records, meta)


def load_workload(path: Path) -> Workload:
    lines = Path(path).read_text().splitlines()
    if not lines or "workload" not in json.loads(lines[0]):
        raise ValueError(f"{path}: not a workload file (its first line must be the {{\"workload\": ...}} header)")
    meta = json.loads(lines[0])["workload"]
    records = tuple(Record(**json.loads(line)) for line in lines[1:] if line.strip())
    if not records:
        raise ValueError(f"{path}: the workload has no records")
    return Workload(meta.get("kind", "embed"), records, meta)


class Cursor:
    """Which record a user sends next: `round-robin` through the file, or `random` (seeded)."""

    def __init__(self, num_records: int, order: str = "round-robin", seed: int = 0, stream: int = 0):
        if order not in ("round-robin", "random"):
            raise ValueError(f"workload order must be 'round-robin' or 'random', got {order!r}")
        self._num, self._order = num_records, order
        self._rng = np.random.default_rng([seed, stream])
        self._next = stream % num_records  # processes start at different records

    def next(self) -> int:
        if self._order == "random":
            return int(self._rng.integers(self._num))
        index = self._next
        self._next = (index + 1) % self._num
        return index


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", choices=KINDS, required=True)
    p.add_argument("--num", type=int, required=True, help="number of records")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lengths", help="text/prompt length in tokens (default: embed "
                   f"{DEFAULT_LENGTHS['embed']}, generate {DEFAULT_LENGTHS['generate']})")
    p.add_argument("--max-tokens", help=f"output tokens per generation request (default {DEFAULT_MAX_TOKENS})")
    p.add_argument("--tokenizer", type=Path, help="tokenizer.json whose words to use (default: the served minilm's)")
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    workload = make_workload(args.kind, args.num, args.seed, args.lengths, args.max_tokens, args.tokenizer)
    workload.save(args.out)
    tokens = [r.num_tokens for r in workload.records]
    print(f"wrote {args.out}: {len(tokens)} {args.kind} records, tokens per text min {min(tokens)} "
          f"median {int(np.median(tokens))} max {max(tokens)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where one decode step of the CPU runner spends its time: a cProfile of CpuRunner.execute on
the served weights, every sequence decoding one token over the same context length, and what greedy
sampling of the step's logits adds.

    python scripts/profile_runner.py [--num-seqs 32] [--context 200] [--steps 3]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "backends" / "continuous_decoding"))  # the engine, as the backend loads it

from engine.batch import BatchInput  # noqa: E402
from engine.runner import CpuRunner  # noqa: E402
from engine.sampler import make_generator, sample  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.weights import load_weights  # noqa: E402


def decode_batch(num_seqs: int, context: int, block_size: int) -> tuple[BatchInput, int]:
    """num_seqs sequences of `context` tokens, each on its own blocks, all decoding their last token."""
    per_seq = -(-context // block_size)
    tables = tuple(tuple(range(i * per_seq, (i + 1) * per_seq)) for i in range(num_seqs))
    last = context - 1
    batch = BatchInput(
        token_ids=np.full(num_seqs, 1000, np.int64), positions=np.full(num_seqs, last, np.int64),
        slot_mapping=np.array([t[last // block_size] * block_size + last % block_size for t in tables], np.int64),
        query_lens=(1,) * num_seqs, context_lens=(context,) * num_seqs, block_tables=tables)
    return batch, num_seqs * per_seq


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", type=Path, default=ROOT / "model_repository" / "gpt2" / "1")
    p.add_argument("--num-seqs", type=int, default=32)
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args(argv)
    batch, num_blocks = decode_batch(args.num_seqs, args.context, args.block_size)
    runner = CpuRunner(load_weights(args.weights), num_blocks=num_blocks, block_size=args.block_size)
    # Cached keys and values as a real context leaves them: an untouched cache is the kernel's shared
    # zero page, which stays in the CPU caches and makes attention look several times cheaper.
    rng = np.random.default_rng(0)
    for cache in (runner.k_cache, runner.v_cache):
        cache[...] = rng.standard_normal(cache.shape, dtype=np.float32)
    runner.execute(batch)  # warm-up
    start = time.perf_counter()
    for _ in range(args.steps):
        runner.execute(batch)
    print(f"{args.num_seqs} decodes at {args.context} tokens of context: "
          f"{1e3 * (time.perf_counter() - start) / args.steps:.1f} ms per step")
    logits = runner.execute(batch)
    params = [SamplingParams(max_tokens=1)] * args.num_seqs
    generators = [make_generator(p) for p in params]
    start = time.perf_counter()
    for _ in range(args.steps):
        sample(logits, params, generators)
    print(f"greedy sampling of their logits: {1e3 * (time.perf_counter() - start) / args.steps:.2f} ms per step")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(args.steps):
        runner.execute(batch)
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())

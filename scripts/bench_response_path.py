"""What the served gpt2's responses cost by what they carry, side by side on one server: the decoding
benchmark's burst workload (64 streams) through the checked-in `gpt2`, in alternating runs of

  token ids      the client asks for output_ids alone (the decoding benchmark's served client)
  every output   the client names no outputs, so each response also carries the streamed text,
                 which the model detokenizes token by token

and the medians over repeats. Prints a table and writes bench_results/response_path.json.

    python scripts/bench_response_path.py [--repeats 3] [--num-requests 64]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.bench_decoding import WEIGHTS, make_workload, run_served
from scripts.bench_record import write_record

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "bench_results" / "response_path.json"
VARIANTS = {"token ids": ("output_ids",), "every output": ()}  # () names no outputs: Triton sends all


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    from scripts.serve import EmbeddedServer, options_on_free_ports
    from scripts.variants import load_config, write_repository

    args = parse_args(argv)
    vocab = json.loads((WEIGHTS / "config.json").read_text())["vocab_size"]
    workload = make_workload(args.num_requests, 16, 256, args.seed, vocab)
    tokens_per_s: dict[str, list[float]] = {label: [] for label in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="batchwise-bench-") as tmp:
        repo = write_repository(Path(tmp) / "repo", {"gpt2": load_config("gpt2")})
        with EmbeddedServer(options_on_free_ports(repo)) as server:
            for repeat in range(args.repeats):
                for label, outputs in VARIANTS.items():
                    result = run_served("gpt2", workload, server, outputs=outputs)
                    tokens_per_s[label].append(result.summary["output_tokens_per_s"])
                    print(f"  run {repeat + 1}/{args.repeats}  {label:14s} {tokens_per_s[label][-1]:7.1f} output tok/s",
                          flush=True)
    medians = {label: statistics.median(values) for label, values in tokens_per_s.items()}
    ratio = medians["token ids"] / medians["every output"]
    print(f"\n{'outputs':14s} {'median tok/s':>12s}  runs")
    for label, value in medians.items():
        print(f"{label:14s} {value:12.1f}  {', '.join(f'{v:.1f}' for v in tokens_per_s[label])}")
    print(f"token ids / every output: {ratio:.3f}")
    write_record(args.out, "response_path", args, workload=workload.describe(), runs=tokens_per_s,
                 medians=medians, token_ids_over_every_output=ratio)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the served gpt2's response path costs, side by side on one server: the decoding benchmark's
burst workload (64 streams) through the checked-in `gpt2` and through variants that differ in one
response setting, in alternating runs, medians over repeats:

  gpt2                    as checked in: sink_threads 8, the client asks for output_ids alone
  gpt2, one sink thread   the same model served with sink_threads 1 (responses sent one by one)
  gpt2, every output      the checked-in model; the client names no outputs, so each response also
                          carries the streamed text, which the model detokenizes token by token

Prints a table and writes bench_results/response_path.json.

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
ONE_SINK_THREAD = "gpt2_one_sink_thread"
# (label, served model, outputs the client asks for; () = every output)
VARIANTS = (("gpt2", "gpt2", ("output_ids",)),
            ("gpt2, one sink thread", ONE_SINK_THREAD, ("output_ids",)),
            ("gpt2, every output", "gpt2", ()))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(argv)


def one_sink_thread(config):
    """The same model with sink_threads 1."""
    config.parameters["sink_threads"].string_value = "1"
    return config


def main(argv=None) -> int:
    from scripts.serve import EmbeddedServer, options_on_free_ports
    from scripts.variants import load_config, write_repository

    args = parse_args(argv)
    vocab = json.loads((WEIGHTS / "config.json").read_text())["vocab_size"]
    workload = make_workload(args.num_requests, 16, 256, args.seed, vocab)
    tokens_per_s: dict[str, list[float]] = {label: [] for label, _, _ in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="batchwise-bench-") as tmp:
        repo = write_repository(Path(tmp) / "repo", {"gpt2": load_config("gpt2"),
                                                     ONE_SINK_THREAD: one_sink_thread(load_config("gpt2"))})
        with EmbeddedServer(options_on_free_ports(repo)) as server:
            for repeat in range(args.repeats):
                for label, model, outputs in VARIANTS:
                    result = run_served(model, workload, server, outputs=outputs, spec_model="gpt2")
                    tokens_per_s[label].append(result.summary["output_tokens_per_s"])
                    print(f"  run {repeat + 1}/{args.repeats}  {label:24s} "
                          f"{tokens_per_s[label][-1]:7.1f} output tok/s", flush=True)
    medians = {label: statistics.median(values) for label, values in tokens_per_s.items()}
    base = medians["gpt2"]
    print(f"\n{'variant':24s} {'median tok/s':>12s} {'gpt2 / variant':>15s}")
    for label, value in medians.items():
        print(f"{label:24s} {value:12.1f} {base / value:15.3f}")
    write_record(args.out, "response_path", args, workload=workload.describe(), runs=tokens_per_s,
                 medians=medians, gpt2_over_variant={label: base / value for label, value in medians.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())

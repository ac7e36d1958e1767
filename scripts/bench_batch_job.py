"""Offline batch-job throughput against the served ceiling, side by side in one run.

    python scripts/bench_batch_job.py [--records 3000] [--repeats 3]

The ceiling is what `scripts/bench_dynamic_batching.py` measures: closed-loop batch-1 requests to
`minilm` with texts of --seq-len tokens, at the concurrency that gives the most. The job embeds
records whose texts tokenize to the same length, through `python -m clients batch`'s code (tokenized
client-side for `minilm`; server-side for `embed`). Target: job / ceiling >= 0.85. Median of repeats;
writes bench_results/batch_job.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clients.batch_job import BatchJob, JobConfig
from clients.connection import Endpoint
from clients.payloads import load_tokenizer
from scripts.bench_dynamic_batching import bench_served
from scripts.bench_record import write_record
from scripts.serve import EmbeddedServer, options_on_free_ports
from scripts.variants import load_config, write_repository

RESULTS = Path("bench_results/batch_job.json")
CEILING = "ceiling (minilm, batch-1 requests)"


def single_token_words(count: int) -> list[str]:
    """Vocabulary words that are one token each, so a text of n words is n + 2 tokens."""
    tokenizer = load_tokenizer()
    words = sorted(w for w in tokenizer.get_vocab() if w.isalpha() and w.isascii() and len(w) >= 4)
    return [w for w in words if len(tokenizer.encode(w, add_special_tokens=False).ids) == 1][:count]


def write_records(path: Path, num_records: int, seq_len: int) -> None:
    words = single_token_words(2000)
    with open(path, "w") as f:
        for i in range(num_records):
            text = " ".join(words[(i * 31 + k * 7) % len(words)] for k in range(seq_len - 2))
            f.write(json.dumps({"id": f"r{i}", "text": text}) + "\n")


def run_job(endpoint: Endpoint, records: Path, model: str, concurrency: int, batch_size: int, workdir: Path) -> dict:
    output = workdir / f"out-{model}-{time.monotonic_ns()}.jsonl"
    config = JobConfig(input=records, output=output, model=model, concurrency=concurrency, batch_size=batch_size)
    with open(os.devnull, "w") as quiet:
        summary = BatchJob(config, endpoint, progress_stream=quiet).run()
    assert summary.errors == 0 and summary.remaining == 0, summary.lines()
    return {"records_per_s": summary.done / summary.wall_s, "wall_s": summary.wall_s}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=3000)
    p.add_argument("--seq-len", type=int, default=32, help="tokens per text, as the ceiling's (default %(default)s)")
    p.add_argument("--ceiling-concurrency", default="32,64")
    p.add_argument("--concurrency", type=int, default=16, help="the job's requests in flight")
    p.add_argument("--batch-size", type=int, default=4, help="the job's records per request")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        records = workdir / "records.jsonl"
        write_records(records, args.records, args.seq_len)
        repo = write_repository(workdir / "repo", {m: load_config(m) for m in ("minilm", "embed")})
        opts = options_on_free_ports(repo)
        with EmbeddedServer(opts, log_path=workdir / "server.log"):
            endpoint = Endpoint(opts.grpc_url, "grpc", 120)
            for repeat in range(args.repeats):
                ceiling = max(bench_served("dynamic", opts.http_url, opts.grpc_url, c, args.seq_len, args.seconds, 1.0)
                              .throughput_rps for c in map(int, args.ceiling_concurrency.split(",")))
                rows.setdefault(CEILING, []).append(ceiling)
                for model in ("minilm", "embed"):
                    job = run_job(endpoint, records, model, args.concurrency, args.batch_size, workdir)
                    rows.setdefault(f"batch job via {model}", []).append(job["records_per_s"])
                print(f"repeat {repeat + 1}/{args.repeats}: " +
                      ", ".join(f"{k} {v[-1]:.1f}/s" for k, v in rows.items()), flush=True)
    medians = {k: statistics.median(v) for k, v in rows.items()}
    ceilings = rows[CEILING]
    # The ratio of each repeat (job and ceiling measured minutes apart at most), then their median.
    ratios = {k: statistics.median(j / c for j, c in zip(v, ceilings)) for k, v in rows.items()}
    print(f"\n{'':40s} {'texts/s':>9} {'/ ceiling':>10}   (medians of {args.repeats} repeats)")
    for name, value in medians.items():
        print(f"{name:40s} {value:9.1f} {ratios[name]:10.2f}")
    write_record(args.out, "batch_job", args, runs=rows, medians=medians, ratios=ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())

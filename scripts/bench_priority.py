"""Priority levels under load: interactive traffic (priority 1, one short text per request, Poisson
arrivals) over a saturating bulk stream (priority 2, many requests of 32-token texts, closed loop), against
`minilm` with its priority levels on, and against the same config with them off, in one run.

    python scripts/bench_priority.py [--seconds 20] [--interactive-rate 5] [--bulk-concurrency 96]

Interactive latency counts from each request's scheduled send time (open loop). Prints a table and
writes bench_results/priority.json.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clients.connection import Endpoint
from clients.embeddings import AsyncEmbeddingClient, RequestOptions
from clients.errors import ClientError
from clients.model_spec import load_spec
from clients.timing import percentile
from scripts.bench_record import write_record
from scripts.serve import EmbeddedServer, options_on_free_ports
from scripts.variants import load_config, write_repository

RESULTS = Path("bench_results/priority.json")
MODEL = "minilm"
INTERACTIVE, BULK = 1, 2  # Triton priority: 1 is the most urgent


def without_priority(config):
    variant = type(config)()
    variant.CopyFrom(config)
    variant.dynamic_batching.priority_levels = 0
    variant.dynamic_batching.default_priority_level = 0
    return variant


async def mixed_run(endpoint: Endpoint, model: str, seconds: float, rate: float, bulk_concurrency: int,
                    bulk_batch: int, seed: int) -> dict:
    rng = random.Random(seed)
    short = ["is this urgent?"]
    long = [" ".join(["data"] * 29) + f" {i}" for i in range(bulk_batch)]  # 32 tokens each
    interactive_s: list[float] = []
    bulk_rows = 0
    errors: dict[str, int] = {}
    async with AsyncEmbeddingClient(endpoint, model=model, batch_size=max(bulk_batch, 1),
                                    concurrency=bulk_concurrency + 64, spec=load_spec(MODEL)) as client:
        await client.embed(long)  # warm both shapes before the clock starts
        await client.embed(short)
        start = time.perf_counter()
        stop = start + seconds

        async def bulk():
            nonlocal bulk_rows
            while time.perf_counter() < stop:
                try:
                    rows = len(await client.embed(long, RequestOptions(priority=BULK)))
                    bulk_rows += rows  # after the await: `x += await f()` reads x before it, losing updates
                except ClientError as e:
                    errors[f"bulk {type(e).__name__}"] = errors.get(f"bulk {type(e).__name__}", 0) + 1

        async def one_interactive(due: float):
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            try:
                await client.embed(short, RequestOptions(priority=INTERACTIVE))
                interactive_s.append(time.perf_counter() - due)
            except ClientError as e:
                errors[f"interactive {type(e).__name__}"] = errors.get(f"interactive {type(e).__name__}", 0) + 1

        async def interactive():
            due, tasks = start + 1.0, []  # the bulk stream saturates the server first
            while due < stop:
                tasks.append(asyncio.create_task(one_interactive(due)))
                due += rng.expovariate(rate)
            await asyncio.gather(*tasks)

        await asyncio.gather(interactive(), *(bulk() for _ in range(bulk_concurrency)))
        wall = time.perf_counter() - start
    if not interactive_s:
        raise RuntimeError(f"no interactive request to {model} succeeded: {errors}")
    ms = lambda q: 1e3 * percentile(interactive_s, q)  # noqa: E731
    return {"model": model, "interactive_requests": len(interactive_s), "interactive_p50_ms": ms(50),
            "interactive_p90_ms": ms(90), "interactive_p99_ms": ms(99), "bulk_rows_per_s": bulk_rows / wall,
            "errors": errors}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--interactive-rate", type=float, default=5.0, help="interactive requests per second")
    p.add_argument("--bulk-concurrency", type=int, default=96, help="bulk requests in flight: a deep queue")
    p.add_argument("--bulk-batch", type=int, default=1, help="texts per bulk request")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    config = load_config(MODEL)
    variants = {"priority on": MODEL, "priority off": f"{MODEL}_no_priority"}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = write_repository(Path(tmp) / "repo", {MODEL: config, variants["priority off"]: without_priority(config)})
        opts = options_on_free_ports(repo)
        with EmbeddedServer(opts, log_path=Path(tmp) / "server.log"):
            endpoint = Endpoint(opts.grpc_url, "grpc", 120)
            for repeat in range(args.repeats):
                for label, model in variants.items():
                    row = asyncio.run(mixed_run(endpoint, model, args.seconds, args.interactive_rate,
                                                args.bulk_concurrency, args.bulk_batch, args.seed + repeat))
                    results.append({"variant": label, "repeat": repeat} | row)
                    print(f"{label:13s} interactive p50 {row['interactive_p50_ms']:7.1f} ms  "
                          f"p99 {row['interactive_p99_ms']:7.1f} ms  ({row['interactive_requests']} requests)  "
                          f"bulk {row['bulk_rows_per_s']:6.1f} texts/s  errors {row['errors']}", flush=True)
    summary = {}
    for key in ("interactive_p50_ms", "interactive_p99_ms", "bulk_rows_per_s"):
        for label in variants:
            summary[f"{key} ({label}, median)"] = statistics.median(r[key] for r in results if r["variant"] == label)
        off_on = summary[f"{key} (priority off, median)"] / summary[f"{key} (priority on, median)"]
        summary[f"{key} off / on"] = off_on
        print(f"{key:20s} median: priority on {summary[f'{key} (priority on, median)']:8.1f}, "
              f"off {summary[f'{key} (priority off, median)']:8.1f}, off / on {off_on:.2f}")
    write_record(args.out, "priority", args, runs=results, summary=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What Triton's dynamic batcher buys for `minilm` on this machine, measured side by side in one run:

1. in-process ONNX Runtime at batch 1, 2, 4, ... 64: the throughput ceiling;
2. what padding mixed-length texts costs: to each batch's longest, to length buckets, or not at all;
3. the served model under closed-loop load at concurrency 1 ... 64, with dynamic batching (the
   checked-in config) and with batching off (a `max_batch_size: 0` variant).

Prints a table and writes bench_results/dynamic_batching.json (one record per point, with settings).

    python scripts/bench_dynamic_batching.py [--seq-len 32] [--seconds 4] [--repeats 3]
"""
from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import onnxruntime as ort

from clients.model_spec import MODEL_REPOSITORY, load_spec
from load_tests.server_stats import model_stats
from scripts.bench_record import write_record
from scripts.serve import EmbeddedServer, options_on_free_ports
from scripts.variants import load_config, with_batching, without_batching, write_repository

MINILM = load_spec("minilm")
RESULTS = Path(__file__).resolve().parent.parent / "bench_results" / "dynamic_batching.json"
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)


def token_arrays(batch: int, seq_len: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Token ids of a realistic range, [CLS] ... [SEP], no padding: every request has one shape."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 29000, size=(batch, seq_len), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


@dataclass
class InProcessPoint:
    batch_size: int
    seq_len: int
    throughput_seq_s: float  # median over repeats
    latency_ms: float  # median time of one batch
    repeats_seq_s: list[float]
    kind: str = "in_process"


def _sessions(model_path: Path, count: int, intra_op_threads: int) -> list[ort.InferenceSession]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = intra_op_threads
    return [ort.InferenceSession(str(model_path), sess_options=options, providers=["CPUExecutionProvider"])
            for _ in range(count)]


def bench_in_process(model_path: Path, batch_sizes, seq_len: int, seconds: float, repeats: int,
                     instances: int, intra_op_threads: int) -> list[InProcessPoint]:
    """The served config's resources without the server: `instances` sessions of
    `intra_op_threads` threads each, every one in its own thread running batches back to back."""
    sessions = _sessions(model_path, instances, intra_op_threads)
    output = [MINILM.outputs[0].name]
    points = []
    for batch in batch_sizes:
        feed = token_arrays(batch, seq_len)
        for session in sessions:
            session.run(output, feed)  # warm-up

        def loop(session, stop_at, latencies):
            n = 0
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                session.run(output, feed)  # releases the GIL while it computes
                latencies.append(time.perf_counter() - t0)
                n += 1
            return n

        rates, latencies = [], []
        with ThreadPoolExecutor(len(sessions)) as pool:
            for _ in range(repeats):
                start = time.perf_counter()
                counts = list(pool.map(lambda s: loop(s, start + seconds, latencies), sessions))
                rates.append(sum(counts) * batch / (time.perf_counter() - start))
        point = InProcessPoint(batch, seq_len, statistics.median(rates), 1e3 * statistics.median(latencies), rates)
        print(f"  in-process  batch {batch:3d}: {point.throughput_seq_s:8.1f} seq/s  ({point.latency_ms:.1f} ms/batch)",
              flush=True)
        points.append(point)
    return points


@dataclass
class PaddingPoint:
    strategy: str  # "batch_longest", "buckets", "exact_batch_1"
    texts: int
    real_tokens: int
    computed_tokens: int  # real plus padding
    ms_per_text: float  # median over repeats
    kind: str = "padding"


BUCKETS = (16, 32, 64, 128, 256)


def _bucket(length: int) -> int:
    return next((b for b in BUCKETS if length <= b), length)


def bench_padding(model_path: Path, num_texts: int, batch: int, repeats: int) -> list[PaddingPoint]:
    """What padding costs: the same texts (lengths from a seeded log-normal, median 24 tokens, as
    sentences run) run padded to each batch's longest, padded to length buckets, and unpadded."""
    rng = np.random.default_rng(1)
    lengths = np.clip(rng.lognormal(np.log(24), 0.6, size=num_texts).astype(int), 3, 256)
    (session,) = _sessions(model_path, 1, 0)
    output = [MINILM.outputs[0].name]

    def padded(rows: np.ndarray, length: int) -> dict[str, np.ndarray]:
        arrays = token_arrays(len(rows), length)
        arrays["attention_mask"] = (np.arange(length)[None, :] < rows[:, None]).astype(np.int64)
        return arrays

    plans = {"batch_longest": [], "buckets": [], "exact_batch_1": []}
    for start in range(0, num_texts, batch):
        rows = lengths[start:start + batch]
        plans["batch_longest"].append(padded(rows, int(rows.max())))
        for b in sorted({_bucket(int(n)) for n in rows}):
            group = rows[[_bucket(int(n)) == b for n in rows]]
            plans["buckets"].append(padded(group, b))
        plans["exact_batch_1"] += [padded(rows[i:i + 1], int(rows[i])) for i in range(len(rows))]
    points = []
    for strategy, feeds in plans.items():
        times = []
        for _ in range(repeats + 1):  # the first pass warms up
            t0 = time.perf_counter()
            for feed in feeds:
                session.run(output, feed)
            times.append(time.perf_counter() - t0)
        computed = sum(f["input_ids"].size for f in feeds)
        point = PaddingPoint(strategy, num_texts, int(lengths.sum()), int(computed),
                             1e3 * statistics.median(times[1:]) / num_texts)
        print(f"  padding {strategy:14s}: {point.computed_tokens / point.real_tokens:5.2f} x real tokens, "
              f"{point.ms_per_text:6.2f} ms per text", flush=True)
        points.append(point)
    return points


@dataclass
class ServedPoint:
    variant: str  # "dynamic" or "none"
    concurrency: int
    seq_len: int
    seconds: float
    requests: int
    errors: int
    throughput_rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    avg_batch_size: float  # server side: inferences / executions
    avg_queue_us: float  # per request
    avg_compute_us: float  # per request: the compute time of the batch it ran in
    client_cpu_fraction: float  # load generator CPU seconds per wall second
    kind: str = "served"


async def closed_loop(grpc_url: str, concurrency: int, seconds: float, seq_len: int, warmup_s: float):
    """`concurrency` callers, each sending its next batch-1 request as soon as the last returns."""
    import tritonclient.grpc.aio as grpcaio

    feed = token_arrays(1, seq_len)
    latencies: list[float] = []
    errors = 0
    async with grpcaio.InferenceServerClient(grpc_url) as client:
        inputs = []
        for spec in MINILM.inputs:
            t = grpcaio.InferInput(spec.name, list(feed[spec.name].shape), spec.wire_dtype)
            t.set_data_from_numpy(feed[spec.name])
            inputs.append(t)
        start = time.perf_counter()
        measure_from = start + warmup_s
        stop_at = measure_from + seconds

        async def caller():
            nonlocal errors
            while (now := time.perf_counter()) < stop_at:
                try:
                    await client.infer(MINILM.name, inputs)
                except Exception:
                    if now >= measure_from:
                        errors += 1
                    continue
                if now >= measure_from:
                    latencies.append(time.perf_counter() - now)

        await asyncio.gather(*(caller() for _ in range(concurrency)))
    return latencies, errors


def bench_served(variant: str, http_url: str, grpc_url: str, concurrency: int, seq_len: int,
                 seconds: float, warmup_s: float) -> ServedPoint:
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    # The stats window spans warm-up too; it only gives ratios (batch size, queue and compute time).
    before = model_stats(http_url, MINILM.name)
    t0 = time.perf_counter()
    latencies, errors = asyncio.run(closed_loop(grpc_url, concurrency, seconds, seq_len, warmup_s))
    wall = time.perf_counter() - t0
    after = model_stats(http_url, MINILM.name)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    window = after - before
    ms = np.array(latencies) * 1e3 if latencies else np.array([np.nan])
    return ServedPoint(
        variant=variant, concurrency=concurrency, seq_len=seq_len, seconds=seconds,
        requests=len(latencies), errors=errors, throughput_rps=len(latencies) / seconds,
        p50_ms=float(np.percentile(ms, 50)), p90_ms=float(np.percentile(ms, 90)), p99_ms=float(np.percentile(ms, 99)),
        # 0 when the server ran nothing (per request, as clients/health.py's ModelStatistics computes them)
        avg_batch_size=window.avg_batch_size or 0.0,
        avg_queue_us=window.avg_queue_us or 0.0,
        avg_compute_us=window.avg_compute_us or 0.0,
        client_cpu_fraction=((cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)) / wall,
    )


def run_variant(variant: str, config, concurrencies, seq_len: int, seconds: float, warmup_s: float,
                repeats: int) -> list[ServedPoint]:
    with tempfile.TemporaryDirectory(prefix="batchwise-bench-") as tmp:
        repo = write_repository(Path(tmp) / "repo", {MINILM.name: config})
        opts = options_on_free_ports(repo)
        points = []
        with EmbeddedServer(opts) as server:
            for c in concurrencies:
                runs = [bench_served(variant, opts.http_url, opts.grpc_url, c, seq_len, seconds, warmup_s)
                        for _ in range(repeats)]
                point = sorted(runs, key=lambda p: p.throughput_rps)[len(runs) // 2]  # the median run
                print(f"  served {variant:7s} concurrency {c:3d}: {point.throughput_rps:8.1f} req/s  "
                      f"p50 {point.p50_ms:6.1f} ms  p99 {point.p99_ms:6.1f} ms  batch {point.avg_batch_size:5.1f}  "
                      f"client CPU {point.client_cpu_fraction:.2f}", flush=True)
                points.append(point)
            if server.process.poll() is not None:
                raise RuntimeError(f"the server died during the benchmark\n{server.problem_summary()}")
    return points


def summarize(in_process: list[InProcessPoint], served: list[ServedPoint], at_concurrency: int) -> dict:
    best_in_process = max(in_process, key=lambda p: p.throughput_seq_s)
    dynamic = [p for p in served if p.variant == "dynamic"]
    none = [p for p in served if p.variant == "none"]
    best_served = max(dynamic, key=lambda p: p.throughput_rps)
    summary = {
        "best_in_process_seq_s": best_in_process.throughput_seq_s,
        "best_in_process_batch": best_in_process.batch_size,
        "best_served_rps": best_served.throughput_rps,
        "best_served_concurrency": best_served.concurrency,
        "served_over_in_process": best_served.throughput_rps / best_in_process.throughput_seq_s,
    }
    at_d = next((p for p in dynamic if p.concurrency == at_concurrency), None)
    at_n = next((p for p in none if p.concurrency == at_concurrency), None)
    if at_d and at_n:
        summary[f"dynamic_over_none_at_{at_concurrency}"] = at_d.throughput_rps / at_n.throughput_rps
    return summary


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-len", type=int, default=32, help="tokens per text (default %(default)s)")
    p.add_argument("--seconds", type=float, default=4.0, help="measured seconds per point")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of load before each served point")
    p.add_argument("--repeats", type=int, default=3, help="repeats per point; the median is reported")
    p.add_argument("--batch-sizes", default=",".join(map(str, DEFAULT_BATCH_SIZES)))
    p.add_argument("--concurrency", default=",".join(map(str, DEFAULT_CONCURRENCY)))
    p.add_argument("--compare-at", type=int, default=32, help="concurrency for the dynamic-vs-none ratio")
    p.add_argument("--padding-texts", type=int, default=256, help="texts in the padding-cost run (0: skip)")
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    model_path = MODEL_REPOSITORY / MINILM.name / "1" / "model.onnx"
    if not model_path.is_file():
        print(f"error: {model_path} is missing: run `make export`", file=sys.stderr)
        return 1
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    print(f"minilm, {args.seq_len} tokens per text, {args.seconds:g} s per point, median of {args.repeats}")
    config = load_config(MINILM.name)
    instances = sum(g.count for g in config.instance_group) or 1
    intra = int(config.parameters["intra_op_thread_count"].string_value or 0)
    print(f"in-process: {instances} session(s) x {intra or 'default'} intra-op thread(s), as the served config")
    in_process = bench_in_process(model_path, batch_sizes, args.seq_len, args.seconds, args.repeats, instances, intra)
    padding = bench_padding(model_path, args.padding_texts, 32, args.repeats) if args.padding_texts else []
    served = run_variant("dynamic", with_batching(config), concurrencies, args.seq_len, args.seconds,
                         args.warmup, args.repeats)
    served += run_variant("none", without_batching(config), concurrencies, args.seq_len, args.seconds,
                          args.warmup, args.repeats)
    summary = summarize(in_process, served, args.compare_at)
    print("\nsummary")
    for k, v in summary.items():
        print(f"  {k:32s} {v:10.3f}" if isinstance(v, float) else f"  {k:32s} {v:10d}")
    write_record(args.out, "dynamic_batching", args, model=MINILM.name,
                 points=[asdict(p) for p in in_process + padding + served], summary=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())

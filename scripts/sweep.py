"""Sweep batching configurations of one model: render each variant whole into a temporary model
repository (the checked-in config.pbtxt is never edited), start the embedded Triton on it, run the
envelope, and write the throughput/p99 Pareto frontier across variants and the recommended config.

    python scripts/sweep.py --model minilm --concurrency 1,8,32 --slo-p99-ms 150 \\
        --max-batch-size 8,32 --batch-window-us 0,2000 --instances 1,2
    python scripts/sweep.py --model gpt2 --rates 1,2 --max-tokens 16 --slo-p99-ms 4000 \\
        --scheduling continuous,static --max-num-seqs 8,64

Writes into --out: variants.csv (every point), frontier.csv, sweep.json, frontier.png,
recommended_config.pbtxt, and each variant's own envelope report under variants/<name>/.
"""
import locust  # noqa: F401  -- first: gevent must patch sockets and ssl before anything imports them

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from load_tests.analysis import Slo, pareto_frontier
from load_tests.envelope import DEFAULT_OUT, EnvelopeConfig, EnvelopeError, run_envelope
from scripts.serve import EmbeddedServer, options_on_free_ports
from scripts.sweep_report import write_sweep
from scripts.sweep_variants import Variant, variant_grid
from scripts.triton_dist import LauncherError
from scripts.variants import load_config, write_repository


def run_variant(variant: Variant, base: EnvelopeConfig, out: Path) -> list:
    with tempfile.TemporaryDirectory(prefix="batchwise-sweep-") as tmp:
        repo = write_repository(Path(tmp) / "repo", {base.model: variant.config})
        opts = options_on_free_ports(repo)
        print(f"\n== variant {variant.name}: {variant.settings}\nstarting the embedded Triton ...", flush=True)
        with EmbeddedServer(opts) as server:
            cfg = replace(base, url=opts.http_url, grpc_url=opts.grpc_url, metrics_url=opts.metrics_url,
                          out=out / "variants" / variant.name, variant=variant.name)
            run = run_envelope(cfg)
            if server.process.poll() is not None:
                raise EnvelopeError(f"the server died during variant {variant.name}\n{server.problem_summary()}")
    return run.points


def _list(cast):
    def parse(text: str):
        try:
            return [cast(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected values separated by commas, got {text!r}") from None
    return parse


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    loads = p.add_mutually_exclusive_group(required=True)
    loads.add_argument("--concurrency", type=_list(float), help="closed loop: users per point")
    loads.add_argument("--rates", type=_list(float), help="open loop: requests/s per point")
    p.add_argument("--max-batch-size", type=_list(int), help="e.g. 8,32")
    p.add_argument("--preferred-batch-sizes", action="append", type=lambda s: [] if s == "none" else _list(int)(s),
                   help="one set per flag, e.g. --preferred-batch-sizes 8,16 --preferred-batch-sizes none")
    p.add_argument("--batch-window-us", type=_list(int), help="max_queue_delay_microseconds values")
    p.add_argument("--instances", type=_list(int), help="instance_group counts")
    p.add_argument("--scheduling", type=_list(str), help="decoding models: continuous,static")
    p.add_argument("--max-num-seqs", type=_list(int), help="decoding models")
    p.add_argument("--max-num-batched-tokens", type=_list(int), help="decoding models")
    p.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    p.add_argument("--duration", type=float, default=20.0, help="most seconds per point")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--window", type=float, default=2.0)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--max-in-flight", type=int, help="open loop: users in the pool")
    p.add_argument("--workload", type=Path, help="a workload file (python -m load_tests.workload)")
    p.add_argument("--slo-p99-ms", type=float)
    p.add_argument("--slo-ttft-p99-ms", type=float)
    p.add_argument("--slo-tpot-p99-ms", type=float)
    p.add_argument("--max-error-rate", type=float, default=0.0)
    p.add_argument("--out", type=Path, help=f"default {DEFAULT_OUT.parent}/sweep/<model>")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    out = a.out or DEFAULT_OUT.parent / "sweep" / a.model
    try:
        slo = Slo(a.slo_p99_ms, a.slo_ttft_p99_ms, a.slo_tpot_p99_ms, a.max_error_rate)
        base = EnvelopeConfig(model=a.model, load_kind="concurrency" if a.concurrency else "rate",
                              loads=tuple(a.concurrency or a.rates), protocol=a.protocol, duration_s=a.duration,
                              warmup_s=a.warmup, window_s=a.window, max_tokens=a.max_tokens, slo=slo, out=out,
                              max_in_flight=a.max_in_flight, workload=a.workload)
        variants, skipped = variant_grid(load_config(a.model), a.model, max_batch_size=a.max_batch_size,
                                         preferred_batch_sizes=a.preferred_batch_sizes,
                                         batch_window_us=a.batch_window_us, instances=a.instances,
                                         scheduling=a.scheduling, max_num_seqs=a.max_num_seqs,
                                         max_num_batched_tokens=a.max_num_batched_tokens)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for reason in skipped:
        print(f"skipped: {reason}")
    print(f"{len(variants)} variant(s) of {a.model}: {', '.join(v.name for v in variants)}")
    points = []
    try:
        for variant in variants:
            points += run_variant(variant, base, out)
    except (EnvelopeError, LauncherError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    paths = write_sweep(out, variants, points, slo, a.model)
    print("\nPareto frontier (throughput vs p99):")
    for p in pareto_frontier(points):
        print(f"  {p.variant:40s} load {p.load:6g}  {p.throughput_rps:8.1f} req/s  p99 {p.p99_ms:8.1f} ms")
    print(f"recommended config: {paths.get('recommended', 'none (no point meets the SLO)')}")
    print(f"sweep: {paths['json']}  frontier plot: {paths['frontier_png']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Sweep batching configurations of one model: render each variant whole into a temporary model
repository (the checked-in config.pbtxt is never edited) beside the models it calls, start the
embedded Triton on it, run the envelope, and write the throughput/p99 Pareto frontier across variants
and the recommended config. A variant that fails is recorded with its error and the sweep goes on.

    python scripts/sweep.py --model minilm --concurrency 1,8,32 --slo-p99-ms 150 \\
        --max-batch-size 8,32 --batch-window-us 0,2000 --instances 1,2
    python scripts/sweep.py --model gpt2 --rates 1,2 --max-tokens 16 --slo-p99-ms 4000 \\
        --scheduling continuous,static --max-num-seqs 8,64

Writes into --out, after every variant: variants.csv (every point), frontier.csv, sweep.json (with
each variant's status and the errors of those that failed), frontier.png, recommended_config.pbtxt,
and each variant's own envelope report under variants/<name>/.
"""
import locust  # noqa: F401  -- first: gevent must patch sockets and ssl before anything imports them

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tritonclient.grpc import model_config_pb2

from clients.model_spec import MODEL_REPOSITORY
from load_tests.analysis import Slo, pareto_frontier
from load_tests.envelope import DEFAULT_OUT, EnvelopeConfig, EnvelopeError, run_envelope
from scripts.serve import EmbeddedServer, options_on_free_ports
from scripts.sweep_report import measure_variants, write_sweep
from scripts.sweep_variants import Variant, variant_grid
from scripts.variants import load_config, write_repository

# A Python model names the models it calls by BLS in a parameter with this suffix (embed: encoder_model).
CALLED_MODEL_SUFFIX = "_model"


def called_models(config: model_config_pb2.ModelConfig, repository: Path = MODEL_REPOSITORY,
                  ) -> dict[str, model_config_pb2.ModelConfig]:
    """The checked-in configs of every model that `config` calls, directly or through another one:
    the steps of an ensemble and the models named by `*_model` parameters."""
    found: dict[str, model_config_pb2.ModelConfig] = {}
    pending = [config]
    while pending:
        current = pending.pop()
        names = [step.model_name for step in current.ensemble_scheduling.step]
        names += [p.string_value for key, p in current.parameters.items() if key.endswith(CALLED_MODEL_SUFFIX)]
        for name in names:
            if name in found or name == config.name:
                continue
            if not (Path(repository) / name / "config.pbtxt").is_file():
                raise FileNotFoundError(f"{current.name} calls {name!r}, which is not in {repository}")
            found[name] = load_config(name, repository)
            pending.append(found[name])
    return found


def run_variant(variant: Variant, base: EnvelopeConfig, out: Path,
                called: dict[str, model_config_pb2.ModelConfig]) -> list:
    """The variant's envelope, served beside the models it calls (`called`, as checked in)."""
    configs = {**called, base.model: variant.config}
    with tempfile.TemporaryDirectory(prefix="batchwise-sweep-") as tmp:
        repo = write_repository(Path(tmp) / "repo", configs)
        opts = options_on_free_ports(repo)
        print(f"\n== variant {variant.name}: {variant.settings}\nstarting the embedded Triton ...", flush=True)
        with EmbeddedServer(opts) as server:
            cfg = replace(base, url=opts.http_url, grpc_url=opts.grpc_url, metrics_url=opts.metrics_url,
                          out=out / "variants" / variant.name, variant=variant.name)
            try:
                run = run_envelope(cfg)
            except Exception as e:
                if server.process.poll() is None:
                    raise
                # a dead server shows up as a refused connection; its log says why it died
                raise EnvelopeError(f"the server died during variant {variant.name} ({type(e).__name__}: {e})\n"
                                    f"{server.problem_summary()}") from e
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
    p.add_argument("--max-tokens", type=int, help="generation: tokens per request (default: each --workload "
                   "record's own; 16 without a workload file)")
    p.add_argument("--max-in-flight", type=int, help="open loop: users in the pool")
    p.add_argument("--pin-arrivals", action="store_true",
                   help="open loop, variance reduction: each window offers exactly the rate (understates queueing)")
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
        # --max-tokens, else each workload record's own, else the envelope's default
        max_tokens = a.max_tokens if a.max_tokens is not None else None if a.workload else EnvelopeConfig.max_tokens
        base = EnvelopeConfig(model=a.model, load_kind="concurrency" if a.concurrency else "rate",
                              loads=tuple(a.concurrency or a.rates), protocol=a.protocol, duration_s=a.duration,
                              warmup_s=a.warmup, window_s=a.window, slo=slo, out=out,
                              max_tokens=max_tokens,
                              max_in_flight=a.max_in_flight, workload=a.workload, pin_arrivals=a.pin_arrivals)
        variants, skipped = variant_grid(load_config(a.model), a.model, max_batch_size=a.max_batch_size,
                                         preferred_batch_sizes=a.preferred_batch_sizes,
                                         batch_window_us=a.batch_window_us, instances=a.instances,
                                         scheduling=a.scheduling, max_num_seqs=a.max_num_seqs,
                                         max_num_batched_tokens=a.max_num_batched_tokens)
        called = called_models(load_config(a.model))  # a variant changes batching, never what it calls
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for reason in skipped:
        print(f"skipped: {reason}")
    print(f"{len(variants)} variant(s) of {a.model}: {', '.join(v.name for v in variants)}"
          + (f", each served beside {', '.join(called)}" if called else ""))
    paths: dict = {}

    def write(points, failed):  # after every variant, so that an interrupted sweep keeps what it measured
        paths.update(write_sweep(out, variants, points, slo, a.model, failed, base.tolerance))

    points, failed = measure_variants(variants, lambda v: run_variant(v, base, out, called), on_progress=write)
    print("\nPareto frontier (throughput vs p99):")
    for p in pareto_frontier(points):
        print(f"  {p.variant:40s} load {p.load:6g}  {p.throughput_rps:8.1f} req/s  p99 {p.p99_ms:8.1f} ms")
    print(f"recommended config: {paths.get('recommended', 'none (no point meets the SLO)')}")
    print(f"sweep: {paths['json']}  frontier plot: {paths['frontier_png']}")
    if failed:
        print(f"\n{len(failed)} of {len(variants)} variant(s) failed; the results above are the others':",
              file=sys.stderr)
        for f in failed:
            print(f"  {f.name}: {f.error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m clients`: health, models, stats, embed, generate and offline batch jobs from the shell.

Exit codes: 0 ok; 1 a request failed (the reason on stderr); 2 bad usage or input; 3 the server is
unreachable or not ready; 4 a batch job finished but some records failed (each with its error in the
output); 130 interrupted (a batch job resumes when run again with the same --output).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .connection import ENV_PROTOCOL, ENV_TIMEOUT, ENV_URL, PROTOCOLS, Endpoint
from .errors import ClientError, UnavailableError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_RECORD_ERRORS, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130


class UsageError(Exception):
    pass


def _endpoint(args) -> Endpoint:
    try:
        return Endpoint.resolve(args.url, args.protocol, args.timeout)
    except ValueError as e:
        raise UsageError(str(e)) from None


def cmd_health(args, out) -> int:
    from .health import Admin

    with Admin(_endpoint(args)) as admin:
        health = admin.health()
    print(f"server {'live' if health.live else 'NOT live'}, {'ready' if health.ready else 'NOT ready'}, "
          f"Triton {health.version}", file=out)
    for m in health.models:
        print(f"  {m.name:<16} v{m.version or '-':<3} {m.state}{'  ' + m.reason if m.reason else ''}", file=out)
    return EXIT_OK if health.ready else EXIT_UNAVAILABLE


def cmd_models(args, out) -> int:
    from .health import Admin

    with Admin(_endpoint(args)) as admin:
        states = admin.health().models
        print(f"{'model':<16} {'state':<12} {'backend':<20} {'batching':<52} inputs", file=out)
        for m in states:
            if m.state != "READY":
                print(f"{m.name:<16} {m.state:<12}", file=out)
                continue
            spec = admin.model_spec(m.name)
            print(f"{m.name:<16} {m.state:<12} {spec.config.backend or spec.config.platform:<20} "
                  f"{_batching(spec.config):<52} {', '.join(spec.input_names)}", file=out)
    return EXIT_OK


def _batching(config) -> str:
    if config.model_transaction_policy.decoupled:
        params = {k: v.string_value for k, v in config.parameters.items()}
        return f"{params.get('scheduling', 'engine')} (max_num_seqs {params.get('max_num_seqs', '?')})"
    if not config.max_batch_size:
        return "none"
    if config.HasField("dynamic_batching"):
        d = config.dynamic_batching
        preferred = list(d.preferred_batch_size) or "-"
        return f"dynamic, max {config.max_batch_size}, preferred {preferred}, window {d.max_queue_delay_microseconds} us"
    return f"max {config.max_batch_size}, no dynamic batcher"


def cmd_stats(args, out) -> int:
    from .health import Admin

    with Admin(_endpoint(args)) as admin:
        s = admin.statistics(args.model)
    us = lambda v: "-" if v is None else f"{v / 1e3:.2f} ms"  # noqa: E731
    print(f"{s.model} v{s.version}: {s.success.count} requests ok, {s.fail.count} failed, "
          f"{s.inference_count} inferences in {s.execution_count} executions "
          f"(average batch {s.avg_batch_size or 0:.2f})", file=out)
    print(f"  per request: server {us(s.success.avg_us)}, queue {us(s.avg_queue_us)}, compute {us(s.avg_compute_us)}",
          file=out)
    if s.batch_executions:
        total = sum(s.batch_executions.values())
        print(f"  {'batch size':>10} {'executions':>11} {'share':>7}", file=out)
        for size, n in sorted(s.batch_executions.items()):
            print(f"  {size:>10} {n:>11} {100 * n / total:>6.1f}%  {'#' * round(40 * n / total)}", file=out)
    return EXIT_OK


def cmd_embed(args, out) -> int:
    from .embeddings import EmbeddingClient, RequestOptions

    texts = list(args.texts)
    if args.input:
        texts += [line.rstrip("\n") for line in _open_text(args.input) if line.strip()]
    if not texts:
        raise UsageError("give texts to embed, or --input FILE (one text per line)")
    with EmbeddingClient(_endpoint(args), model=args.model, batch_size=args.batch_size) as client:
        vectors = client.embed(texts, RequestOptions(priority=args.priority))
    for text, v in zip(texts, vectors):
        if args.json:
            print(json.dumps({"text": text, "embedding": v.tolist()}), file=out)
        else:
            head = ", ".join(f"{x:+.4f}" for x in v[:4])
            print(f"[{head}, ...] dim {v.shape[0]}, norm {float((v @ v) ** 0.5):.3f}  {text[:60]}", file=out)
    return EXIT_OK


def _open_text(path: str):
    try:
        return open(path, encoding="utf-8").readlines()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None


def cmd_generate(args, out) -> int:
    from .embeddings import RequestOptions
    from .generation import GenerationClient

    client = GenerationClient(_endpoint(args), model=args.model)
    options = RequestOptions(priority=args.priority)
    if args.stream:
        with client.stream(args.prompt, _sampling(args), options) as tokens:
            for event in tokens:
                print(event.text, end="", file=out, flush=True)
            result = tokens.result()
        print(file=out)
    else:
        result = client.generate(args.prompt, _sampling(args), options)
        print(result.text, file=out)
    t = result.timing
    parts = [f"{result.num_output_tokens} tokens", f"finish {result.finish_reason}"]
    if t.ttft_s is not None:
        parts.append(f"TTFT {1e3 * t.ttft_s:.0f} ms")
    if t.tpot_s is not None:
        parts.append(f"TPOT {1e3 * t.tpot_s:.1f} ms")
    if t.e2e_s > 0:
        parts.append(f"{result.num_output_tokens / t.e2e_s:.1f} tokens/s")
    print(", ".join(parts), file=sys.stderr)
    return EXIT_OK


def _sampling(args):
    from .payloads import Sampling

    return Sampling(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                    random_seed=args.seed, ignore_eos=True if args.ignore_eos else None)


def cmd_batch(args, out) -> int:
    from .batch_job import BatchJob, JobConfig
    from .records import InputError

    try:
        config = JobConfig(input=Path(args.input), output=Path(args.output), model=args.model,
                           concurrency=args.concurrency, batch_size=args.batch_size, id_field=args.id_field,
                           text_field=args.text_field, skip_invalid=args.skip_invalid,
                           max_unavailable_s=args.max_unavailable, sampling=_sampling(args), priority=args.priority)
        job = BatchJob(config, _endpoint(args))
        prepared = job.prepare()
    except (InputError, ValueError, KeyError, FileNotFoundError) as e:
        raise UsageError(str(e).strip('"')) from None
    for problem in prepared[1].problems:
        print(f"warning: {problem}", file=sys.stderr)
    try:
        summary = job.run(prepared)
    except KeyboardInterrupt:
        print(f"interrupted; run the same command again to finish the rest (results so far are in {args.output})",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    for line in summary.lines():
        print(line, file=out)
    if summary.stopped:
        print(f"error: stopped: {summary.stopped}; run the same command again to resume", file=sys.stderr)
        return EXIT_UNAVAILABLE if isinstance(summary.stopped, UnavailableError) else EXIT_FAILED
    return EXIT_RECORD_ERRORS if summary.errors else EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help=f"HOST:PORT of the server (${ENV_URL}; default 127.0.0.1:8000 for http, "
                                      "127.0.0.1:8001 for grpc)")
    common.add_argument("--protocol", choices=PROTOCOLS, help=f"(${ENV_PROTOCOL}; default http)")
    common.add_argument("--timeout", type=float, help=f"seconds per request (${ENV_TIMEOUT}; default 60)")
    common.add_argument("--priority", type=int, default=0, help="Triton priority level (0: the model's default)")

    parser = argparse.ArgumentParser(prog="python -m clients", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("health", parents=[common], help="server liveness, readiness and model states")
    sub.add_parser("models", parents=[common], help="the served models and how each one batches")
    p = sub.add_parser("stats", parents=[common], help="a model's batch-size distribution and latencies")
    p.add_argument("model")

    p = sub.add_parser("embed", parents=[common], help="embed texts")
    p.add_argument("texts", nargs="*")
    p.add_argument("--input", help="a file with one text per line")
    p.add_argument("--model", default="embed", help="embed (text in) or minilm (token ids, tokenized here)")
    p.add_argument("--batch-size", type=int, default=8, help="texts per request")
    p.add_argument("--json", action="store_true", help="whole vectors as JSON lines")

    def sampling_flags(p, default_model):
        p.add_argument("--model", default=default_model)
        p.add_argument("--max-tokens", type=int, default=32)
        p.add_argument("--temperature", type=float)
        p.add_argument("--top-k", type=int)
        p.add_argument("--top-p", type=float)
        p.add_argument("--seed", type=int, help="random seed of the sampler (reproducible output)")
        p.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-tokens tokens")

    p = sub.add_parser("generate", parents=[common], help="generate text, streamed with --stream")
    p.add_argument("prompt")
    p.add_argument("--stream", action="store_true", help="print tokens as they arrive")
    sampling_flags(p, "gpt2")

    p = sub.add_parser("batch", parents=[common], help="an offline, resumable batch job over a JSONL or CSV file")
    p.add_argument("--input", required=True, help="records with an id and a text (.jsonl or .csv)")
    p.add_argument("--output", required=True, help="JSONL results; an existing file is resumed")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    p.add_argument("--batch-size", type=int, default=4, help="records per embedding request")
    p.add_argument("--id-field", default="id")
    p.add_argument("--text-field", default="text")
    p.add_argument("--skip-invalid", action="store_true", help="run the valid records when some lines are bad")
    p.add_argument("--max-unavailable", type=float, default=300.0,
                   help="seconds to wait out an unreachable server before stopping (resumable)")
    sampling_flags(p, "embed")
    return parser


COMMANDS = {"health": cmd_health, "models": cmd_models, "stats": cmd_stats, "embed": cmd_embed,
            "generate": cmd_generate, "batch": cmd_batch}


def main(argv: list[str] | None = None, out=None) -> int:
    args = build_parser().parse_args(argv)
    out = out or sys.stdout
    try:
        return COMMANDS[args.command](args, out)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, KeyError, FileNotFoundError) as e:  # raised before any request: an unknown
        # model (no config.pbtxt), a batch size over its max_batch_size, an option the protocol lacks
        print(f"error: {str(e).strip(chr(34))}", file=sys.stderr)
        return EXIT_USAGE
    except UnavailableError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except ClientError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED

"""The demo behind `make demo`: start the embedded Triton, send real requests over HTTP and gRPC,
show what came back and what the dynamic batcher did, then say how to call the server yourself."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from clients.connection import Endpoint
from clients.embeddings import EmbeddingClient
from clients.generation import GenerationClient
from clients.health import Admin, ModelStatistics
from clients.model_spec import REPO_ROOT
from clients.payloads import Sampling
from scripts.serve import (
    DEFAULT_GRPC_PORT,
    DEFAULT_HTTP_PORT,
    DEFAULT_METRICS_PORT,
    DEFAULT_MODEL_REPOSITORY,
    EmbeddedServer,
    ServerOptions,
    free_ports,
    port_in_use,
)
from scripts.triton_dist import LauncherError

SENTENCES = [
    "A man is playing a guitar.",
    "Someone is strumming a guitar on stage.",
    "The central bank raised interest rates again.",
    "Inflation pushed the bank to lift rates.",
]


def choose_ports(host: str) -> tuple[int, int, int]:
    defaults = (DEFAULT_HTTP_PORT, DEFAULT_GRPC_PORT, DEFAULT_METRICS_PORT)
    if not any(port_in_use(host, p) for p in defaults):
        return defaults
    ports = free_ports(3, host)
    print(f"note: ports {defaults} are taken, using {tuple(ports)} for this demo")
    return tuple(ports)


def show_similarities(vectors: np.ndarray) -> None:
    print("\ncosine similarity (the embeddings are unit length, so this is a dot product):")
    width = max(len(s) for s in SENTENCES)
    for i, s in enumerate(SENTENCES):
        row = "  ".join(f"{vectors[i] @ vectors[j]:5.2f}" for j in range(len(SENTENCES)))
        print(f"  {s:<{width}}  {row}")


def burst(grpc: Endpoint, num_requests: int, concurrency: int) -> tuple[float, ModelStatistics]:
    """Send single-text requests from many threads at once; return (seconds, minilm stats delta).
    gRPC, because its client may be shared between threads (the HTTP one is gevent-based)."""
    texts = [f"request number {i} about batching" for i in range(num_requests)]
    with Admin(grpc) as admin, EmbeddingClient(grpc, model="embed", batch_size=1) as client:
        before = admin.statistics("minilm")
        start = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda t: client.embed([t]), texts))
        elapsed = time.perf_counter() - start
        return elapsed, admin.statistics("minilm") - before


def stream_generation(grpc: Endpoint, prompt: str, max_tokens: int) -> None:
    """Stream tokens from `gpt2` over gRPC and print them as they arrive."""
    print(f"\ngpt2 (continuous batching, random weights, so the words are noise), streamed over gRPC:\n  {prompt} ",
          end="", flush=True)
    with GenerationClient(grpc).stream(prompt, Sampling(max_tokens=max_tokens, ignore_eos=True)) as tokens:
        for event in tokens:
            print(event.text, end="", flush=True)
        result = tokens.result()
    t = result.timing
    print(f"\n  {result.num_output_tokens} tokens, finish reason {result.finish_reason}: "
          f"TTFT {1e3 * t.ttft_s:.0f} ms, TPOT {1e3 * (t.tpot_s or 0):.0f} ms")


ENVELOPE_OUT = REPO_ROOT / "bench_results" / "envelope" / "demo"


def envelope_demo(opts: ServerOptions) -> list[Path]:
    """A short load envelope of minilm and gpt2 (three points each, a few seconds per point). In its
    own process: Locust patches sockets with gevent before anything else, which this one cannot."""
    from load_tests.workload import make_workload

    # One text length, so that the dynamic batcher can put any requests together (it batches equal
    # shapes only); the `embed` model buckets mixed lengths instead.
    workload = make_workload("embed", 256, seed=0, lengths="fixed:24").save(ENVELOPE_OUT / "minilm_24_tokens.jsonl")
    runs = {"minilm": ["--concurrency", "1,4,16", "--duration", "8", "--slo-p99-ms", "250",
                       "--workload", str(workload)],
            "gpt2": ["--concurrency", "1,4,8", "--duration", "12", "--window", "3", "--max-tokens", "8",
                     "--slo-ttft-p99-ms", "1000"]}
    reports = []
    for model, args in runs.items():
        print(f"\nload envelope of {model} (python -m load_tests.envelope --model {model} {' '.join(args)}):",
              flush=True)
        cmd = [sys.executable, "-m", "load_tests.envelope", "--model", model, "--url", opts.http_url,
               "--grpc-url", opts.grpc_url, "--metrics-url", opts.metrics_url, "--warmup", "1",
               "--out", str(ENVELOPE_OUT / model), *args]
        if subprocess.run(cmd, cwd=REPO_ROOT).returncode == 0:
            reports.append(ENVELOPE_OUT / model / "report.html")
    return reports


def how_to_call(opts: ServerOptions) -> str:
    body = json.dumps({"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["hello world"]}]})
    return f"""
To run the server yourself and call it:
  make serve                      # tritonserver on {DEFAULT_HTTP_PORT} (HTTP), {DEFAULT_GRPC_PORT} (gRPC), {DEFAULT_METRICS_PORT} (metrics)
  curl -s localhost:{DEFAULT_HTTP_PORT}/v2/models/embed/infer -d '{body}'
  curl -s localhost:{DEFAULT_HTTP_PORT}/v2/models/minilm/stats    # executed batch sizes, queue and compute time
  curl -s localhost:{DEFAULT_METRICS_PORT}/metrics | grep nv_inference_queue_summary_us
From Python (tritonclient):
  import numpy as np, tritonclient.http as h
  c = h.InferenceServerClient("127.0.0.1:{DEFAULT_HTTP_PORT}")
  t = h.InferInput("text", [1, 1], "BYTES"); t.set_data_from_numpy(np.array([[b"hello"]], dtype=object))
  c.infer("embed", [t]).as_numpy("embedding")   # (1, 384) float32
With this repository's client toolkit (README: "Client toolkit"; add --url HOST:PORT for other ports):
  .venv/bin/python -m clients health
  .venv/bin/python -m clients stats minilm          # batch-size distribution, queue and compute time
  .venv/bin/python -m clients generate "hello" --max-tokens 16 --stream
  .venv/bin/python -m clients batch --input docs.jsonl --output out.jsonl --model embed
Generation (gpt2, continuous batching; gpt2_static for request-level batching):
  curl -s localhost:{DEFAULT_HTTP_PORT}/v2/models/gpt2/generate -d '{{"text_input": "hello", "max_tokens": 8}}'
  curl -sN localhost:{DEFAULT_HTTP_PORT}/v2/models/gpt2/generate_stream -d '{{"text_input": "hello", "max_tokens": 8, "stream": true}}'
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-repository", type=Path, default=DEFAULT_MODEL_REPOSITORY)
    p.add_argument("--requests", type=int, default=256, help="requests in the concurrent burst")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--skip-envelope", action="store_true", help="leave out the closing load envelope")
    args = p.parse_args(argv)

    host = "127.0.0.1"
    http_port, grpc_port, metrics_port = choose_ports(host)
    opts = ServerOptions(model_repository=args.model_repository.resolve(), host=host, http_port=http_port,
                         grpc_port=grpc_port, metrics_port=metrics_port)
    print(f"starting the embedded Triton (HTTP {opts.http_url}, gRPC {opts.grpc_url}) ...", flush=True)
    started = time.perf_counter()
    try:
        server = EmbeddedServer(opts).start()
    except LauncherError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    with server:
        print(f"ready in {time.perf_counter() - started:.1f} s; models: minilm (ONNX, dynamic batching), "
              f"embed (text -> minilm), gpt2 and gpt2_static (decoder, continuous and static batching)")
        http, grpc = Endpoint(opts.http_url, "http"), Endpoint(opts.grpc_url, "grpc")
        with EmbeddingClient(http) as over, EmbeddingClient(grpc) as under:
            over_http, over_grpc = over.embed(SENTENCES), under.embed(SENTENCES)
        print(f"\nembed over HTTP: {over_http.shape[0]} texts -> {over_http.shape} {over_http.dtype}, "
              f"norms {[round(float(n), 4) for n in np.linalg.norm(over_http, axis=1)]}")
        print(f"embed over gRPC: same texts, max |HTTP - gRPC| = {np.abs(over_http - over_grpc).max():.2e}")
        print(f"first values of the first embedding: {[round(float(x), 4) for x in over_http[0, :6]]}")
        show_similarities(over_http)

        elapsed, delta = burst(grpc, args.requests, args.concurrency)
        print(f"\n{args.requests} single-text requests from {args.concurrency} threads in {elapsed:.2f} s "
              f"({args.requests / elapsed:.0f} requests/s)")
        print(f"minilm ran them in {delta.execution_count} executions: average batch {delta.avg_batch_size or 0:.1f} "
              f"(Triton's dynamic batcher at work; `python -m clients stats minilm` shows the sizes)")
        stream_generation(grpc, "continuous batching keeps the", 16)
        reports = [] if args.skip_envelope else envelope_demo(opts)
    print("server stopped.")
    print(how_to_call(opts))
    for report in reports:
        print(f"envelope report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The demo behind `make demo`: start the embedded Triton, send real requests over HTTP and gRPC,
show what came back and what the dynamic batcher did, then say how to call the server yourself."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from clients.model_spec import REPO_ROOT, load_spec
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

EMBED = load_spec("embed")
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


def embed(module, client, texts: list[str]) -> np.ndarray:
    data = np.array([[t.encode()] for t in texts], dtype=object)
    tensor = module.InferInput(EMBED.inputs[0].name, list(data.shape), EMBED.inputs[0].wire_dtype)
    tensor.set_data_from_numpy(data)
    return client.infer(EMBED.name, [tensor]).as_numpy(EMBED.outputs[0].name)


def model_stats(http_url: str, model: str) -> dict:
    with urllib.request.urlopen(f"http://{http_url}/v2/models/{model}/stats", timeout=5) as r:
        return json.load(r)["model_stats"][0]


def show_similarities(vectors: np.ndarray) -> None:
    print("\ncosine similarity (the embeddings are unit length, so this is a dot product):")
    width = max(len(s) for s in SENTENCES)
    for i, s in enumerate(SENTENCES):
        row = "  ".join(f"{vectors[i] @ vectors[j]:5.2f}" for j in range(len(SENTENCES)))
        print(f"  {s:<{width}}  {row}")


def burst(http_url: str, grpc_url: str, num_requests: int, concurrency: int) -> tuple[float, dict]:
    """Send single-text requests from many threads at once and return (seconds, minilm stats delta).
    gRPC, because its client may be shared between threads (the HTTP one is gevent-based)."""
    before = model_stats(http_url, "minilm")
    texts = [f"request number {i} about batching" for i in range(num_requests)]
    with grpcclient.InferenceServerClient(grpc_url) as client:
        start = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda t: embed(grpcclient, client, [t]), texts))
        elapsed = time.perf_counter() - start
    after = model_stats(http_url, "minilm")
    delta = {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in ("inference_count", "execution_count")}
    return elapsed, delta


def stream_generation(grpc_url: str, prompt: str, max_tokens: int) -> None:
    """Stream tokens from `gpt2` over gRPC and print them as they arrive."""
    import queue

    spec = load_spec("gpt2")
    values = {"text_input": [prompt.encode()], "max_tokens": [max_tokens], "ignore_eos": [True], "stream": [True]}
    inputs = []
    for name, value in values.items():
        array = np.array(value, dtype=spec.input(name).numpy_dtype)
        tensor = grpcclient.InferInput(name, list(array.shape), spec.input(name).wire_dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    arrived: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(grpc_url) as client:
        client.start_stream(callback=lambda result, error: arrived.put((time.perf_counter(), result, error)))
        sent = time.perf_counter()
        client.async_stream_infer("gpt2", inputs)
        print(f"\ngpt2 (continuous batching, random weights, so the words are noise), streamed over gRPC:\n  {prompt} ",
              end="", flush=True)
        times = []
        while True:
            at, result, error = arrived.get(timeout=120)
            if error is not None:
                raise error
            times.append(at - sent)
            print(result.as_numpy("text_output")[0].decode(), end="", flush=True)
            if result.get_response().parameters["triton_final_response"].bool_param:
                reason = result.as_numpy("finish_reason")[0].decode()
                break
        client.stop_stream()
    tpot = (times[-1] - times[0]) / max(len(times) - 1, 1)
    print(f"\n  {len(times)} tokens, finish reason {reason}: TTFT {1e3 * times[0]:.0f} ms, TPOT {1e3 * tpot:.0f} ms")


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
        with httpclient.InferenceServerClient(opts.http_url) as http, \
                grpcclient.InferenceServerClient(opts.grpc_url) as grpc:
            over_http = embed(httpclient, http, SENTENCES)
            over_grpc = embed(grpcclient, grpc, SENTENCES)
        print(f"\nembed over HTTP: {over_http.shape[0]} texts -> {over_http.shape} {over_http.dtype}, "
              f"norms {[round(float(n), 4) for n in np.linalg.norm(over_http, axis=1)]}")
        print(f"embed over gRPC: same texts, max |HTTP - gRPC| = {np.abs(over_http - over_grpc).max():.2e}")
        print(f"first values of the first embedding: {[round(float(x), 4) for x in over_http[0, :6]]}")
        show_similarities(over_http)

        elapsed, delta = burst(opts.http_url, opts.grpc_url, args.requests, args.concurrency)
        inferences, executions = delta["inference_count"], delta["execution_count"]
        print(f"\n{args.requests} single-text requests from {args.concurrency} threads in {elapsed:.2f} s "
              f"({args.requests / elapsed:.0f} requests/s)")
        print(f"minilm ran them in {executions} executions: average batch {inferences / max(executions, 1):.1f} "
              f"(Triton's dynamic batcher at work; see /v2/models/minilm/stats)")
        stream_generation(opts.grpc_url, "continuous batching keeps the", 16)
        reports = [] if args.skip_envelope else envelope_demo(opts)
    print("server stopped.")
    print(how_to_call(opts))
    for report in reports:
        print(f"envelope report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

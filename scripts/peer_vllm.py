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
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

MAX_MODEL_LEN = 1024  # GPT-2's positions
HEALTH_TIMEOUT_S = 300.0


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


def bind_all_cores() -> None:
    """vLLM's CPU default keeps one core for its scheduler, which halves throughput on 2 cores."""
    cores = sorted(os.sched_getaffinity(0))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"{cores[0]}-{cores[-1]}")
    progress(f"VLLM_CPU_OMP_THREADS_BIND={os.environ['VLLM_CPU_OMP_THREADS_BIND']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="Hugging Face checkpoint directory")
    p.add_argument("--workload", type=Path, required=True, help="workload JSON")
    p.add_argument("--out", type=Path, required=True, help="result JSON to write")
    p.add_argument("--mode", choices=("offline", "server"), default="offline")
    p.add_argument("--port", type=int, default=0, help="server mode: port for the API server (0: a free one)")
    args = p.parse_args()

    workload = load_workload(args.workload)
    bind_all_cores()
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

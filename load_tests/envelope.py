"""The latency/throughput envelope of one served model: a sweep of concurrency (closed loop) or of
arrival rate (open loop), each point held until stable, written out as CSV, JSON, PNG plots and an
HTML report, with the load that carries the most throughput under an SLO.

    python -m load_tests.envelope --model minilm --concurrency 1,8,32 --slo-p99-ms 200
    python -m load_tests.envelope --model gpt2 --rates 0.5,1,2 --max-tokens 16 --slo-ttft-p99-ms 500
"""
import locust  # noqa: F401  -- first: gevent must patch sockets and ssl before anything imports them

import argparse
import datetime
import json
import math
import os
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from load_tests.analysis import STABILITY_TOLERANCE, Slo, summarize_envelope
from load_tests.point import PointResult
from load_tests.point_loop import PointTiming, ServerAddress, run_point
from load_tests.report import verdicts, write_report
from load_tests.server_stats import fetch_metrics
from load_tests.users import EmbedGrpcUser, EmbedHttpUser, GenerateGrpcUser, GenerateSseUser, configured

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "bench_results" / "envelope"
DEFAULT_DURATION_S = 30.0
DEFAULT_WARMUP_S = 2.0
DEFAULT_WINDOW_S = 2.0
IDLE_TIMEOUT_S = 30.0
# (is generation, protocol) -> the Locust user that sends the model's requests
USERS = {(False, "http"): EmbedHttpUser, (False, "grpc"): EmbedGrpcUser,
         (True, "http"): GenerateSseUser, (True, "grpc"): GenerateGrpcUser}


class EnvelopeError(RuntimeError):
    """A sweep that cannot run or cannot go on; the message says why."""


@dataclass(frozen=True)
class EnvelopeConfig:
    model: str
    load_kind: str  # "concurrency" or "rate"
    loads: tuple[float, ...]
    url: str = "127.0.0.1:8000"  # Triton's HTTP HOST:PORT: HTTP load, model stats and config
    grpc_url: str | None = None  # default: the HTTP host, port 8001
    metrics_url: str | None = None  # default: http://HOST:8002/metrics
    protocol: str = "grpc"
    duration_s: float = DEFAULT_DURATION_S
    warmup_s: float = DEFAULT_WARMUP_S
    window_s: float = DEFAULT_WINDOW_S
    tolerance: float = STABILITY_TOLERANCE
    max_tokens: int | None = 16  # generation models only; None: each workload record's own
    max_in_flight: int | None = None  # open loop: users in the pool; default from the rate
    workload: Path | None = None  # a load_tests.workload file; default: one made in memory
    pin_arrivals: bool = False  # open loop: each window offers exactly the rate (variance reduction)
    slo: Slo = field(default_factory=Slo)
    out: Path = DEFAULT_OUT
    variant: str = ""

    def __post_init__(self):
        url = self.url.split("://", 1)[-1].rstrip("/")
        object.__setattr__(self, "url", url)
        host = url.rpartition(":")[0] or url
        if self.grpc_url is None:
            object.__setattr__(self, "grpc_url", f"{host}:8001")
        if self.metrics_url is None:
            object.__setattr__(self, "metrics_url", f"http://{host}:8002/metrics")
        if self.load_kind not in ("concurrency", "rate"):
            raise ValueError(f"load_kind must be 'concurrency' or 'rate', got {self.load_kind!r}")
        if not self.loads or any(x <= 0 for x in self.loads):
            raise ValueError(f"--concurrency/--rates must be positive numbers, got {list(self.loads)}")
        if self.load_kind == "concurrency" and any(x != int(x) for x in self.loads):
            raise ValueError(f"--concurrency takes whole numbers of users, got {list(self.loads)}")
        if self.protocol not in ("http", "grpc"):
            raise ValueError(f"--protocol must be http or grpc, got {self.protocol!r}")
        if self.window_s <= 0 or self.warmup_s < 0:
            raise ValueError(f"--window must be > 0 and --warmup >= 0, got {self.window_s} and {self.warmup_s}")
        _ = self.timing  # PointTiming refuses a duration without room for the windows that stability needs
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError(f"--max-in-flight must be >= 1, got {self.max_in_flight}")

    @property
    def timing(self) -> PointTiming:
        return PointTiming(self.duration_s, self.warmup_s, self.window_s, self.tolerance)

    @property
    def load_url(self) -> str:
        return f"http://{self.url}" if self.protocol == "http" else self.grpc_url

    def users_for(self, load: float, is_generation: bool) -> tuple[type, int]:
        """The configured user class and how many users one point runs: `load` users in closed
        loop; in open loop a pool (the in-flight cap) that the arrivals are handed to."""
        settings = {"model": self.model, "workload": self.workload}
        if is_generation:
            settings["max_tokens"] = self.max_tokens
        if self.load_kind == "concurrency":
            return configured(USERS[is_generation, self.protocol], **settings), int(load)
        # Little's law: rate x 2 s covers latencies up to 2 s before arrivals wait for a free user
        # (they are counted as cap hits, and their latency still runs from the scheduled time).
        count = self.max_in_flight or min(256, max(8, math.ceil(2.0 * load) + 4))
        # Unpinned by default: the count's own variance is part of the load that queueing and p99
        # answer to. Pinned per measurement window (opt-in), each window offers exactly the rate, so
        # the stability rule sees less noise at low rates, at the price of understating queueing.
        settings |= {"arrival_rate": load, "arrival_window_s": self.window_s if self.pin_arrivals else 0.0}
        return configured(USERS[is_generation, self.protocol], **settings), count

    def settings(self) -> dict:
        d = asdict(self)
        d["slo"] = self.slo.describe() if self.slo.is_set else "none"
        d["out"] = str(self.out)
        d["loads"] = list(self.loads)
        return d


@dataclass
class EnvelopeRun:
    points: list[PointResult]
    paths: dict[str, Path]
    findings: list[str]


def model_config(http_url: str, model: str) -> dict:
    """The served config, which also proves the model is there and ready before any load."""
    try:
        with urllib.request.urlopen(f"http://{http_url}/v2/models/{model}/ready", timeout=5):
            pass
        with urllib.request.urlopen(f"http://{http_url}/v2/models/{model}/config", timeout=5) as r:
            return json.load(r)
    except OSError as e:
        raise EnvelopeError(f"model {model!r} is not ready at http://{http_url} ({e}): is the server "
                            f"running (python scripts/serve.py) and the name right?") from e


def check_metrics(cfg: EnvelopeConfig) -> None:
    try:
        fetch_metrics(cfg.metrics_url, cfg.model)
    except OSError as e:
        raise EnvelopeError(f"Triton's metrics are not reachable at {cfg.metrics_url} ({e}): "
                            f"pass --metrics-url") from e


def wait_until_idle(cfg: EnvelopeConfig, timeout_s: float = IDLE_TIMEOUT_S) -> None:
    """Let requests left over from the last point finish, so the next point starts on an idle server."""
    busy = ("nv_inference_pending_request_count", "batchwise_running_sequences", "batchwise_waiting_sequences")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        metrics = fetch_metrics(cfg.metrics_url, cfg.model)
        if not any(metrics.get(name, 0) > 0 for name in busy):
            return
        time.sleep(0.2)


def _progress(index: int, total: int, cfg: EnvelopeConfig, load: float, sweep_start: float):
    unit = "users" if cfg.load_kind == "concurrency" else "req/s offered"

    def on_window(k, window, elapsed_s):
        p99 = "-" if window.p99_ms is None else f"{window.p99_ms:.1f} ms"
        print(f"  point {index}/{total}  {load:g} {unit}  window {k}  {elapsed_s:5.1f} s "
              f"(sweep {time.monotonic() - sweep_start:5.1f} s)  {window.throughput_rps:7.1f} req/s  "
              f"p99 {p99}  errors {window.num_errors}", flush=True)
    return on_window


def run_envelope(cfg: EnvelopeConfig) -> EnvelopeRun:
    config = model_config(cfg.url, cfg.model)
    check_metrics(cfg)
    is_generation = bool(config.get("model_transaction_policy", {}).get("decoupled"))
    timing = cfg.timing
    server = ServerAddress(cfg.url, cfg.metrics_url, cfg.model)
    points: list[PointResult] = []
    settings = {"started": datetime.datetime.now().isoformat(timespec="seconds"), "cpus": os.cpu_count(),
                "generation": is_generation} | cfg.settings()
    sweep_start = time.monotonic()
    print(f"envelope of {cfg.model} ({'generation' if is_generation else 'embedding'}, {cfg.protocol}), "
          f"{cfg.load_kind} {', '.join(f'{x:g}' for x in cfg.loads)}: up to {cfg.duration_s:g} s per point",
          flush=True)
    for index, load in enumerate(cfg.loads, start=1):
        user_class, user_count = cfg.users_for(load, is_generation)
        wait_until_idle(cfg)
        point, first_error = run_point(user_class, user_count, cfg.load_kind, load, timing, server, cfg.load_url,
                                       _progress(index, len(cfg.loads), cfg, load, sweep_start))
        point.variant = cfg.variant
        if point.requests == 0 and point.errors > 0:
            raise EnvelopeError(f"every request of point {index} failed; the first: {first_error}")
        print(f"  -> {'stable' if point.is_stable else 'NOT stable'} after {point.num_windows} windows: "
              f"{point.throughput_rps:.1f} req/s, p50 {_ms(point.p50_ms)}, p99 {_ms(point.p99_ms)}, "
              f"errors {point.errors}, client CPU {point.client_cpu_fraction or 0:.2f}", flush=True)
        points.append(point)
    paths = write_report(cfg.out, settings, points, cfg.slo, cfg.tolerance)
    return EnvelopeRun(points, paths, verdicts(points, summarize_envelope(points, cfg.slo), cfg.tolerance))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def _numbers(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None


def parse_args(argv=None) -> EnvelopeConfig:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the served model, e.g. minilm, embed, gpt2")
    loads = p.add_mutually_exclusive_group(required=True)
    loads.add_argument("--concurrency", type=_numbers, help="closed loop: users per point, e.g. 1,8,32")
    loads.add_argument("--rates", type=_numbers, help="open loop: Poisson arrivals per second, e.g. 10,50,100")
    p.add_argument("--url", default=EnvelopeConfig.url, help="Triton's HTTP HOST:PORT (default %(default)s)")
    p.add_argument("--grpc-url", help="Triton's gRPC HOST:PORT (default: the --url host, port 8001)")
    p.add_argument("--metrics-url", help="Triton's metrics URL (default: http://<--url host>:8002/metrics)")
    p.add_argument("--protocol", choices=("grpc", "http"), default=EnvelopeConfig.protocol)
    p.add_argument("--duration", type=float, default=DEFAULT_DURATION_S,
                   help="seconds per point, warm-up included: a point runs at most the whole windows that fit")
    p.add_argument("--warmup", type=float, default=DEFAULT_WARMUP_S, help="seconds discarded at the start of a point")
    p.add_argument("--window", type=float, default=DEFAULT_WINDOW_S, help="seconds per measurement window")
    p.add_argument("--max-tokens", type=int, help="generation: tokens per request (default: each --workload "
                   f"record's own; {EnvelopeConfig.max_tokens} without a workload file)")
    p.add_argument("--max-in-flight", type=int, help="open loop: users in the pool (default: 2 s of arrivals + 4)")
    p.add_argument("--pin-arrivals", action="store_true",
                   help="open loop, variance reduction: each window offers exactly the rate (the Poisson count's "
                        "noise removed, so queueing and p99 are understated); default: unpinned Poisson arrivals")
    p.add_argument("--workload", type=Path,
                   help="a workload file (python -m load_tests.workload); default: made in memory")
    p.add_argument("--slo-p99-ms", type=float, help="latency budget at p99 (end to end)")
    p.add_argument("--slo-ttft-p99-ms", type=float, help="generation: time to first token budget at p99")
    p.add_argument("--slo-tpot-p99-ms", type=float, help="generation: time per output token budget at p99")
    p.add_argument("--max-error-rate", type=float, default=0.0, help="errors a point may have and meet the SLO")
    p.add_argument("--out", type=Path, help=f"output folder (default {DEFAULT_OUT}/<model>)")
    a = p.parse_args(argv)
    try:
        return EnvelopeConfig(
            model=a.model, load_kind="concurrency" if a.concurrency else "rate", loads=a.concurrency or a.rates,
            url=a.url, grpc_url=a.grpc_url, metrics_url=a.metrics_url, protocol=a.protocol, duration_s=a.duration,
            warmup_s=a.warmup, window_s=a.window, max_in_flight=a.max_in_flight,
            max_tokens=a.max_tokens if a.max_tokens is not None else None if a.workload else EnvelopeConfig.max_tokens,
            workload=a.workload, pin_arrivals=a.pin_arrivals, out=a.out or DEFAULT_OUT / a.model,
            slo=Slo(a.slo_p99_ms, a.slo_ttft_p99_ms, a.slo_tpot_p99_ms, a.max_error_rate))
    except ValueError as e:
        p.error(str(e))


def main(argv=None) -> int:
    cfg = parse_args(argv)
    try:
        run = run_envelope(cfg)
    except EnvelopeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("\n" + "\n".join(run.findings))
    print(f"report: {run.paths['html']}\n  data: {run.paths['csv']}, {run.paths['json']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

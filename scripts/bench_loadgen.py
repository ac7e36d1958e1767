"""The load generator's ceiling: requests/s that one Locust process drives over HTTP against a trivial
model (load_tests/models/echo: text in, the same text out) served by the embedded Triton on the same
machine. The users are load_tests.users.EmbedHttpUser, closed loop, exactly as the locustfiles run
them; Locust runs in this process. Prints a table and writes bench_results/loadgen.json (the median
of the repeats by requests/s, and every repeat).

    python scripts/bench_loadgen.py [--users 32] [--warmup 5] [--duration 20] [--repeats 3]
"""
# Locust's gevent monkey-patching must come before anything else imports the network stack.
import locust  # noqa: F401  isort: skip

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gevent
import psutil
from locust.env import Environment

from clients.model_spec import load_spec
from load_tests.users import EmbedHttpUser, configured
from scripts.bench_record import machine
from scripts.serve import EmbeddedServer, options_on_free_ports
from scripts.variants import load_config, write_repository

REPO_ROOT = Path(__file__).resolve().parent.parent
LOADGEN_MODELS = REPO_ROOT / "load_tests" / "models"
RESULTS = REPO_ROOT / "bench_results" / "loadgen.json"
MODEL = "echo"


def server_cpu_s(server: EmbeddedServer) -> float:
    """CPU seconds of tritonserver and its Python backend stubs."""
    proc = psutil.Process(server.process.pid)
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def run_once(user_class, num_users: int, warmup_s: float, duration_s: float, server: EmbeddedServer) -> dict:
    env = Environment(user_classes=[user_class], host=user_class.host)
    runner = env.create_local_runner()
    runner.start(num_users, spawn_rate=num_users)
    gevent.sleep(warmup_s)
    env.stats.reset_all()
    cpu0, server_cpu0, t0 = time.process_time(), server_cpu_s(server), time.perf_counter()
    gevent.sleep(duration_s)
    total, elapsed = env.stats.total, time.perf_counter() - t0
    record = {
        "requests": total.num_requests,
        "failures": total.num_failures,
        "requests_per_s": total.num_requests / elapsed,
        "p50_ms": total.get_response_time_percentile(0.5),
        "p99_ms": total.get_response_time_percentile(0.99),
        "locust_cpu_cores": (time.process_time() - cpu0) / elapsed,
        "server_cpu_cores": (server_cpu_s(server) - server_cpu0) / elapsed,
        "duration_s": elapsed,
    }
    runner.quit()
    return record


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--users", type=int, default=32, help="concurrent Locust users (closed loop)")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds before measuring")
    p.add_argument("--duration", type=float, default=20.0, help="seconds measured per repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="batchwise-loadgen-") as tmp:
        repo = write_repository(Path(tmp) / "repo", {MODEL: load_config(MODEL, LOADGEN_MODELS)}, source=LOADGEN_MODELS)
        with EmbeddedServer(options_on_free_ports(repo)) as server:
            user_class = configured(EmbedHttpUser, model=MODEL, spec=load_spec(MODEL, LOADGEN_MODELS),
                                    host=f"http://{server.opts.http_url}")
            print(f"{'repeat':>6s} {'req/s':>9s} {'failures':>9s} {'p50 ms':>7s} {'p99 ms':>7s} "
                  f"{'locust cores':>13s} {'server cores':>13s}", flush=True)
            for i in range(args.repeats):
                r = run_once(user_class, args.users, args.warmup, args.duration, server)
                runs.append(r)
                print(f"{i + 1:6d} {r['requests_per_s']:9.1f} {r['failures']:9d} {r['p50_ms']:7.1f} {r['p99_ms']:7.1f} "
                      f"{r['locust_cpu_cores']:13.2f} {r['server_cpu_cores']:13.2f}", flush=True)
    median = sorted(runs, key=lambda r: r["requests_per_s"])[len(runs) // 2]
    print(f"median: {median['requests_per_s']:.0f} requests/s from one Locust process "
          f"({median['locust_cpu_cores']:.2f} cores), {median['failures']} failures, "
          f"p50 {median['p50_ms']:.0f} ms, p99 {median['p99_ms']:.0f} ms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "loadgen", "model": MODEL, "protocol": "http", "users": args.users,
        "warmup_s": args.warmup, "duration_s": args.duration, "repeats": args.repeats,
        "median": median, "runs": runs, "command": " ".join(["python", *sys.argv]),
        "machine": {**machine(), "locust": locust.__version__},
    }, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

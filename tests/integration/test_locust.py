"""The locustfiles, run headless as `python -m locust` against the session's embedded Triton: each
one for a few seconds with no failures; one with two worker processes; and the open-loop check that
at a rate well below saturation the achieved rate is the target."""
import csv
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCUSTFILES = REPO / "load_tests" / "locustfiles"


def run_locust(locustfile: str, host: str, csv_prefix: Path, *args: str, users: int = 2, seconds: int = 4,
               timeout_s: float = 60) -> dict[str, list[dict]]:
    """Run one headless Locust; return its CSV files (Locust's stats and ours) by suffix."""
    command = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILES / locustfile), "--headless",
               "-u", str(users), "-r", str(users), "-t", f"{seconds}s", "--host", host,
               "--csv", str(csv_prefix), "--only-summary", "--stop-timeout", "5", *args]
    with subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as locust:
        try:
            _, stderr = locust.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            locust.kill()
            _, stderr = locust.communicate()
            pytest.fail(f"locust did not end within {timeout_s} s:\n{stderr[-3000:]}")
    assert locust.returncode == 0, f"locust exited with {locust.returncode}:\n{stderr[-3000:]}"
    tables = {}
    for suffix in ("stats", "failures", "tokens", "open_loop"):
        path = Path(f"{csv_prefix}_{suffix}.csv")
        if path.is_file():
            with open(path) as f:
                tables[suffix] = list(csv.DictReader(f))
    return tables


def aggregated(tables) -> dict:
    (row,) = [r for r in tables["stats"] if r["Name"] == "Aggregated"]
    return row


@pytest.mark.parametrize("locustfile, protocol, args", [
    ("embed_http.py", "http", ()),
    ("embed_http.py", "http", ("--model", "minilm")),
    ("embed_grpc.py", "grpc", ()),
    ("generate_grpc.py", "grpc", ("--max-tokens", "2")),
    ("generate_sse.py", "http", ("--max-tokens", "2")),
])
def test_a_locustfile_runs_headless_without_failures(server, tmp_path, locustfile, protocol, args):
    host = f"http://{server.opts.http_url}" if protocol == "http" else server.opts.grpc_url
    tables = run_locust(locustfile, host, tmp_path / "run", *args)
    total = aggregated(tables)
    assert int(total["Request Count"]) > 0 and int(total["Failure Count"]) == 0, tables["failures"]
    if locustfile.startswith("generate"):
        (tokens,) = tables["tokens"]
        assert int(tokens["requests"]) > 0 and int(tokens["output_tokens"]) == 2 * int(tokens["requests"])
        assert float(tokens["ttft_p50_ms"]) > 0
        # token stats stay out of Locust's request counts: one row, one entry per request
        assert [r["Name"] for r in tables["stats"]] == ["gpt2", "Aggregated"]


def test_worker_processes_split_an_open_loop_rate(server, tmp_path):
    tables = run_locust("embed_grpc.py", f"grpc://{server.opts.grpc_url}", tmp_path / "run", "--processes", "2",
                        "--arrival-rate", "10", users=4, seconds=5)
    assert int(aggregated(tables)["Request Count"]) > 0 and int(aggregated(tables)["Failure Count"]) == 0
    (open_loop,) = tables["open_loop"]
    assert float(open_loop["target_rate_per_s"]) == pytest.approx(10.0)  # 5 + 5 from the two workers
    assert int(open_loop["num_users"]) == 4 and int(open_loop["sent"]) > 0


def test_open_loop_achieves_the_target_rate_below_saturation(server, tmp_path):
    """20 requests/s to `embed` (which serves over 100/s here): the dispatcher must send at the
    target rate, counted over the schedule's whole windows, whatever the server's latency."""
    tables = run_locust("embed_http.py", f"http://{server.opts.http_url}", tmp_path / "run",
                        "--arrival-rate", "20", "--arrival-seed", "1", users=16, seconds=12)
    (open_loop,) = tables["open_loop"]
    achieved, measured_s = float(open_loop["achieved_rate_per_s"]), float(open_loop["measured_s"])
    assert measured_s >= 5.0
    assert achieved == pytest.approx(20.0, rel=0.02), open_loop
    total = aggregated(tables)
    assert int(total["Failure Count"]) == 0
    # every request sent was answered and counted once (those in flight at the stop excepted)
    assert int(open_loop["sent"]) - 16 <= int(total["Request Count"]) <= int(open_loop["sent"])

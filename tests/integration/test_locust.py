"""The locustfiles, run headless as `python -m locust` against the session's embedded Triton: each
one for a few seconds with no failures; one with two worker processes; the open-loop check that at a
rate well below saturation the dispatcher sends the seeded schedule it drew, on time; and the SSE
user's refusal of a priority that HTTP cannot carry."""
import csv
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from load_tests.arrivals import ArrivalProcess

REPO = Path(__file__).resolve().parents[2]
LOCUSTFILES = REPO / "load_tests" / "locustfiles"


def run_locust(locustfile: str, host: str, csv_prefix: Path, *args: str, users: int = 2, seconds: int = 4,
               timeout_s: float = 60, expect_returncode: int = 0) -> dict[str, list[dict]]:
    """Run one headless Locust; return its CSV files (Locust's stats and ours) by suffix, and its
    stderr under "stderr"."""
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
    assert locust.returncode == expect_returncode, f"locust exited with {locust.returncode}:\n{stderr[-3000:]}"
    tables = {}
    for suffix in ("stats", "failures", "tokens", "open_loop"):
        path = Path(f"{csv_prefix}_{suffix}.csv")
        if path.is_file():
            with open(path) as f:
                tables[suffix] = list(csv.DictReader(f))
    tables["stderr"] = stderr
    return tables


def aggregated(tables) -> dict:
    (row,) = [r for r in tables["stats"] if r["Name"] == "Aggregated"]
    return row


@pytest.mark.parametrize("locustfile, protocol, args", [
    ("embed_http.py", "http", ()),
    ("embed_http.py", "http", ("--model", "minilm")),
    ("embed_grpc.py", "grpc", ()),
    ("generate_grpc.py", "grpc", ("--max-tokens", "2", "--priority", "1")),  # priority travels over gRPC
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


def test_open_loop_sends_the_drawn_schedule_on_time_below_saturation(server, tmp_path):
    """20 requests/s to `embed` (which serves over 100/s here), unpinned Poisson arrivals, seed 1.

    What is checked is the dispatcher: that it sent the schedule it drew, on time, whatever the
    server's latency. The achieved rate is compared with the rate of that drawn schedule, not with
    the target: an unpinned Poisson count over 12 s (about 240 arrivals) differs from 20/s by its own
    noise (±6.5 %, 1 sd), and pinning the count per window to make "achieved within 2 % of the
    target" hold would make it hold by construction of the schedule while hiding the variance that
    open loop exists to offer. So: the dispatcher counted exactly the seeded arrivals due before it
    stopped, sent every one of them (those due in its last 0.1 s excepted) for an achieved rate
    within 2 % of the schedule's, none waited for a user and few were late; and the drawn
    schedule's own rate is near the target only within 4 standard deviations of a Poisson count,
    which is all that its seed promises."""
    tables = run_locust("embed_http.py", f"http://{server.opts.http_url}", tmp_path / "run",
                        "--arrival-rate", "20", "--arrival-seed", "1", users=16, seconds=12)
    (open_loop,) = tables["open_loop"]
    scheduled, sent, elapsed_s = int(open_loop["scheduled"]), int(open_loop["sent"]), float(open_loop["elapsed_s"])
    assert elapsed_s >= 10.0 and float(open_loop["measured_s"]) == pytest.approx(elapsed_s)
    # the same seeded schedule, drawn here: every arrival due before the stop, give or take those due
    # while the dispatcher was catching up at the very end
    drawn = ArrivalProcess(20.0, seed=1).sample(2 * scheduled + 50)
    assert np.sum(drawn < elapsed_s - 0.25) <= scheduled <= np.sum(drawn <= elapsed_s), open_loop
    # sent on time: every arrival due before the last 0.1 s went out (a dispatcher that fell behind
    # would leave scheduled arrivals unsent), and none waited for a free user
    assert np.sum(drawn <= elapsed_s - 0.1) <= sent <= scheduled and int(open_loop["cap_hits"]) == 0, open_loop
    assert int(open_loop["late"]) <= 0.05 * sent and float(open_loop["max_late_ms"]) < 500.0, open_loop
    scheduled_rate, achieved = float(open_loop["scheduled_rate_per_s"]), float(open_loop["achieved_rate_per_s"])
    assert achieved == pytest.approx(scheduled_rate, rel=0.02), open_loop  # the 2 %, against the schedule
    expected = 20.0 * elapsed_s
    assert abs(scheduled - expected) <= 4 * math.sqrt(expected), open_loop
    total = aggregated(tables)
    assert int(total["Failure Count"]) == 0
    # every request sent was answered and counted once (those in flight at the stop excepted)
    assert int(open_loop["sent"]) - 16 <= int(total["Request Count"]) <= int(open_loop["sent"])


def test_the_sse_user_refuses_a_priority_at_start(server, tmp_path):
    """HTTP's generate endpoint cannot carry Triton's priority: the users stop at start with a
    message that says so, instead of running the test without it."""
    tables = run_locust("generate_sse.py", f"http://{server.opts.http_url}", tmp_path / "run", "--priority", "1",
                        "--max-tokens", "2", seconds=2, expect_returncode=1)
    assert "priority 1 cannot be sent over HTTP's generate endpoint" in tables["stderr"]
    assert int(aggregated(tables)["Request Count"]) == 0

"""The envelope against the real embedded Triton: a short sweep of three points writes every
artefact, with client and server figures in it. Run as a separate process, as a user runs it:
Locust's gevent patching must come before anything imports ssl, and must not reach this process."""
import csv
import json
import subprocess
import sys

import pytest

from clients.model_spec import REPO_ROOT

pytestmark = pytest.mark.integration


def run_envelope(server, out, *args, timeout_s=120):
    opts = server.opts
    cmd = [sys.executable, "-m", "load_tests.envelope", "--url", opts.http_url, "--grpc-url", opts.grpc_url,
           "--metrics-url", opts.metrics_url, "--out", str(out), *args]
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s, check=False)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_three_point_envelope_writes_every_artefact(server, tmp_path):
    out = tmp_path / "minilm"
    # exactly the warm-up and 3 windows: each point must get all 3 (the stats fetches between windows
    # take time, and must not cost the third)
    stdout = run_envelope(server, out, "--model", "minilm", "--concurrency", "1,2,4", "--duration", "5.5",
                          "--warmup", "1", "--window", "1.5", "--slo-p99-ms", "2000")
    for name in ("points.csv", "envelope.json", "latency_vs_throughput.png", "throughput_vs_load.png", "report.html"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert "point 1/3" in stdout and "point 3/3" in stdout and f"report: {out / 'report.html'}" in stdout

    rows = list(csv.DictReader((out / "points.csv").read_text().splitlines()))
    assert [float(r["load"]) for r in rows] == [1.0, 2.0, 4.0]
    for r in rows:
        assert int(r["requests"]) > 0 and int(r["errors"]) == 0 and int(r["num_windows"]) == 3
        assert float(r["p50_ms"]) <= float(r["p99_ms"])
        assert float(r["avg_batch_size"]) >= 1.0 and float(r["avg_compute_us"]) > 0  # the server's side
        assert 0 < float(r["client_cpu_fraction"]) < 2
    record = json.loads((out / "envelope.json").read_text())
    assert record["settings"]["model"] == "minilm" and record["settings"]["generation"] is False
    # a 2 s budget that concurrency 1 meets on any machine that serves minilm at all
    assert record["summary"]["best_load"] is not None
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "Settings" in page


def test_generation_envelope_reports_ttft_and_tokens(server, tmp_path):
    out = tmp_path / "gpt2"
    run_envelope(server, out, "--model", "gpt2", "--concurrency", "1,2", "--duration", "6", "--warmup", "1",
                 "--window", "1.5", "--max-tokens", "4")
    rows = list(csv.DictReader((out / "points.csv").read_text().splitlines()))
    assert len(rows) == 2
    for r in rows:
        assert int(r["requests"]) > 0
        assert 0 < float(r["ttft_p50_ms"]) <= float(r["p99_ms"])
        assert float(r["output_tokens_per_s"]) > 0 and float(r["engine_batch_size"]) >= 1


def test_open_loop_point_runs_unpinned_arrivals(server, tmp_path):
    out = tmp_path / "rate"
    run_envelope(server, out, "--model", "minilm", "--rates", "20", "--duration", "4", "--warmup", "1",
                 "--window", "1")
    (row,) = list(csv.DictReader((out / "points.csv").read_text().splitlines()))
    assert row["load_kind"] == "rate" and int(row["requests"]) > 0 and int(row["errors"]) == 0
    record = json.loads((out / "envelope.json").read_text())
    assert record["settings"]["pin_arrivals"] is False


def test_unknown_model_fails_fast_with_a_clear_message(server, tmp_path):
    opts = server.opts
    done = subprocess.run([sys.executable, "-m", "load_tests.envelope", "--url", opts.http_url, "--model", "nope",
                           "--concurrency", "1", "--out", str(tmp_path)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 1 and "model 'nope' is not ready" in done.stderr

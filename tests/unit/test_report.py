"""The report's numbers against a hand-made CSV: every artefact is written, and the CSV round-trips,
the JSON and the HTML say what the hand-worked analysis says."""
import json
from pathlib import Path

import pytest

from load_tests.analysis import Slo, summarize_envelope
from load_tests.report import read_csv, render_html, verdicts, write_csv, write_report

HAND_MADE = """\
load_kind,load,duration_s,requests,errors,throughput_rps,p50_ms,p90_ms,p95_ms,p99_ms,is_stable,num_windows,\
avg_batch_size,client_cpu_fraction,is_client_bound
concurrency,1,6,300,0,50,18,19,19.5,20,true,3,1.0,0.20,false
concurrency,8,6,1200,0,200,35,40,42,45,true,3,3.5,0.40,false
concurrency,32,6,1800,0,300,90,100,105,110,false,5,7.9,0.55,false
concurrency,64,6,1860,12,310,180,300,400,500,true,3,8.0,0.93,true
"""


@pytest.fixture
def points(tmp_path):
    path = tmp_path / "hand.csv"
    path.write_text(HAND_MADE)
    return read_csv(path)


def test_hand_made_csv_is_read_with_types_and_defaults(points):
    assert [p.load for p in points] == [1.0, 8.0, 32.0, 64.0]
    p = points[3]
    assert (p.requests, p.errors, p.is_stable, p.is_client_bound) == (1860, 12, True, True)
    assert p.p99_ms == 500.0 and p.ttft_p99_ms is None and p.variant == ""
    assert p.error_rate == pytest.approx(12 / 1872)


def test_csv_round_trips(points, tmp_path):
    again = read_csv(write_csv(points, tmp_path / "again.csv"))
    assert again == points


def test_unknown_columns_are_refused(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("load_kind,load,p99\nconcurrency,1,3\n")
    with pytest.raises(ValueError, match="p99"):
        read_csv(path)


def test_report_numbers_match_the_hand_worked_analysis(points, tmp_path):
    settings = {"model": "minilm", "mode": "closed loop", "duration_s": 6}
    paths = write_report(tmp_path / "out", settings, points, Slo(p99_ms=150))
    for kind in ("csv", "json", "latency_png", "throughput_png", "html"):
        assert paths[kind].is_file() and paths[kind].stat().st_size > 0, kind
    assert paths["latency_png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    record = json.loads(paths["json"].read_text())
    # By hand, scaled to [0, 1]: throughput 0, .58, .96, 1; p99 0, .05, .19, 1. Farthest below the
    # chord y = x is c=32 (.96 - .19); the SLO (p99 <= 150 ms, no errors) admits c=1, 8 and the
    # unstable c=32, so the stable c=8 (200 req/s) wins.
    assert record["summary"]["knee_load"] == 32.0
    assert record["summary"]["best_load"] == 8.0
    assert record["summary"]["unstable_loads"] == [32.0]
    assert record["summary"]["client_bound_loads"] == [64.0]
    assert record["settings"] == settings
    assert [p["p99_ms"] for p in record["points"]] == [20.0, 45.0, 110.0, 500.0]

    page = paths["html"].read_text()
    assert "knee at c=32: 300.0 req/s, p99 110.0 ms" in page
    assert "most throughput under the SLO (latency p99 &lt;= 150 ms, errors &lt;= 0 %): c=8, 200.0 req/s" in page
    assert "never stabilised" in page and "WARNING: the load generator was CPU-bound" in page
    assert page.count("data:image/png;base64,") == 2
    assert "<td>500.0</td>" in page and "<td>7.9</td>" in page  # p99 and batch size of c=64 and c=32
    assert "<tr class=best>" in page


def test_the_unstable_verdict_names_the_configured_tolerance(points):
    summary = summarize_envelope(points, Slo())
    assert any("apart by more than 10 %): c=32" in line for line in verdicts(points, summary))
    page = render_html({"model": "m"}, points, summary, [], tolerance=0.05)
    assert "last 3 windows apart by more than 5 %): c=32" in page and "10 %" not in page


def test_no_slo_and_no_point_meeting_it_are_said(points):
    without = render_html({"model": "m"}, points, summarize_envelope(points, Slo()), [])
    assert "under the SLO" not in without
    unmet = render_html({"model": "m"}, points, summarize_envelope(points, Slo(p99_ms=5)), [])
    assert "no point meets the SLO" in unmet


def test_generation_points_get_ttft_and_tpot_panels(tmp_path):
    path = tmp_path / "gen.csv"
    path.write_text("load_kind,load,duration_s,requests,errors,throughput_rps,p50_ms,p90_ms,p95_ms,p99_ms,"
                    "is_stable,num_windows,output_tokens_per_s,ttft_p50_ms,ttft_p99_ms,tpot_p50_ms,tpot_p99_ms\n"
                    "rate,1,10,10,0,1,900,950,960,990,true,3,16,80,95,50,55\n"
                    "rate,2,10,20,0,2,1000,1100,1150,1190,true,3,32,90,120,58,61\n")
    paths = write_report(tmp_path / "gen", {"model": "gpt2"}, read_csv(path), Slo(ttft_p99_ms=100))
    page = paths["html"].read_text()
    assert "TTFT p99" in page and "tok/s" in page
    assert "most throughput under the SLO (TTFT p99 &lt;= 100 ms, errors &lt;= 0 %): 1/s" in page
    assert json.loads(Path(paths["json"]).read_text())["summary"]["best_load"] == 1.0

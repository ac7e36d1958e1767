"""The config sweep end to end on two tiny variants of minilm: each one served by its own embedded
Triton from a temporary repository, measured, and compared; the checked-in config stays as it was.
And a variant of embed, served beside the minilm that it calls."""
import json
import subprocess
import sys

import pytest

from clients.model_spec import MODEL_REPOSITORY, REPO_ROOT, parse_config

pytestmark = pytest.mark.integration


def test_two_variant_sweep_writes_frontier_and_recommendation(tmp_path):
    checked_in = (MODEL_REPOSITORY / "minilm" / "config.pbtxt").read_text()
    out = tmp_path / "sweep"
    cmd = [sys.executable, "scripts/sweep.py", "--model", "minilm", "--concurrency", "2", "--duration", "4",
           "--warmup", "0.5", "--window", "1", "--batch-window-us", "0,2000", "--slo-p99-ms", "10000",
           "--out", str(out)]
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"

    record = json.loads((out / "sweep.json").read_text())
    assert [v["name"] for v in record["variants"]] == ["win0", "win2000"]
    assert record["frontier"] and record["recommended"]["variant"] in ("win0", "win2000")
    for name in ("win0", "win2000"):
        assert (out / "variants" / name / "report.html").is_file()
    assert len((out / "variants.csv").read_text().splitlines()) == 1 + 2
    config = parse_config((out / "recommended_config.pbtxt").read_text())
    window = config.dynamic_batching.max_queue_delay_microseconds
    assert config.name == "minilm" and window == int(record["recommended"]["variant"].removeprefix("win"))
    assert (out / "frontier.png").read_bytes()[:4] == b"\x89PNG"
    assert (MODEL_REPOSITORY / "minilm" / "config.pbtxt").read_text() == checked_in


def test_a_model_is_swept_beside_the_models_it_calls(tmp_path):
    out = tmp_path / "sweep"
    cmd = [sys.executable, "scripts/sweep.py", "--model", "embed", "--concurrency", "2", "--duration", "4",
           "--warmup", "0.5", "--window", "1", "--batch-window-us", "1000", "--out", str(out)]
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    record = json.loads((out / "sweep.json").read_text())
    assert record["variants"] == [{"name": "win1000", "settings": {"batch_window_us": 1000}, "status": "measured"}]
    assert record["failed"] == [] and record["frontier"][0]["errors"] == 0

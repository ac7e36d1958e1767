"""The config sweep without a server: variants rendered whole (the checked-in config untouched),
combinations that would be refused skipped, a failing variant recorded while the others go on, and
the frontier, recommendation and files it writes."""
import json

import pytest

from clients.model_spec import parse_config
from load_tests.analysis import Slo
from load_tests.point import PointResult
from scripts.sweep_report import VariantFailure, measure_variants, recommended_text, write_sweep
from scripts.sweep_variants import variant_grid
from scripts.variants import load_config


def test_batcher_grid_renders_every_combination_and_skips_refused_ones():
    checked_in = load_config("minilm")
    before = checked_in.SerializeToString()
    variants, skipped = variant_grid(checked_in, "minilm", max_batch_size=[4, 32], batch_window_us=[0, 2000],
                                     preferred_batch_sizes=[[8, 16], []])
    # max_batch_size 4 with preferred sizes 8, 16 would be refused by Triton: two of eight skipped
    assert len(variants) == 6 and len(skipped) == 2 and all("exceed max_batch_size 4" in s for s in skipped)
    v = next(v for v in variants if v.settings == {"max_batch_size": 4, "preferred_batch_sizes": [],
                                                   "batch_window_us": 0})
    assert v.name == "mbs4_prefnone_win0"
    assert v.config.max_batch_size == 4 and list(v.config.dynamic_batching.preferred_batch_size) == []
    assert v.config.dynamic_batching.max_queue_delay_microseconds == 0
    assert v.config.dynamic_batching.priority_levels == 2  # the rest is the checked-in config
    assert checked_in.SerializeToString() == before


def test_max_batch_size_zero_is_batching_off():
    variants, skipped = variant_grid(load_config("minilm"), "minilm", max_batch_size=[0, 32],
                                     batch_window_us=[0, 2000])
    off = [v for v in variants if v.settings["max_batch_size"] == 0]
    assert len(off) == 1 and len(skipped) == 1 and "turns the dynamic batcher off" in skipped[0]
    config = off[0].config
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    assert all(t.dims[0] == -1 for t in config.input)  # the batch axis is part of each tensor now


def test_engine_grid_sets_parameters_and_checks_them_with_the_engine():
    variants, skipped = variant_grid(load_config("gpt2"), "gpt2", scheduling=["continuous", "static"],
                                     max_num_seqs=[8, 1024], max_num_batched_tokens=[512])
    # 1024 sequences need a token budget of at least 1024: the engine's own check refuses it
    assert [v.name for v in variants] == ["continuous_seqs8_tok512", "static_seqs8_tok512"]
    assert len(skipped) == 2 and "max_num_batched_tokens" in skipped[0]
    static = variants[1].config
    assert static.parameters["scheduling"].string_value == "static"
    assert static.parameters["max_num_seqs"].string_value == "8"
    assert static.parameters["kv_cache_bytes"].string_value == "1073741824"


def test_options_of_the_other_batching_kind_are_refused():
    with pytest.raises(ValueError, match="--max-batch-size does not apply"):
        variant_grid(load_config("gpt2"), "gpt2", max_batch_size=[8])
    with pytest.raises(ValueError, match="--max-num-seqs does not apply"):
        variant_grid(load_config("minilm"), "minilm", max_num_seqs=[8])
    with pytest.raises(ValueError, match="no variant left"):
        variant_grid(load_config("minilm"), "minilm", max_batch_size=[2])
    variants, _ = variant_grid(load_config("minilm"), "minilm")
    assert [v.name for v in variants] == ["checked_in"]


def _point(variant, load, rps, p99):
    return PointResult(load_kind="concurrency", load=load, duration_s=6, requests=int(rps * 6), errors=0,
                       throughput_rps=rps, p50_ms=p99 / 2, p90_ms=None, p95_ms=None, p99_ms=p99, is_stable=True,
                       num_windows=3, variant=variant)


def test_frontier_and_recommended_config_are_written(tmp_path):
    variants, _ = variant_grid(load_config("minilm"), "minilm", batch_window_us=[0, 2000])
    points = [_point("win0", 1, 60, 20), _point("win0", 8, 150, 60), _point("win0", 32, 170, 250),
              _point("win2000", 1, 55, 25), _point("win2000", 8, 160, 55), _point("win2000", 32, 180, 240)]
    paths = write_sweep(tmp_path, variants, points, Slo(p99_ms=100), "minilm")
    record = json.loads(paths["json"].read_text())
    assert [(p["variant"], p["load"]) for p in record["frontier"]] == [
        ("win0", 1), ("win2000", 8), ("win2000", 32)]
    assert record["recommended"]["variant"] == "win2000" and record["recommended"]["point"]["load"] == 8
    text = paths["recommended"].read_text()
    assert text.startswith("# Recommended by scripts/sweep.py") and "160.0 requests/s at p99 55.0 ms" in text
    config = parse_config(text)  # comments and all, it parses as a config
    assert config.name == "minilm" and config.dynamic_batching.max_queue_delay_microseconds == 2000
    assert paths["frontier_png"].read_bytes()[:4] == b"\x89PNG"
    assert len(paths["frontier_csv"].read_text().splitlines()) == 1 + 3


def test_no_recommendation_when_nothing_meets_the_slo(tmp_path):
    variants, _ = variant_grid(load_config("minilm"), "minilm")
    paths = write_sweep(tmp_path, variants, [_point("checked_in", 1, 60, 200)], Slo(p99_ms=10), "minilm")
    assert "recommended" not in paths and json.loads(paths["json"].read_text())["recommended"] is None


def test_a_failing_variant_is_recorded_and_the_sweep_goes_on(tmp_path, capsys):
    variants, _ = variant_grid(load_config("minilm"), "minilm", batch_window_us=[0, 500, 2000])
    progress = []

    def measure(variant):
        if variant.name == "win500":
            raise ConnectionRefusedError("[Errno 111] Connection refused")  # what a dead server looks like
        return [_point(variant.name, 1, 60, 20), _point(variant.name, 8, 150, 60)]

    def on_progress(points, failed):
        progress.append((len(points), [f.name for f in failed]))
        write_sweep(tmp_path, variants, points, Slo(p99_ms=100), "minilm", failed)

    points, failed = measure_variants(variants, measure, on_progress)
    assert [p.variant for p in points] == ["win0", "win0", "win2000", "win2000"]
    assert failed == [VariantFailure("win500", "ConnectionRefusedError: [Errno 111] Connection refused")]
    assert progress == [(2, []), (2, ["win500"]), (4, ["win500"])]  # written after every variant
    assert "variant win500 failed" in capsys.readouterr().err
    record = json.loads((tmp_path / "sweep.json").read_text())
    assert [(v["name"], v["status"]) for v in record["variants"]] == [
        ("win0", "measured"), ("win500", "failed"), ("win2000", "measured")]
    assert record["failed"] == [{"name": "win500", "error": "ConnectionRefusedError: [Errno 111] Connection refused"}]
    assert record["recommended"]["variant"] in ("win0", "win2000")


def test_a_sweep_whose_every_variant_failed_still_writes_its_record(tmp_path):
    variants, _ = variant_grid(load_config("minilm"), "minilm")
    points, failed = measure_variants(variants, lambda v: 1 / 0)
    assert points == [] and failed == [VariantFailure("checked_in", "ZeroDivisionError: division by zero")]
    paths = write_sweep(tmp_path, variants, points, Slo(p99_ms=100), "minilm", failed)
    record = json.loads(paths["json"].read_text())
    assert record["variants"][0]["status"] == "failed" and record["recommended"] is None
    assert paths["frontier_png"].is_file()


def test_an_unstable_recommendation_names_the_configured_tolerance():
    variants, _ = variant_grid(load_config("minilm"), "minilm")
    point = _point("checked_in", 8, 150, 60)
    point.is_stable = False
    text = recommended_text(variants[0], point, Slo(), "minilm", tolerance=0.05)
    assert "never stabilised (5 % over 3 windows)" in text and "10 %" not in text

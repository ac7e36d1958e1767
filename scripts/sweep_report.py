"""What a config sweep writes: every point, the throughput/p99 Pareto frontier across variants (CSV,
JSON, a plot) and the recommended config.pbtxt, rendered whole and ready to copy. No Locust and no
server here, so it is tested on its own."""
from __future__ import annotations

import datetime
import json
from dataclasses import asdict
from pathlib import Path

from clients.model_spec import render_config
from load_tests.analysis import Slo, best_under_slo, pareto_frontier
from load_tests.plots import plot_frontier
from load_tests.report import write_csv
from scripts.sweep_variants import Variant


def recommended_text(variant: Variant, point, slo: Slo, model: str) -> str:
    """The variant's config, rendered whole under the model's own name, ready to copy."""
    config = type(variant.config)()
    config.CopyFrom(variant.config)
    config.name = model
    load = f"concurrency {point.load:g}" if point.load_kind == "concurrency" else f"{point.load:g} requests/s offered"
    header = (f"# Recommended by scripts/sweep.py on {datetime.date.today()}: variant {variant.name}\n"
              f"# ({', '.join(f'{k}={v}' for k, v in variant.settings.items())}).\n"
              f"# Measured: {point.throughput_rps:.1f} requests/s at p99 {point.p99_ms:.1f} ms ({load}),\n"
              + (f"# the most throughput of any variant under the SLO: {slo.describe()}.\n" if slo.is_set else
                 "# No SLO was given: the fastest point on the Pareto frontier.\n")
              + ("" if point.is_stable else
                 "# That point never stabilised (10 % over 3 windows): confirm it with a longer run.\n"))
    return header + render_config(config)


def write_sweep(out: Path, variants: list[Variant], points: list, slo: Slo, model: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    frontier = pareto_frontier(points)
    # Without an SLO, the frontier's fastest point; with one, the fastest point that meets it.
    best = best_under_slo(points, slo) if slo.is_set else (frontier[-1] if frontier else None)
    paths = {"variants_csv": write_csv(points, out / "variants.csv"),
             "frontier_csv": write_csv(frontier, out / "frontier.csv"),
             "frontier_png": plot_frontier(points, frontier, best, out / "frontier.png", f"{model}: variants")}
    by_name = {v.name: v for v in variants}
    record = {"model": model, "slo": slo.describe() if slo.is_set else None,
              "variants": [{"name": v.name, "settings": v.settings} for v in variants],
              "frontier": [asdict(p) for p in frontier],
              "recommended": None if best is None else {"variant": best.variant, "point": asdict(best)}}
    if best is not None:
        paths["recommended"] = out / "recommended_config.pbtxt"
        paths["recommended"].write_text(recommended_text(by_name[best.variant], best, slo, model))
    paths["json"] = out / "sweep.json"
    paths["json"].write_text(json.dumps(record, indent=2, default=str))
    return paths

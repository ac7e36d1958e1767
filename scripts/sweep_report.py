"""What a config sweep records and writes: every point, the variants that failed (with their errors),
the throughput/p99 Pareto frontier across variants (CSV, JSON, a plot) and the recommended
config.pbtxt, rendered whole and ready to copy. No Locust and no server here, so it is tested on its
own."""
from __future__ import annotations

import datetime
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from clients.model_spec import render_config
from load_tests.analysis import STABILITY_TOLERANCE, STABILITY_WINDOWS, Slo, best_under_slo, pareto_frontier
from load_tests.plots import plot_frontier
from load_tests.report import write_csv
from scripts.sweep_variants import Variant


@dataclass(frozen=True)
class VariantFailure:
    name: str
    error: str  # the exception's type and message


def measure_variants(variants: list[Variant], measure: Callable[[Variant], list],
                     on_progress: Callable[[list, list[VariantFailure]], None] | None = None,
                     ) -> tuple[list, list[VariantFailure]]:
    """Every variant's points, measured one after another. A variant that raises (its server died,
    a stats fetch failed, anything) is recorded as failed with its error, and the sweep goes on:
    one bad variant must not cost the others. `on_progress` sees the results so far after each one."""
    points: list = []
    failed: list[VariantFailure] = []
    for variant in variants:
        try:
            points += measure(variant)
        except Exception as e:  # recorded as the variant's result and reported at the end
            failed.append(VariantFailure(variant.name, f"{type(e).__name__}: {e}"))
            print(f"variant {variant.name} failed, going on with the others: {failed[-1].error}",
                  file=sys.stderr, flush=True)
        if on_progress is not None:
            on_progress(points, failed)
    return points, failed


def recommended_text(variant: Variant, point, slo: Slo, model: str, tolerance: float = STABILITY_TOLERANCE) -> str:
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
                 f"# That point never stabilised ({100 * tolerance:g} % over {STABILITY_WINDOWS} windows): "
                 "confirm it with a longer run.\n"))
    return header + render_config(config)


def write_sweep(out: Path, variants: list[Variant], points: list, slo: Slo, model: str,
                failed: Sequence[VariantFailure] = (), tolerance: float = STABILITY_TOLERANCE) -> dict:
    """Every file of the sweep from the points measured so far (rewritten after each variant, so an
    interrupted sweep keeps what it measured); each variant's status in sweep.json is "measured",
    "failed" (its error under "failed") or "pending"."""
    out.mkdir(parents=True, exist_ok=True)
    frontier = pareto_frontier(points)
    # Without an SLO, the frontier's fastest point; with one, the fastest point that meets it.
    best = best_under_slo(points, slo) if slo.is_set else (frontier[-1] if frontier else None)
    paths = {"variants_csv": write_csv(points, out / "variants.csv"),
             "frontier_csv": write_csv(frontier, out / "frontier.csv"),
             "frontier_png": plot_frontier(points, frontier, best, out / "frontier.png", f"{model}: variants")}
    by_name = {v.name: v for v in variants}
    measured, failed_names = {p.variant for p in points}, {f.name for f in failed}
    status = {v.name: "failed" if v.name in failed_names else "measured" if v.name in measured else "pending"
              for v in variants}
    record = {"model": model, "slo": slo.describe() if slo.is_set else None,
              "variants": [{"name": v.name, "settings": v.settings, "status": status[v.name]} for v in variants],
              "failed": [asdict(f) for f in failed],
              "frontier": [asdict(p) for p in frontier],
              "recommended": None if best is None else {"variant": best.variant, "point": asdict(best)}}
    if best is not None:
        paths["recommended"] = out / "recommended_config.pbtxt"
        paths["recommended"].write_text(recommended_text(by_name[best.variant], best, slo, model, tolerance))
    paths["json"] = out / "sweep.json"
    paths["json"].write_text(json.dumps(record, indent=2, default=str))
    return paths

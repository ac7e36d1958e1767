"""The envelope's artefacts: points.csv, envelope.json, two PNG plots and one self-contained HTML
report (the plots embedded as base64) with the run's settings, the verdicts and the table."""
from __future__ import annotations

import base64
import csv
import dataclasses
import html
import json
import typing
from pathlib import Path
from typing import Sequence

from load_tests.analysis import STABILITY_TOLERANCE, STABILITY_WINDOWS, EnvelopeSummary, Slo, summarize_envelope
from load_tests.plots import load_label, plot_latency_vs_throughput, plot_throughput_vs_load
from load_tests.point import POINT_FIELDS, PointResult

_FIELD_TYPES = typing.get_type_hints(PointResult)
# The HTML table's columns: (field, heading); generation columns appear when any point has them.
_COLUMNS = (("load", "load"), ("throughput_rps", "req/s"), ("output_tokens_per_s", "tok/s"),
            ("p50_ms", "p50 ms"), ("p90_ms", "p90 ms"), ("p95_ms", "p95 ms"), ("p99_ms", "p99 ms"),
            ("ttft_p50_ms", "TTFT p50"), ("ttft_p99_ms", "TTFT p99"), ("tpot_p50_ms", "TPOT p50"),
            ("tpot_p99_ms", "TPOT p99"), ("requests", "ok"), ("errors", "errors"), ("is_stable", "stable"),
            ("avg_batch_size", "batch"), ("engine_batch_size", "engine batch"), ("avg_queue_us", "queue us"),
            ("avg_compute_us", "compute us"), ("late_dispatches", "late"), ("cap_hits", "cap hits"),
            ("client_cpu_fraction", "client CPU"))


def write_csv(points: Sequence[PointResult], path: Path) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=POINT_FIELDS)
        writer.writeheader()
        for p in points:
            writer.writerow({k: "" if v is None else v for k, v in dataclasses.asdict(p).items()})
    return path


def _parse(name: str, text: str):
    kind = _FIELD_TYPES[name]
    if text == "" and type(None) in typing.get_args(kind):
        return None
    base = next((t for t in typing.get_args(kind) if t is not type(None)), kind)
    if base is bool:
        return text.strip().lower() in ("true", "1", "yes")
    return base(float(text)) if base is int else base(text)


def read_csv(path: Path) -> list[PointResult]:
    """Points back from a CSV that write_csv wrote (or one written by hand with its header);
    columns it does not name take their defaults."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    unknown = set(rows[0]) - set(POINT_FIELDS) if rows else set()
    if unknown:
        raise ValueError(f"{path}: unknown columns {sorted(unknown)}; known: {list(POINT_FIELDS)}")
    return [PointResult(**{k: _parse(k, v) for k, v in row.items()}) for row in rows]


def envelope_record(settings: dict, points: Sequence[PointResult], summary: EnvelopeSummary) -> dict:
    return {"settings": settings, "summary": summary.as_dict(points),
            "points": [dataclasses.asdict(p) | {"error_rate": p.error_rate} for p in points]}


def _fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 10 else f"{value:,.1f}"
    return str(value)


def verdicts(points: Sequence[PointResult], summary: EnvelopeSummary,
             tolerance: float = STABILITY_TOLERANCE) -> list[str]:
    """The report's sentences, also printed at the end of a run; `tolerance` is the stability rule's."""
    lines = []
    if summary.knee is not None:
        k = points[summary.knee]
        lines.append(f"knee at {load_label(k)}: {k.throughput_rps:.1f} req/s, p99 {k.p99_ms:.1f} ms")
    elif sum(p.p99_ms is not None for p in points) < 3:
        lines.append("no knee: it takes at least 3 measured points")
    else:
        lines.append("no knee: latency rose at least in step with throughput from the lightest load on")
    slo = summary.slo
    if slo.is_set:
        if summary.best is None:
            lines.append(f"no point meets the SLO ({slo.describe()})")
        else:
            b = points[summary.best]
            # the figures that the SLO judged, in its own terms
            judged = [f"{name} p99 {getattr(b, field):.1f} ms" for name, field, limit in
                      (("latency", "p99_ms", slo.p99_ms), ("TTFT", "ttft_p99_ms", slo.ttft_p99_ms),
                       ("TPOT", "tpot_p99_ms", slo.tpot_p99_ms)) if limit is not None]
            note = "" if b.is_stable else " (never stabilised: rerun it longer)"
            lines.append(f"most throughput under the SLO ({slo.describe()}): {load_label(b)}, "
                         f"{b.throughput_rps:.1f} req/s at {', '.join(judged)}{note}")
    if summary.unstable:
        lines.append(f"never stabilised (last {STABILITY_WINDOWS} windows apart by more than {100 * tolerance:g} %): "
                     + ", ".join(load_label(points[i]) for i in summary.unstable))
    capped = [load_label(p) for p in points if p.cap_hits]
    if capped:
        lines.append("arrivals waited for a free user (the in-flight cap, --max-in-flight) at " + ", ".join(capped)
                     + ": latency still counts from the scheduled time, but the offered rate was not sent on time")
    if summary.client_bound:
        lines.append("WARNING: the load generator was CPU-bound (>= 90 % of a core) at "
                     + ", ".join(load_label(points[i]) for i in summary.client_bound)
                     + ": those points measure the client, not the server")
    return lines


def _image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def render_html(settings: dict, points: Sequence[PointResult], summary: EnvelopeSummary,
                images: Sequence[Path], tolerance: float = STABILITY_TOLERANCE) -> str:
    columns = [(f, h) for f, h in _COLUMNS if any(getattr(p, f) not in (None, 0) for p in points) or
               f in ("load", "throughput_rps", "p50_ms", "p99_ms", "errors", "is_stable")]
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h in columns)
    rows = []
    for i, p in enumerate(points):
        marks = (" class=best" if i == summary.best else "") + (" title=knee" if i == summary.knee else "")
        cells = "".join(f"<td>{html.escape(_fmt(getattr(p, f)))}</td>" for f, _ in columns)
        rows.append(f"<tr{marks}>{cells}</tr>")
    settings_rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                            for k, v in settings.items())
    notes = "".join(f"<li>{html.escape(line)}</li>" for line in verdicts(points, summary, tolerance))
    title = html.escape(f"Load envelope: {settings.get('model', '')}")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}tr.best{{background:#fff3b0}}img{{max-width:100%}}</style>
</head><body><h1>{title}</h1>
<h2>Findings</h2><ul>{notes}</ul>
{"".join(_image(p) for p in images)}
<h2>Points</h2><table><tr>{head}</tr>{"".join(rows)}</table>
<p>Latencies in ms from the client (open loop: from the scheduled send time); batch, queue and compute
time from the server (<code>/v2/models/&lt;m&gt;/stats</code>, <code>/metrics</code>) over the same windows.
Hollow markers in the plot: points that never stabilised.</p>
<h2>Settings</h2><table>{settings_rows}</table>
</body></html>
"""


def write_report(out_dir: Path, settings: dict, points: Sequence[PointResult], slo: Slo,
                 tolerance: float = STABILITY_TOLERANCE) -> dict[str, Path]:
    """Every artefact into out_dir; returns their paths by kind."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize_envelope(points, slo)
    title = f"{settings.get('model', '')} ({points[0].load_kind if points else ''})"
    paths = {"csv": write_csv(points, out_dir / "points.csv"),
             "latency_png": plot_latency_vs_throughput(points, summary, out_dir / "latency_vs_throughput.png", title),
             "throughput_png": plot_throughput_vs_load(points, out_dir / "throughput_vs_load.png", title)}
    paths["json"] = out_dir / "envelope.json"
    paths["json"].write_text(json.dumps(envelope_record(settings, points, summary), indent=2, default=str))
    paths["html"] = out_dir / "report.html"
    paths["html"].write_text(render_html(settings, points, summary, [paths["latency_png"], paths["throughput_png"]],
                                         tolerance))
    return paths

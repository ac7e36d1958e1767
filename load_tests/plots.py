"""The envelope's two plots, drawn with matplotlib's Agg backend (files only, no display):
latency (p50 and p99) against throughput with the knee, the SLO and the chosen point marked, and
throughput against the offered load."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # before pyplot: a headless machine has no display to open
import matplotlib.pyplot as plt  # noqa: E402

from load_tests.analysis import EnvelopeSummary  # noqa: E402
from load_tests.point import PointResult  # noqa: E402


def load_label(point: PointResult) -> str:
    return f"c={point.load:g}" if point.load_kind == "concurrency" else f"{point.load:g}/s"


def _latency_panel(ax, points: Sequence[PointResult], summary: EnvelopeSummary, prefix: str, title: str,
                   slo_ms: float | None) -> None:
    shown = [(i, p) for i, p in enumerate(points) if getattr(p, f"{prefix}p99_ms") is not None]
    xs = [p.throughput_rps for _, p in shown]
    for quantile, color in (("p50", "tab:blue"), ("p99", "tab:red")):
        ys = [getattr(p, f"{prefix}{quantile}_ms") for _, p in shown]
        ax.plot(xs, ys, "-", color=color, label=quantile, zorder=1)
        # Hollow markers for points that never stabilised: their figures may not hold.
        for (_, p), x, y in zip(shown, xs, ys):
            ax.scatter([x], [y], s=30, zorder=2, edgecolors=color,
                       facecolors=color if p.is_stable else "white")
    for (_, p), x in zip(shown, xs):
        ax.annotate(load_label(p), (x, getattr(p, f"{prefix}p99_ms")), textcoords="offset points",
                    xytext=(4, 6), fontsize=7)
    if prefix == "" and summary.knee is not None:
        knee = points[summary.knee]
        ax.scatter([knee.throughput_rps], [knee.p99_ms], s=220, facecolors="none", edgecolors="black",
                   linewidths=1.5, zorder=3, label=f"knee ({load_label(knee)})")
    if slo_ms is not None:
        ax.axhline(slo_ms, color="gray", linestyle="--", linewidth=1, label=f"SLO {slo_ms:g} ms")
    if summary.best is not None:
        best = points[summary.best]
        ax.scatter([best.throughput_rps], [getattr(best, f"{prefix}p99_ms")], marker="*", s=200,
                   color="gold", edgecolors="black", zorder=4, label=f"best under SLO ({load_label(best)})")
    ax.set_xlabel("throughput (requests/s)")
    ax.set_ylabel(f"{title} (ms)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)


def plot_latency_vs_throughput(points: Sequence[PointResult], summary: EnvelopeSummary, path: Path,
                               title: str) -> Path:
    panels = [("", "latency", summary.slo.p99_ms)]
    if any(p.ttft_p99_ms is not None for p in points):
        panels += [("ttft_", "TTFT", summary.slo.ttft_p99_ms), ("tpot_", "TPOT", summary.slo.tpot_p99_ms)]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, (prefix, name, slo_ms) in zip(axes[0], panels):
        _latency_panel(ax, points, summary, prefix, name, slo_ms)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_throughput_vs_load(points: Sequence[PointResult], path: Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4.5))
    kind = points[0].load_kind if points else "concurrency"
    loads = [p.load for p in points]
    ax.plot(loads, [p.throughput_rps for p in points], "o-", color="tab:green", label="throughput")
    if kind == "rate":
        ax.plot(loads, loads, "--", color="gray", linewidth=1, label="offered")
    if loads and min(loads) > 0 and max(loads) / min(loads) >= 8:
        ax.set_xscale("log", base=2)  # loads are usually swept in powers of two
    ax.set_xlabel("concurrency (users)" if kind == "concurrency" else "offered rate (requests/s)")
    ax.set_ylabel("throughput (requests/s)")
    ax.grid(True, alpha=0.3)
    # The server's own batch size beside it shows why throughput grows (or stops growing).
    batch = [p.engine_batch_size if p.engine_batch_size is not None else p.avg_batch_size for p in points]
    if any(b is not None for b in batch):
        twin = ax.twinx()
        twin.plot(loads, [float("nan") if b is None else b for b in batch], "s:", color="tab:purple",
                  label="server batch size")
        twin.set_ylabel("average batch size (server)")
        twin.legend(loc="lower right", fontsize=7)
    ax.legend(loc="upper left", fontsize=7)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_frontier(points: Sequence[PointResult], frontier: Sequence[PointResult], best: PointResult | None,
                  path: Path, title: str) -> Path:
    """Every variant's p99 against throughput, the Pareto frontier drawn through them."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for variant in dict.fromkeys(p.variant for p in points):
        mine = [p for p in points if p.variant == variant and p.p99_ms is not None]
        ax.plot([p.throughput_rps for p in mine], [p.p99_ms for p in mine], "o-", alpha=0.6, label=variant or "-")
    ax.plot([p.throughput_rps for p in frontier], [p.p99_ms for p in frontier], "k--", linewidth=1.5,
            label="Pareto frontier")
    if best is not None:
        ax.scatter([best.throughput_rps], [best.p99_ms], marker="*", s=250, color="gold", edgecolors="black",
                   zorder=4, label=f"recommended ({best.variant}, {load_label(best)})")
    ax.set_xlabel("throughput (requests/s)")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

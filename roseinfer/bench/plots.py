"""Plotting helpers shared by the benchmarks and the notebooks (matplotlib, Agg-safe)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib.pyplot as plt

COLORS = {"before": "#b0b0b0", "after": "#d9534f"}


def before_after_bars(
    ax,
    labels: Sequence[str],
    runs: Sequence[Sequence[float]],
    ylabel: str,
    title: str = "",
    colors: Sequence[str] | None = None,
) -> None:
    """One bar per variant at its median, with a whisker from the fastest to the slowest run."""
    medians = [sorted(r)[(len(r) - 1) // 2] for r in runs]
    low = [m - min(r) for m, r in zip(medians, runs)]
    high = [max(r) - m for m, r in zip(medians, runs)]
    colors = colors or [COLORS["before"]] * (len(labels) - 1) + [COLORS["after"]]
    bars = ax.bar(
        labels, medians, yerr=[low, high], capsize=6, color=colors, edgecolor="black", linewidth=0.6
    )
    for bar, m, top in zip(bars, medians, high):  # the label sits above the slowest-to-fastest whisker
        x = bar.get_x() + bar.get_width() / 2
        ax.annotate(
            f"{m:.3g}",
            (x, m + top),
            ha="center",
            va="bottom",
            xytext=(0, 3),
            textcoords="offset points",
            fontsize=9,
        )
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)


def latency_cdf(ax, series: Mapping[str, Sequence[float]], xlabel: str, title: str = "") -> None:
    """Empirical CDF of each latency list (ms)."""
    for name, values in series.items():
        data = sorted(values)
        if not data:
            continue
        ys = [(i + 1) / len(data) for i in range(len(data))]
        ax.step(data, ys, where="post", label=name, color=COLORS.get(name))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)


def curve(
    ax,
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    xlabel: str,
    ylabel: str,
    title: str = "",
    logx: bool = False,
) -> None:
    """y vs x per variant: throughput vs concurrency or request rate, step time vs batch, ..."""
    for name, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=name, color=COLORS.get(name))
    if logx:
        from matplotlib.ticker import NullFormatter, ScalarFormatter

        ax.set_xscale("log", base=2)
        xs = sorted({x for xs, _ in series.values() for x in xs})
        ax.set_xticks(xs)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)


def save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def figure(ncols: int = 1, width: float = 5.0, height: float = 3.6):
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])

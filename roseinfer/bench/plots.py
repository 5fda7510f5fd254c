"""Plotting helpers shared by the benchmarks and the notebooks (matplotlib, Agg-safe).

matplotlib is the `bench` extra (`pip install roseinfer[bench]`), not a dependency of
the engine: it is imported by the functions that draw, never by importing this module.

Conventions every figure follows:
- the legend names the variants ("recompute", "KV cache"), never "before/after";
- where a point or a bar has several runs, the figure shows their spread (a
  min-max band on a curve, a whisker on a bar); a single value gets neither;
- log axes print plain numbers (600, not 6x10^2).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from roseinfer.bench.stats import median as _median
from roseinfer.bench.stats import plain_number

COLORS = {"before": "#b0b0b0", "after": "#d9534f"}
# Variant colours when the names are not "before"/"after": the first series is
# drawn in the "before" grey, the last in the "after" red, any between in these.
_MIDDLE = ("#5b8bd0", "#5cb85c", "#f0ad4e", "#9b59b6")


def _as_runs(value) -> list[float]:
    """A list of runs from a list (or array) of runs or a single value."""
    return [float(v) for v in value] if hasattr(value, "__len__") else [float(value)]


def plain_log_axis(axis) -> None:
    """Plain-number labels on a log axis; minor ticks labelled at 2x and 5x when a decade has room."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    axis.set_major_formatter(FuncFormatter(plain_number))
    axis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
    axis.set_minor_formatter(FuncFormatter(plain_number))


def _series_colors(names: Sequence[str], colors: Mapping[str, str] | None) -> dict[str, str]:
    out = {}
    for i, name in enumerate(names):
        if colors and name in colors:
            out[name] = colors[name]
        elif name in COLORS:
            out[name] = COLORS[name]
        elif i == len(names) - 1 and len(names) > 1:
            out[name] = COLORS["after"]
        elif i == 0:
            out[name] = COLORS["before"]
        else:
            out[name] = _MIDDLE[(i - 1) % len(_MIDDLE)]
    return out


def before_after_bars(
    ax,
    labels: Sequence[str],
    runs: Sequence[Sequence[float]],
    ylabel: str,
    title: str = "",
    colors: Sequence[str] | None = None,
) -> None:
    """One bar per variant at its median; a whisker from the fastest to the slowest run where there are runs.

    A variant given a single value gets no whisker: there is no spread to show.
    The value is printed just above the bar's top and right of the whisker, so the two never meet.
    """
    runs = [_as_runs(r) for r in runs]
    medians = [_median(r) for r in runs]
    colors = colors or [COLORS["before"]] * (len(labels) - 1) + [COLORS["after"]]
    bars = ax.bar(labels, medians, color=colors, edgecolor="black", linewidth=0.6)
    for bar, m, r in zip(bars, medians, runs):
        x = bar.get_x() + bar.get_width() / 2
        if len(r) > 1:
            ax.errorbar(
                x, m, yerr=[[m - min(r)], [max(r) - m]], fmt="none", ecolor="black", capsize=6, lw=1.2
            )
        # Right of the whisker's caps (they reach 6 points either side of it), just above the bar.
        ax.annotate(
            plain_number(m),
            (x, m),
            ha="left",
            va="bottom",
            xytext=(9, 2),
            textcoords="offset points",
            fontsize=9,
        )
    ax.margins(y=0.12)  # room above the tallest bar for its label
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)


def latency_cdf(ax, series: Mapping[str, Sequence[float]], xlabel: str, title: str = "") -> None:
    """Empirical CDF of each latency list (ms)."""
    palette = _series_colors(list(series), None)
    for name, values in series.items():
        data = sorted(values)
        if not data:
            continue
        ys = [(i + 1) / len(data) for i in range(len(data))]
        ax.step(data, ys, where="post", label=name, color=palette[name])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)


def curve(
    ax,
    series: Mapping[str, tuple[Sequence[float], Sequence]],
    xlabel: str,
    ylabel: str,
    title: str = "",
    logx: bool = False,
    logy: bool = False,
    colors: Mapping[str, str] | None = None,
) -> None:
    """y vs x per variant: throughput vs concurrency or request rate, step time vs batch, ...

    Each series is (xs, ys). A y may be one number or the list of its runs: then
    the line goes through the runs' medians, a band spans their min to max and
    each run is a dot, so the reader sees how much the runs disagree.
    """
    palette = _series_colors(list(series), colors)
    for name, (xs, ys) in series.items():
        color = palette[name]
        runs = [_as_runs(y) for y in ys]
        ax.plot(xs, [_median(r) for r in runs], marker="o", label=name, color=color)
        if any(len(r) > 1 for r in runs):
            ax.fill_between(xs, [min(r) for r in runs], [max(r) for r in runs], color=color, alpha=0.2, lw=0)
            ax.scatter(
                [x for x, r in zip(xs, runs) for _ in r],
                [v for r in runs for v in r],
                s=6,
                color=color,
                alpha=0.6,
                zorder=3,
            )
    if logx:
        from matplotlib.ticker import FuncFormatter, NullFormatter

        ax.set_xscale("log", base=2)
        xs = sorted({x for xs, _ in series.values() for x in xs})
        ax.set_xticks(xs)
        ax.xaxis.set_major_formatter(FuncFormatter(plain_number))
        ax.xaxis.set_minor_formatter(NullFormatter())
    if logy:
        ax.set_yscale("log")
        plain_log_axis(ax.yaxis)
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
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])

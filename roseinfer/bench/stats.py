"""How sure a before/after comparison is, from a handful of noisy runs.

Two tools, both exact or seeded so a notebook prints the same verdict for the
same data:

- `rank_test`: the two-sided Mann-Whitney U test, computed exactly by
  enumerating every way the pooled runs could split into two groups. It makes
  no assumption about the shape of the noise. With 5 runs a side its smallest
  possible p-value is 2/252 = 0.008, so 5 runs can clear a 5% error rate;
  3 runs a side cannot (the smallest p is 2/20 = 0.1), which is why the
  notebooks take at least 5.
- `ratio_interval`: a percentile bootstrap interval for the ratio of the two
  medians, the "how much" beside the rank test's "whether".
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

ALPHA = 0.05  # the error rate a verdict states: 1 in 20 "differs" is a false alarm


def plain_number(value: float, _pos=None) -> str:
    """3 significant digits without scientific notation: 7020 -> '7,020', 0.0123 -> '0.0123'.

    (`_pos` lets matplotlib use it as a tick formatter.)"""
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def median(values: list[float]) -> float:
    data = sorted(values)
    n = len(data)
    return data[n // 2] if n % 2 else (data[n // 2 - 1] + data[n // 2]) / 2


def _u_statistic(x: list[float], y: list[float]) -> float:
    """Pairs (x_i, y_j) with x_i > y_j, ties counting one half."""
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in x for b in y)


def rank_test(x: list[float], y: list[float]) -> float:
    """Two-sided p-value that x and y come from the same distribution (Mann-Whitney U).

    Exact (every split of the pooled values) up to 10 + 10 runs, the normal
    approximation beyond that.
    """
    n, m = len(x), len(y)
    if n == 0 or m == 0:
        raise ValueError("rank_test needs at least one run on each side")
    observed = _u_statistic(x, y)
    centre = n * m / 2
    if n + m <= 20:
        pooled = list(x) + list(y)
        extreme = total = 0
        for chosen in itertools.combinations(range(n + m), n):
            picked = set(chosen)
            u = _u_statistic([pooled[i] for i in chosen], [pooled[i] for i in range(n + m) if i not in picked])
            total += 1
            extreme += abs(u - centre) >= abs(observed - centre) - 1e-9
        return extreme / total
    sigma = math.sqrt(n * m * (n + m + 1) / 12)
    z = (abs(observed - centre) - 0.5) / sigma
    return min(1.0, math.erfc(z / math.sqrt(2)))


def ratio_interval(before: list[float], after: list[float], higher_is_better: bool,
                   level: float = 0.95, draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Bootstrap interval of median(after)/median(before) (inverted when lower is better), so > 1 is better."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(draws):
        b = median(rng.choices(before, k=len(before)))
        a = median(rng.choices(after, k=len(after)))
        if min(a, b) <= 0:
            continue
        ratios.append(a / b if higher_is_better else b / a)
    if not ratios:
        return (float("nan"), float("nan"))
    ratios.sort()
    lo = ratios[int((1 - level) / 2 * (len(ratios) - 1))]
    hi = ratios[int((1 + level) / 2 * (len(ratios) - 1))]
    return lo, hi


@dataclass(frozen=True)
class Verdict:
    """What a set of before/after runs supports. `str()` is the sentence a notebook prints."""

    name: str
    unit: str
    before: tuple[float, ...]
    after: tuple[float, ...]
    higher_is_better: bool
    ratio: float  # median(after)/median(before), oriented so > 1 means after is better
    interval: tuple[float, float]  # bootstrap 95% interval of that ratio
    p_value: float  # two-sided rank test
    labels: tuple[str, str] = ("before", "after")  # what the two sets are, in the sentence

    @property
    def significant(self) -> bool:
        return self.p_value < ALPHA

    @property
    def better(self) -> bool:
        """After is better, and the rank test says so at the stated error rate."""
        return self.significant and self.ratio > 1

    @property
    def worse(self) -> bool:
        return self.significant and self.ratio < 1

    def __str__(self) -> str:
        """One line: "TTFT p50: before 346 ms -> after 28.3 ms: 12.2x better (95% CI 11.7-12.8x; 5 vs 5 runs,
        p = 0.008)". The medians, the verdict, how sure; the runs themselves are the plot's to show."""
        n = plain_number
        first, second = self.labels
        where = (f"{self.name}: {first} {n(median(list(self.before)))} -> {second} "
                 f"{n(median(list(self.after)))} {self.unit}")
        runs = f"{len(self.before)} vs {len(self.after)} runs, p = {self.p_value:.2g}"
        if not self.significant:
            return f"{where}: no difference this data can show ({runs})"
        lo, hi = self.interval
        if self.ratio >= 1:
            word, shown, lo_hi = "better", self.ratio, (lo, hi)
        else:  # say "N x worse", with the interval of that same N
            word, shown, lo_hi = "worse", 1 / self.ratio, (1 / hi, 1 / lo) if lo > 0 else (0.0, float("inf"))
        return f"{where}: {shown:.2f}x {word} (95% CI {lo_hi[0]:.2f}-{lo_hi[1]:.2f}x; {runs})"


def verdict(
    name: str,
    before: list[float],
    after: list[float],
    unit: str,
    higher_is_better: bool,
    labels: tuple[str, str] = ("before", "after"),
) -> Verdict:
    """Compare repeated runs: a rank test for whether they differ, a bootstrap interval for by how much."""
    b, a = median(before), median(after)
    ratio = (a / b if higher_is_better else b / a) if min(a, b) > 0 else float("inf")
    return Verdict(name, unit, tuple(before), tuple(after), higher_is_better, ratio,
                   ratio_interval(before, after, higher_is_better), rank_test(before, after), labels)

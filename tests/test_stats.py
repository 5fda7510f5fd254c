"""The notebooks' verdict: a rank test with a stated error rate, never "every run agrees"."""

import itertools
import random

from roseinfer.bench.stats import ALPHA, rank_test, ratio_interval, verdict


def test_three_runs_a_side_can_never_be_called_a_difference():
    # Fully separated 3 vs 3 happens by chance 2 times in 20: above the 5% error rate.
    assert rank_test([1, 2, 3], [4, 5, 6]) == 2 / 20
    assert not verdict("x", [1, 2, 3], [4, 5, 6], "tok/s", higher_is_better=True).significant


def test_five_fully_separated_runs_a_side_are_a_difference():
    assert rank_test([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == 2 / 252
    v = verdict("tput", [10, 11, 12, 10.5, 11.5], [20, 21, 22, 20.5, 21.5], "tok/s", higher_is_better=True)
    assert v.better and not v.worse
    assert "1.91x better" in str(v) and "p = 0.0079" in str(v) and "\n" not in str(v)
    lo, hi = v.interval
    assert lo <= v.ratio <= hi


def test_lower_is_better_and_overlap():
    slower = verdict("t", [1.0, 1.1, 1.05, 1.02, 1.08], [2.0, 2.1, 2.05, 2.02, 2.08], "ms", higher_is_better=False)
    assert slower.worse and "worse" in str(slower)
    # The interval is of the same "N x worse" as the headline, not of its inverse.
    lo, hi = slower.interval
    assert f"(95% CI {1 / hi:.2f}-{1 / lo:.2f}x;" in str(slower) and 1 / hi > 1
    mixed = verdict("t", [1, 3, 5, 7, 9], [2, 4, 6, 8, 10], "ms", higher_is_better=False)
    assert not mixed.significant and "no difference this data can show" in str(mixed)


def test_labels_name_the_two_sets_in_the_sentence():
    v = verdict("TTFT", [9, 9.5, 10, 10.5, 11], [4, 4.5, 5, 5.5, 6], "ms", higher_is_better=False,
                labels=("transformers serve", "roseinfer"))
    text = str(v)
    assert text.startswith("TTFT: transformers serve 10 -> roseinfer 5 ms: 2.00x better")
    assert "before" not in text and "after" not in text


def test_the_stated_error_rate_holds_on_identical_distributions():
    # Same distribution both sides: the test may call "different" at most ALPHA of the time.
    rng = random.Random(1)
    alarms = sum(rank_test([rng.gauss(0, 1) for _ in range(5)], [rng.gauss(0, 1) for _ in range(5)]) < ALPHA
                 for _ in range(400))
    assert alarms / 400 <= ALPHA + 0.03


def test_exact_p_matches_brute_force_and_large_samples_use_the_approximation():
    x, y = [3.0, 1.0, 4.0, 1.5], [5.0, 9.0, 2.0]
    pooled = x + y
    u_obs = sum((a > b) + 0.5 * (a == b) for a in x for b in y)
    count = total = 0
    for idx in itertools.combinations(range(7), 4):
        xs = [pooled[i] for i in idx]
        ys = [pooled[i] for i in range(7) if i not in idx]
        u = sum((a > b) + 0.5 * (a == b) for a in xs for b in ys)
        count += abs(u - 6) >= abs(u_obs - 6)
        total += 1
    assert rank_test(x, y) == count / total
    assert rank_test(list(range(30)), [v + 100 for v in range(30)]) < 1e-6


def test_ratio_interval_is_seeded():
    a = ratio_interval([1, 2, 3, 4, 5], [2, 3, 4, 5, 6], higher_is_better=True)
    assert a == ratio_interval([1, 2, 3, 4, 5], [2, 3, 4, 5, 6], higher_is_better=True)

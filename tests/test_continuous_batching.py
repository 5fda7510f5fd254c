"""Notebook 03's runs: requests arriving at wall-clock instants, served by the static or the continuous scheduler."""

from __future__ import annotations

import pytest

from roseinfer.bench.batching import StepRecord
from roseinfer.bench.continuous_batching import (
    SCHEDULERS,
    Summary,
    TimedRun,
    envelope,
    measure,
    padded_waste,
    residual_wait_s,
    serve,
    summarize,
)
from roseinfer.bench.stats import verdict
from roseinfer.bench.workloads import BenchRequest
from roseinfer.engine.scheduler import OnlineScheduler
from roseinfer.history.static_scheduler import StaticBatchScheduler

# Two at a time; requests 0 and 1 arrive at once and want 2 and 5 tokens; request 2 arrives while they run.
REQUESTS = [BenchRequest(prompt_token_ids=[11 + i, 12, 13], max_new_tokens=n) for i, n in enumerate([2, 5, 3])]


def test_the_static_scheduler_pads_to_the_longest_and_admits_only_a_drained_batch(engine):
    run = serve(engine, StaticBatchScheduler, REQUESTS, [0.0, 0.0, 1e-6], batch_size=2)
    assert [len(t) for t in run.token_ids] == [2, 5, 3]
    # Batch {0, 1} runs 5 steps of 2 rows (request 0's row computed 3 times after it finished), then {2} 3 steps.
    assert [s.rows for s in run.steps] == [2] * 5 + [1] * 3
    assert run.wasted_fraction == pytest.approx(3 / 13)
    assert run.start_s[2] > run.steps[4].end_s  # request 2 waited for the batch to drain, though a slot was free
    assert run.live_rows() == [2, 2, 1, 1, 1, 1, 1, 1]
    assert run.waiting() == [1] * 5 + [0] * 3  # request 2 arrived before the first step began


def test_the_continuous_scheduler_refills_a_freed_slot_at_the_next_step(engine):
    run = serve(engine, OnlineScheduler, REQUESTS, [0.0, 0.0, 1e-6], batch_size=2)
    assert [s.rows for s in run.steps] == [2] * 5  # request 2 takes request 0's slot at step 3, and ends with 1
    assert run.wasted_fraction == 0
    assert run.steps[1].end_s < run.start_s[2] < run.steps[2].start_s
    assert run.live_rows() == [s.rows for s in run.steps]


def test_waits_run_from_the_wall_clock_arrival_and_the_loop_sleeps_until_it(engine):
    run = serve(engine, OnlineScheduler, REQUESTS[:1], [0.1], batch_size=2)  # nothing to run until 0.1 s
    assert run.idle_s >= 0.09 and run.start_s[0] >= 0.1 == run.arrival_s[0]
    assert 0 <= run.queue_wait_ms[0] <= run.ttft_ms[0]


def test_both_schedulers_give_the_same_tokens_and_summarize(engine):
    runs = measure(engine, REQUESTS, [0.0, 0.0, 1e-6], batch_size=2, repeats=2)
    assert set(runs) == set(SCHEDULERS)
    summary = summarize(runs)
    table = str(summary)
    assert "queue wait p50, ms" in table and "rows thrown away, %" in table
    assert summary.wasted_pct["continuous"] == [0.0, 0.0]
    m = summary.metrics()
    for key in ("before_queue_wait_p50_ms", "after_queue_wait_p50_ms", "wasted_fraction", "continuous_wasted_fraction",
                "before_runs_tok_s", "after_runs_tok_s"):  # what the README's headline reads
        assert key in m
    env = envelope(runs, [r.max_new_tokens for r in REQUESTS], 2)
    assert env.predicted_wasted_pct == pytest.approx(100 * 3 / 13)


def _step(start, end, rows=1):
    return StepRecord(start, end, rows, rows)


def test_residual_wait_is_the_rest_of_the_step_in_progress():
    # Steps of 1 s and 3 s, arrivals over [0, 4]: (1/2 + 9/2) / 4 = 1.25 s; idle time adds no wait.
    run = TimedRun([0.0, 4.0], [0.0] * 2, [0.0] * 2, [0.0] * 2, [[1]] * 2, [_step(0, 1), _step(1, 4)], 4.0, 0.0)
    assert residual_wait_s(run) == pytest.approx(1.25)
    run.steps = [_step(0, 1), _step(3, 6)]  # idle 1-3; the window ends at 4 inside the second step
    assert residual_wait_s(run) == pytest.approx((0.5 + (9 - 4) / 2) / 4)  # from 3 to 4 it waits 6 - x


def test_padded_waste_groups_in_order():
    assert padded_waste([2, 5, 3], 2) == pytest.approx(1 - 10 / 13)
    assert padded_waste([4, 4, 4], 2) == 0


def test_assert_directions_fails_when_continuous_is_not_better():
    same = verdict("x", [1.0] * 5, [1.0] * 5, "ms", False)
    summary = Summary(same, same, same, {"static": [10.0], "continuous": [0.0]}, {"static": [0.1], "continuous": [0.2]},
                      {"static": [5], "continuous": [4]})
    with pytest.raises(AssertionError, match="sooner"):
        summary.assert_directions()
    assert "no difference shown" in str(summary)


def test_the_step_plot_drops_to_zero_where_the_engine_idled():
    from roseinfer.bench.continuous_batching import _stairs

    xs, ys = _stairs([_step(0, 1, 2), _step(1.0001, 2, 3), _step(5, 6, 1)], [2, 3, 1])
    assert xs == [0, 1.0001, 2, 5, 6] and ys == [2, 3, 0, 1, 0]

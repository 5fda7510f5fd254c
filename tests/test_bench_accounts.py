"""The back-of-envelope tables of notebooks 06 (`pop_account`) and 07 (`lock_account`), on made-up runs."""

from __future__ import annotations

import pytest

from roseinfer.bench.accessors import pop_account
from roseinfer.bench.lock_lookups import lock_account


def test_pop_account_prices_the_extra_work_against_a_run():
    quiet = {"private-state": 1.5, "current": 3.0}
    calls = {"private-state": [1.0, 2.0], "current": [3.0, 4.0, 5.0, 9.0]}  # 4.5 us is the 1.5x line
    runs = {"private-state": [{"pop_median_us": 2.0, "duration_s": 0.1, "pop_total_ms": 0.01}] * 3,
            "current": [{"pop_median_us": 9.0, "duration_s": 0.1, "pop_total_ms": 0.03}] * 3}
    acct = pop_account(quiet, calls, runs, requests=16)
    assert acct["extra_us"] == pytest.approx(1.5)
    assert acct["near_alone_share"] == pytest.approx(0.5)  # 3 and 4 of 3, 4, 5, 9
    assert acct["server_over_alone_private"] == pytest.approx(2.0 / 1.5)
    assert acct["server_over_alone_accessor"] == pytest.approx(3.0)
    assert acct["run_ms"] == pytest.approx(100.0)
    assert acct["share_of_run"] == pytest.approx(1.5 * 16 / 1000 / 100)
    assert acct["worst_share"] == pytest.approx(0.02 / 100)


def test_lock_account_sets_the_saving_beside_the_prediction_a_step_and_the_handlers():
    alone = {"lock-per-token": [14.0, 15.0, 13.0], "current": [8.0, 9.0, 8.0]}  # saved 6, 6, 5: median 6
    quiet = {"lock-per-token": [{"tpot_ms": t} for t in (3.9, 4.0, 4.3)],
             "current": [{"tpot_ms": t} for t in (3.8, 4.0, 4.2)]}
    busy = {v: [{"tpot_ms": t, "lookup_mean_us": 30.0, "slow_lookups": 1, "steps": 10} for t in (8.0, 8.0, 8.0)]
            for v in quiet}
    acct = lock_account(alone, {"quiet": quiet, "busy": busy}, "quiet", "busy", batch=32, lock_ns=200.0)
    assert acct["predicted_us"] == pytest.approx(6.2)
    assert acct["saved_us"] == pytest.approx(6.0)
    assert acct["saved_over_predicted"] == pytest.approx(6.0 / 6.2)
    assert acct["step_ms"] == pytest.approx(4.0)
    assert acct["share_of_step"] == pytest.approx(6.0 / 4000)
    assert acct["tpot_spread"] == pytest.approx(0.1)  # current's (4.2 - 3.8) / 4.0, the smaller
    assert acct["busy_growth_ms"] == pytest.approx(4.0) and acct["busy_growth_x"] == pytest.approx(2.0)
    assert acct["lookup_share_of_growth"] == pytest.approx(30.0 / 4000)
    assert (acct["slow_lookups"], acct["busy_lookups"]) == (6, 60)

"""Notebook 04's analysis (roseinfer.bench.scheduler_manager): its manager variant, its table and its checks."""

from __future__ import annotations

import matplotlib
import pytest

from roseinfer.bench import scheduler_manager as sm
from roseinfer.bench.same_answer import check_streams
from roseinfer.history import make_manager
from roseinfer.history.first_manager import FirstManager
from roseinfer.history.lock_per_token import LockPerTokenManager
from roseinfer.history.polling_worker import PollingWorkerManager
from roseinfer.history.private_state import PrivateStateManager
from roseinfer.server.manager import SchedulerManager

matplotlib.use("Agg")

NAP_MS = 5.0


def _metrics(ttft: float, itl: float, e2e: float, tok_s: float) -> dict:
    parts = {"enter_add_request": 0.0, "tokenize": 0.0, "queue_wait": ttft / 4, "prefill_to_first_token": ttft / 2,
             "delivery": ttft / 4}
    return {"ttft_ms": {"p50": ttft, "mean": ttft}, "itl_ms": {"p50": itl, "p99": itl * 1.3},
            "e2e_latency_ms": {"p50": e2e}, "output_throughput_tok_s": tok_s,
            **{f"{stage}_ms": {"mean": ms} for stage, ms in parts.items()}}


def _results(lock_scales: bool = False, runs: int = 5) -> sm.Results:
    """Runs shaped like notebook 04's saved CPU run: a lone step 13 ms, a step of 8 rows 33 ms, 16 tokens."""
    out: sm.Results = {sm.BEFORE: {}, sm.AFTER: {}}
    for c in (1, 8):
        for variant in (sm.BEFORE, sm.AFTER):
            out[variant][c] = []
            for i in range(runs):
                jitter = 1 + 0.1 * i  # the machine drifts from run to run
                if variant == sm.BEFORE:
                    ttft = 33 if c == 1 else (c - 1) / 2 * 224 + 33
                    tok_s = 71 * (2 if lock_scales and c > 1 else 1)
                    m = _metrics(ttft * jitter, 13 * jitter, 224 * jitter, tok_s / jitter)
                else:
                    step = 13 if c == 1 else 33
                    m = _metrics((NAP_MS + step) * jitter, step * jitter, 16 * step * jitter, c * 16000 / (16 * step)
                                 / jitter)
                out[variant][c].append(m)
    return out


def test_notebook04_manager_is_the_manager_before_05_06_07():
    mro = FirstManager.__mro__
    assert FirstManager._idle is PollingWorkerManager._idle  # 05 takes the nap out
    assert FirstManager._pop_finished is PrivateStateManager._pop_finished  # 06: the accessors
    assert FirstManager._collect_step_records is LockPerTokenManager._collect_step_records  # 07
    assert FirstManager._worker_loop is SchedulerManager._worker_loop  # the loop notebook 04 shows
    assert mro[-2] is SchedulerManager


def test_notebook04_manager_serves_by_name(engine):
    manager = make_manager(sm.AFTER, engine)
    try:
        assert isinstance(manager, FirstManager)
    finally:
        manager.close()
    # check_streams raises if a stream got other tokens than the engine's own greedy ones for its prompt
    said = check_streams(engine, {sm.BEFORE: "no manager", sm.AFTER: "manager"}, num_requests=3, new_tokens=3)
    assert said.startswith("3 requests")


def test_read_numbers_prints_a_small_table_and_its_checks_pass():
    numbers = sm.read_numbers(_results(), new_tokens=16, nap_ms=NAP_MS)
    text = str(numbers)
    assert "TTFT p50, 8 streams" in text and "back of the envelope" in text
    assert len(text.split()) < 200 and len(text.splitlines()) < 16
    numbers.check()
    predicted, measured = numbers.envelopes[0][1:]
    assert predicted == pytest.approx(((8 - 1) / 2 * 224 + 33) * 1.2)  # medians: the third of five runs, +20%
    assert measured == pytest.approx(predicted)


def test_checks_fail_when_a_rerun_contradicts_the_prose():
    with pytest.raises(AssertionError, match="stay near one stream"):
        sm.read_numbers(_results(lock_scales=True), new_tokens=16, nap_ms=NAP_MS).check()
    results = _results()
    for m in results[sm.AFTER][8]:
        m["ttft_ms"]["p50"] *= 3  # the manager's TTFT no longer one nap plus one step
    with pytest.raises(AssertionError, match="manager's TTFT"):
        sm.read_numbers(results, new_tokens=16, nap_ms=NAP_MS).check()
    with pytest.raises(AssertionError, match="wider than a nap"):
        sm.read_numbers(_results(), new_tokens=16, nap_ms=100.0).check()


def test_too_few_runs_say_no_difference():
    numbers = sm.read_numbers(_results(runs=2), new_tokens=16, nap_ms=NAP_MS)
    assert "no difference 2 runs can show" in str(numbers)
    with pytest.raises(AssertionError):
        numbers.check()


def test_summary_keeps_the_readme_keys_and_the_plot_draws():
    results = _results()
    s = sm.summary(results)
    assert s["concurrency"] == [1, 8]
    for key in ("before_ttft_p50_ms", "after_ttft_p50_ms", "before_tok_s", "after_tok_s"):
        assert len(s[key]) == 2
    assert len(s["runs"][sm.AFTER][8]) == 5
    fig = sm.plot_streams(results, {sm.BEFORE: "no manager", sm.AFTER: "manager"},
                          ("h200", {"metrics": {"concurrency": [1, 8], "after_tok_s": [100, 700]}}))
    assert len(fig.axes) == 2
    matplotlib.pyplot.close(fig)


def test_staircase(engine):
    stairs = sm.lock_staircase(engine, c=3, new_tokens=4)
    assert len(stairs.first_token_ms) == 3 and stairs.first_token_ms == sorted(stairs.first_token_ms)
    assert len(stairs.gaps_ms) == 2 and "gap to the next one" in str(stairs)
    sm.Staircase([10, 110, 210], [90, 90, 90]).check()
    with pytest.raises(AssertionError, match="take turns"):
        sm.Staircase([10, 12, 14], [90, 90, 90]).check()

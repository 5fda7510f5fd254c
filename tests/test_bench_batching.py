"""Notebook 03's arrival runs: the step clock skips idle gaps, and readings after a skip still line up."""

from __future__ import annotations

import pytest

from roseinfer.bench.batching import serve_continuous, serve_static
from roseinfer.bench.workloads import BenchRequest

# Four requests of 3 tokens (a prefill step and two decode steps each). Request 1 arrives while request 0 runs;
# by clock reading 6 both are done and nothing has arrived, so the clock skips to 10, where requests 2 and 3
# arrive one step apart.
ARRIVALS = [0, 1, 10, 11]
REQUESTS = [BenchRequest(prompt_token_ids=[11 + i, 12, 13], max_new_tokens=3) for i in range(4)]


@pytest.mark.parametrize("serve", [serve_static, serve_continuous])
def test_arrival_times_are_the_end_of_the_step_before_them(engine, serve):
    run = serve(engine, REQUESTS, ARRIVALS, batch_size=2)
    assert [len(t) for t in run.token_ids] == [3, 3, 3, 3]
    readings = [s.clock for s in run.steps]
    assert readings[0] == 0 and 10 in readings and not set(range(6, 10)) & set(readings)  # the gap was skipped
    for i, a in enumerate(ARRIVALS):
        last_before = max(k for k, r in enumerate(readings) if r < a) if a > 0 else None
        expected = run.steps[last_before].end_s if last_before is not None else 0.0
        assert run.arrival_s[i] == expected, (i, a, readings)
    # Request 1 arrived at reading 1, while the first step was the only one run: its arrival is that step's end,
    # not the start of the run (the clock's later skip must not shift readings taken before it).
    assert run.arrival_s[1] == run.steps[0].end_s > 0
    assert all(w >= 0 for w in run.queue_wait_ms)


def test_static_batching_denies_slots_before_and_after_a_skip(engine):
    run = serve_static(engine, REQUESTS, ARRIVALS, batch_size=2)
    # Request 0 runs alone in its static batch at readings 0-2; request 1 (arrived at 1) waits for it: one free
    # slot denied at readings 1 and 2. After the skip, request 2 runs alone at 10-12 and request 3 (arrived at 11)
    # waits: denied at 11 and 12.
    assert run.start_step == [0, 3, 10, 13]
    assert run.slots_denied == 4


def test_continuous_batching_denies_no_slot(engine):
    run = serve_continuous(engine, REQUESTS, ARRIVALS, batch_size=2)
    assert run.start_step == ARRIVALS  # each joins the running batch at the step it arrives
    assert run.slots_denied == 0

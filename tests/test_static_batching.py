"""Notebook 02's functions (roseinfer/bench/static_batching.py): the one-request loop, the runs, the fit."""

from __future__ import annotations

import pytest

from roseinfer import SamplingParams
from roseinfer.bench.diff import source_diff
from roseinfer.bench.static_batching import (
    Run,
    compare,
    fit_step,
    measure,
    measured_waste,
    metrics,
    run_once,
    wasted_fraction,
)
from roseinfer.bench.workloads import random_prompts
from roseinfer.config import ModelConfig
from roseinfer.history.one_request import OneRequestGenerator
from roseinfer.history.static_batching import StaticBatchGenerator

PEAKS = {"mem_bytes_s": 50e9, "matmul_flops": 200e9}


def test_one_request_loop_matches_the_engine_and_the_batch(engine):
    requests = random_prompts(3, (3, 9), (2, 7), seed=1)
    prompts = [r.prompt_token_ids for r in requests]
    params = [SamplingParams(max_new_tokens=r.max_new_tokens, stop_on_eos=False) for r in requests]
    expected = [out.token_ids for out in engine.generate(prompts, params)]
    alone = OneRequestGenerator(engine).generate(prompts, params)
    assert alone.token_ids == expected
    assert alone.steps == sum(r.max_new_tokens for r in requests)  # one step per token, one row each
    assert StaticBatchGenerator(engine, 3).generate(prompts, params).token_ids == expected
    assert engine.block_manager.num_used_blocks == 0


def test_the_diff_is_the_loop_over_rows():
    diff = source_diff(OneRequestGenerator._run_one, StaticBatchGenerator._run_group)
    assert "-            [token] = self.engine.runner.execute([entry])" in diff
    assert "+            tokens = self.engine.runner.execute(entries)" in diff


def test_runs_time_prefill_and_decode_apart(engine):
    requests = random_prompts(2, 6, 4, seed=0)
    (one, alone), (batch, batched) = (run_once(engine, requests, v) for v in ("one", "batch"))
    assert alone == batched and all(len(t) == 4 for t in alone)
    for run in (one, batch):
        assert run.tok_s > 0 and run.decode_tok_s > 0 and run.step_s > 0
        assert 0 < run.prefill_share < 1
    runs = measure(engine, requests, [1, 2], repeats=2)
    assert {v: {B: len(r) for B, r in sizes.items()} for v, sizes in runs.items()} == {
        "one": {1: 2, 2: 2}, "batch": {1: 2, 2: 2}}
    m = metrics(runs, [1, 2])
    assert len(m["before_tok_s"]) == len(m["after_tok_s"]) == 2 and set(m["after_runs"]) == {1, 2}
    assert engine.block_manager.num_used_blocks == 0


def _runs(tok_s: float, prefill_s: float) -> list[Run]:
    return [Run(tok_s * f, tok_s * f * 1.3, 0.01, prefill_s / f, 0.2) for f in (0.9, 0.95, 1.0, 1.05, 1.1)]


def test_compare_orients_every_verdict():
    runs = {"one": {1: _runs(50, 0.06), 8: _runs(50, 0.45)}, "batch": {1: _runs(51, 0.06), 8: _runs(200, 0.25)}}
    v = compare(runs, 1, 8)
    assert v["run"].better and v["decode"].better and v["prefill"].better and v["batch"].better
    assert not v["one"].significant  # the same runs at 1 and 8: flat
    assert "one at a time" in str(v["run"]) and "8 requests" in str(v["one"])


def test_fit_recovers_a_line_and_its_back_of_the_envelope():
    a, b = 0.010, 0.002
    step_s = {B: [(a + b * B) * f for f in (0.98, 1.0, 1.02)] for B in (1, 2, 4, 8)}
    fit = fit_step(step_s, ModelConfig(), 4, 40, PEAKS, resamples=200)
    assert fit.a == pytest.approx(a, rel=1e-6) and fit.b == pytest.approx(b, rel=1e-6)
    assert fit.a_range[0] < a < fit.a_range[1] and fit.b_range[0] < b < fit.b_range[1] and fit.resolved
    assert 400e6 < fit.weight_bytes < 600e6  # gpt2's weights in fp32, without a row's own bytes
    assert fit.row_flops == pytest.approx(2 * fit.weight_bytes / 4, rel=0.05)  # ~2 FLOPs per weight, per row
    assert "a / b, rows" in fit.table() and "GB/s" in fit.table()
    flat = fit_step({B: [0.02, 0.021, 0.019] for B in (1, 2, 4, 8)}, ModelConfig(), 4, 40, PEAKS, resamples=200)
    assert not flat.resolved and "b not resolved" in flat.table()


def test_wasted_fraction_is_what_the_static_batch_counts(engine):
    requests = random_prompts(4, 5, (2, 9), seed=3)
    lengths = [r.max_new_tokens for r in requests]
    assert len(set(lengths)) > 1
    assert measured_waste(engine, requests) == pytest.approx(wasted_fraction(lengths))
    assert wasted_fraction([21, 11, 10, 24, 25, 6, 18, 13]) == pytest.approx(72 / 192)

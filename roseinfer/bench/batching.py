"""Static batching (roseinfer.history) vs continuous batching (OnlineScheduler), on the same requests.

The core of benchmarks/benchmark_batching.py and notebooks 02 and 03. Each
runner returns (seconds, greedy tokens per request, info).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from roseinfer.bench.workloads import BenchRequest
from roseinfer.history.static_batching import StaticBatchGenerator
from roseinfer.sampling import SamplingParams


def _params(requests: list[BenchRequest]) -> list[SamplingParams]:
    return [SamplingParams(max_new_tokens=r.max_new_tokens, stop_on_eos=False) for r in requests]


def run_one_at_a_time(engine, requests: list[BenchRequest]) -> tuple[float, list[list[int]], dict[str, Any]]:
    """Before batching: each request runs alone, start to finish, then the next.

    No prefix cache: a repeated run would otherwise find its prompts' blocks cached and prefill less
    than the static batch it is compared with (which has no cache)."""
    start = time.perf_counter()
    tokens = [
        engine.generate([r.prompt_token_ids], p, enable_prefix_cache=False)[0].token_ids
        for r, p in zip(requests, _params(requests))
    ]
    return time.perf_counter() - start, tokens, {"steps": sum(r.max_new_tokens for r in requests)}


def run_static(
    engine, requests: list[BenchRequest], batch_size: int
) -> tuple[float, list[list[int]], dict[str, Any]]:
    start = time.perf_counter()
    stats = StaticBatchGenerator(engine, batch_size).generate(
        [r.prompt_token_ids for r in requests], _params(requests)
    )
    elapsed = time.perf_counter() - start
    return elapsed, stats.token_ids, {"steps": stats.steps, "wasted_fraction": stats.wasted_fraction}


def run_continuous(
    engine, requests: list[BenchRequest], batch_size: int
) -> tuple[float, list[list[int]], dict[str, Any]]:
    scheduler = engine.new_scheduler(max_batch_size=batch_size, enable_prefix_cache=False)
    start = time.perf_counter()
    rids = [
        engine.add_request(scheduler, prompt_token_ids=r.prompt_token_ids, params=p)
        for r, p in zip(requests, _params(requests))
    ]
    while scheduler.has_unfinished():
        engine.step(scheduler)
    elapsed = time.perf_counter() - start
    tokens = [scheduler.pop_response(r).token_ids for r in rids]
    return elapsed, tokens, {"steps": scheduler.kv_stats()["num_steps"], "wasted_fraction": 0.0}


# -- every forward step of a run, timed (notebooks 02 and 03) -------------------------------------


@dataclass
class StepRecord:
    start_s: float  # seconds since the run began
    end_s: float
    rows: int  # entries in the batch the runner computed
    sampled: int  # of which sampled a token (every row of a decode step)
    tokens: int = 0  # tokens fed in: more than `rows` when some row carries prompt tokens

    @property
    def has_prompt(self) -> bool:
        """A step that computes prompt tokens (prefill); a pure decode step feeds one token per row."""
        return self.tokens > self.rows

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


class StepClock:
    """Wraps the runner's execute for one run: records every forward step (seconds since the run began)."""

    def __init__(self, runner) -> None:
        self.runner, self.steps, self.t0 = runner, [], time.perf_counter()

    def __enter__(self) -> StepClock:
        original = self.runner.execute

        def execute(batch):
            start = time.perf_counter() - self.t0
            out = original(batch)
            sampled, tokens = sum(e.sample for e in batch), sum(len(e.token_ids) for e in batch)
            end = time.perf_counter() - self.t0
            self.steps.append(StepRecord(start, end, len(batch), sampled, tokens))
            return out

        self.runner.execute = execute  # an instance attribute: the class's method is untouched
        return self

    def __exit__(self, *exc) -> None:
        del self.runner.execute

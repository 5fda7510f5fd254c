"""Static batching (roseinfer.history) vs continuous batching (OnlineScheduler), on the same requests.

The core of benchmarks/benchmark_batching.py and notebooks 02 and 03. Each
runner returns (seconds, greedy tokens per request, info).
"""

from __future__ import annotations

import time
from typing import Any

from roseinfer.bench.workloads import BenchRequest
from roseinfer.engine.scheduler import OnlineScheduler
from roseinfer.history.static_batching import StaticBatchGenerator
from roseinfer.sampling import SamplingParams


def _params(requests: list[BenchRequest]) -> list[SamplingParams]:
    return [SamplingParams(max_new_tokens=r.max_new_tokens, stop_on_eos=False) for r in requests]


def run_one_at_a_time(engine, requests: list[BenchRequest]) -> tuple[float, list[list[int]], dict[str, Any]]:
    """Before batching: each request runs alone, start to finish, then the next."""
    start = time.perf_counter()
    tokens = [
        engine.generate([r.prompt_token_ids], p)[0].token_ids for r, p in zip(requests, _params(requests))
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
    scheduler = OnlineScheduler(engine, max_batch_size=batch_size, enable_prefix_cache=False)
    start = time.perf_counter()
    rids = [
        scheduler.add_request(prompt_token_ids=r.prompt_token_ids, params=p)
        for r, p in zip(requests, _params(requests))
    ]
    while scheduler.has_unfinished():
        scheduler.step()
    elapsed = time.perf_counter() - start
    tokens = [scheduler.pop_response(r).token_ids for r in rids]
    return elapsed, tokens, {"steps": scheduler.kv_stats()["num_steps"], "wasted_fraction": 0.0}

"""Notebook 10's analysis (roseinfer.bench.prefix_cache): runs on made-up numbers, the runners on the tiny engine."""

from __future__ import annotations

import math

import pytest

from roseinfer.bench.prefix_cache import (
    alone_and_capacity,
    envelope_table,
    hit_envelope,
    one_after_another,
    request_summary,
    request_table,
    run_p50s,
    stream_record,
    stream_runs,
    stream_verdicts,
)

BEFORE, AFTER = "no prefix cache", "prefix cache"


def fake_run(ttfts: list[float], cached: list[int]) -> dict:
    ordered = sorted(ttfts)
    return {"ttfts_ms": ttfts, "cached_tokens": cached, "ttft_ms": {"p50": ordered[len(ordered) // 2]},
            "kv": {"prefix_cache_hit_rate": sum(c > 0 for c in cached) / len(cached)}}


def fake_runs(before_ms: float, after_ms: float, n_runs: int = 5) -> dict:
    """Runs of 4 requests: without the cache all misses; with it, one miss (the first) then hits."""
    return {BEFORE: {f: [fake_run([before_ms * f + r] * 4, [0] * 4) for r in range(n_runs)] for f in (0.5, 0.9)},
            AFTER: {f: [fake_run([before_ms + r] + [after_ms + r] * 3, [0, 64, 64, 64]) for r in range(n_runs)]
                    for f in (0.5, 0.9)}}


def test_verdicts_compare_runs_and_say_which_way():
    runs = fake_runs(300, 40)
    p50s = run_p50s(runs)
    assert p50s[AFTER][0.5] == [40, 41, 42, 43, 44]
    verdicts = stream_verdicts(p50s, rate=7.0, capacity=6.3)
    assert list(verdicts) == [0.5, 0.9] and all(v.better for v in verdicts.values())
    assert verdicts[0.9].name.startswith("TTFT p50 at 0.9x (6.3 req/s, 1.00 of capacity)")
    assert len(verdicts[0.5].before) == 5  # the runs are the units, not the 20 requests
    same = stream_verdicts(run_p50s(fake_runs(40, 40)), rate=7.0, capacity=6.3)
    assert not same[0.5].better


def test_requests_pool_across_runs_hits_apart_from_misses():
    runs = fake_runs(300, 40)
    s = request_summary(runs[AFTER][0.5])
    assert (s["requests"], s["hits"]) == (20, 15)
    assert s["hit_p50"] == 42 and s["miss_p50"] == 302
    assert math.isnan(request_summary(runs[BEFORE][0.5])["hit_p50"])
    table = request_table(runs).splitlines()
    assert len(table) == 1 + 2 * 2 and table[0].split()[:2] == ["load", "variant"]
    assert table[1].split()[-3:] == ["0", "-", "152"]  # no hits without the cache: shown as "-"
    record = stream_record(runs)
    assert set(record[AFTER]) == {"0.5", "0.9"}
    assert record[AFTER]["0.5"]["hit_rate"] == [0.75] * 5 and len(record[BEFORE]["0.9"]["ttfts_ms"]) == 5


def test_envelope_of_a_gpt2_hit():
    from roseinfer.config import PRESETS

    peaks = {"matmul_flops": 221e9, "mem_bytes_s": 60e9}
    e = hit_envelope(PRESETS["gpt2"], 144, 128, t_full_ms=144.0, t_hit_ms=30.5, peaks=peaks)
    # 2 x 84.9M matmul parameters x 128 cached tokens = 21.7 GFLOP, plus 0.3 of attention
    assert e["skipped_gflop"] == pytest.approx(22.0, abs=0.1)
    assert e["full_gflop"] == pytest.approx(24.9, abs=0.1)
    assert e["predicted_saving_ms"] == pytest.approx(144 * e["skipped_gflop"] / e["full_gflop"])
    assert e["saving_ms"] == pytest.approx(113.5)
    assert e["hit_bound"] == "FLOPs" and e["hit_floor_ms"] == pytest.approx(13.0, abs=0.1)
    assert e["hit_gflop_s"] < e["full_gflop_s"]
    rows = envelope_table(e).splitlines()
    assert len(rows) == 4 and "floor 13.0 (FLOPs)" in rows[3]


def test_runners_on_the_tiny_engine(engine):
    from roseinfer.bench.workloads import shared_prefix_prompts
    from roseinfer.engine.scheduler import OnlineScheduler
    from roseinfer.history.no_prefix_cache import NoPrefixCacheScheduler
    from roseinfer.sampling import SamplingParams

    variants = {BEFORE: NoPrefixCacheScheduler, AFTER: OnlineScheduler}
    workload = shared_prefix_prompts(3, 32, 4, 2, num_prefixes=1, seed=0)
    params = [SamplingParams(max_new_tokens=r.max_new_tokens, stop_on_eos=False) for r in workload]
    (tokens_b, computed_b), (tokens_a, computed_a) = (one_after_another(engine, workload, params, c)
                                                      for c in variants.values())
    assert tokens_b == tokens_a and computed_b == [36] * 3 and computed_a == [36, 4, 4]
    alone, burst = alone_and_capacity(engine, variants, workload, params, num_prefixes=1, repeats=1)
    assert [len(v) for v in alone.values()] == [1, 1] and len(burst) == 1 and burst[0] > 0
    runs, stalled = stream_runs(engine, variants, workload, params, [1.0], rate=200.0, repeats=1)
    assert stalled == [] and [len(runs[n][1.0]) for n in variants] == [1, 1]
    assert sum(runs[AFTER][1.0][0]["cached_tokens"]) > 0 and sum(runs[BEFORE][1.0][0]["cached_tokens"]) == 0

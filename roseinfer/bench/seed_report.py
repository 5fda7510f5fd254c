"""The summary blocks the seed blog posts print, with their line names and units.

A reader who follows the posts sets our numbers beside theirs line by line,
so `benchmark_streaming` and `benchmark_scheduler` print these blocks (and
also write the JSON result files). Percentiles are the ones of
roseinfer.bench.metrics; times in ms unless the line says otherwise.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def _p50_95_99(stats: dict[str, float], unit: str = "ms") -> str:
    return f"{stats['p50']:.2f}/{stats['p95']:.2f}/{stats['p99']:.2f} {unit}"


def _p50_mean(values: Sequence[float], scale: float = 1.0, digits: int = 2) -> str:
    return f"{statistics.median(values) * scale:.{digits}f}/{statistics.mean(values) * scale:.{digits}f}"


def nvtx_line(engine) -> str:
    if engine.describe()["nvtx"]:
        return "NVTX: True"
    if engine.config.nvtx:
        return f"NVTX: False (asked for; NVTX is a CUDA feature, off on {engine.device})"
    return "NVTX: False"


def streaming_block(model: str, engine, setup, m: dict[str, Any]) -> str:
    """`=== streaming benchmark ===` for one run's metrics (roseinfer.bench.streaming)."""
    info = engine.describe()
    lines = [
        "=== streaming benchmark ===",
        f"Model: {model}",
        f"Weights: {info['weights']}",
        f"Device: {engine.device}",
        f"Pretok: {setup.pretok}",
        f"Tokenize workers: {setup.tokenize_workers}",
        f"Paged attention: {info['paged_attention_kernel']} ({info['attention_backend']} backend)",
        f"CUDA Graph: {info['cuda_graph']}",
        nvtx_line(engine),
        f"Requests: {m['num_requests']}",
        f"Prompt tokens (total): {m['total_prompt_tokens']}",
        f"Completion tokens (total): {m['total_output_tokens']}",
        f"Submit wall: {m['submit_wall_s']:.6f} s",
    ]
    if setup.submit_interval_ms > 0:
        lines += [
            f"Submit interval/schedule: {setup.submit_interval_ms:.3f} ms / {setup.submit_schedule}",
            f"Submit lag p50/p95/p99: {_p50_95_99(m['submit_lag_ms'])}",
        ]
    lines += [
        f"add_request latency p50/p95/p99: {_p50_95_99(m['add_request_ms'])}",
        f"Tokenize p50/p95/p99: {_p50_95_99(m['tokenize_ms'])}",
        f"Queue wait (post-tok) p50/p95/p99: {_p50_95_99(m['queue_wait_ms'])}",
        f"Prefill->first token p50/p95/p99: {_p50_95_99(m['prefill_to_first_token_ms'])}",
        f"TTFT p50/p95/p99: {_p50_95_99(m['ttft_ms'])}",
        f"TPOT p50/p95/p99: {_p50_95_99(m['tpot_ms'], 'ms/token')}",
        f"ITL p50/p95/p99: {_p50_95_99(m['itl_ms'])}",
        f"Latency p50/p95/p99: {_p50_95_99(m['e2e_latency_ms'])}",
        f"Throughput (completion,total): {m['output_throughput_tok_s']:.2f} tokens/s",
    ]
    return "\n".join(lines)


def scheduler_summary(mode: str, runs: Sequence[dict[str, Any]], warmup_runs: int) -> str:
    """`=== <mode> summary ===` over the measured runs of roseinfer.bench.scheduler_modes.run_mode."""

    def each(key: str, stat: str | None = None) -> list[float]:
        return [r[key][stat] if stat else r[key] for r in runs]

    return "\n".join(
        [
            f"=== {mode} summary ===",
            f"Warmup runs: {warmup_runs}",
            f"Measured runs: {len(runs)}",
            f"Decode time p50/mean: {_p50_mean(each('decode_time_s'), digits=6)} s",
            f"Total time p50/mean: {_p50_mean(each('total_time_s'), digits=6)} s",
            f"Throughput(completion,decode) p50/mean: {_p50_mean(each('completion_tok_s_over_decode'))} tokens/s",
            f"Throughput(completion,total) p50/mean: {_p50_mean(each('completion_tok_s_over_total'))} tokens/s",
            f"TTFT p50/mean: {_p50_mean(each('ttft_ms', 'p50'))} ms",
            f"TPOT p50/mean: {_p50_mean(each('tpot_ms', 'p50'))} ms/token",
            f"Latency p50/mean: {_p50_mean(each('e2e_latency_ms', 'p50'))} ms",
        ]
    )

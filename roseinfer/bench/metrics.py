"""Latency and throughput metrics, defined as vLLM's serving benchmark defines them.

Per request, from its start time, the time of each output token and its end:
- TTFT: start -> first token;
- TPOT: (latency - TTFT) / (output tokens - 1), for requests with 2+ tokens;
- ITL: every gap between consecutive tokens (pooled over all requests);
- E2E latency: start -> last token;
- queue wait: start -> first scheduled (when the runner reports it).

`summarize` gives mean, p50, p95, p99 (and min/max) of a list, in the unit
of the caller's choice; benchmarks report milliseconds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not values:
        return math.nan
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def summarize(values: Iterable[float], scale: float = 1.0) -> dict[str, float]:
    data = [v * scale for v in values]
    if not data:
        return {
            "mean": math.nan,
            "p50": math.nan,
            "p95": math.nan,
            "p99": math.nan,
            "min": math.nan,
            "max": math.nan,
            "n": 0,
        }
    return {
        "mean": sum(data) / len(data),
        "p50": percentile(data, 50),
        "p95": percentile(data, 95),
        "p99": percentile(data, 99),
        "min": min(data),
        "max": max(data),
        "n": len(data),
    }


@dataclass
class RequestRecord:
    """What one request went through; times are seconds on one monotonic clock."""

    start: float
    token_times: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    end: float | None = None
    scheduled: float | None = None  # first scheduler step that included it
    extra: dict[str, float] = field(default_factory=dict)  # stage stamps (submit lag, tokenize, ...)

    @property
    def output_tokens(self) -> int:
        return len(self.token_times)

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.start if self.token_times else None

    @property
    def latency(self) -> float | None:
        last = self.end if self.end is not None else (self.token_times[-1] if self.token_times else None)
        return None if last is None else last - self.start

    @property
    def tpot(self) -> float | None:
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)

    @property
    def itls(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]

    @property
    def queue_wait(self) -> float | None:
        return None if self.scheduled is None else max(0.0, self.scheduled - self.start)


def request_metrics(records: Sequence[RequestRecord], duration_s: float) -> dict[str, Any]:
    """The standard block every benchmark writes: latencies in ms, throughputs per second."""
    ms = 1000.0
    output_tokens = sum(r.output_tokens for r in records)
    return {
        "num_requests": len(records),
        "duration_s": duration_s,
        "total_output_tokens": output_tokens,
        "total_prompt_tokens": sum(r.prompt_tokens for r in records),
        "request_throughput_req_s": len(records) / duration_s if duration_s > 0 else math.nan,
        "output_throughput_tok_s": output_tokens / duration_s if duration_s > 0 else math.nan,
        "ttft_ms": summarize((r.ttft for r in records if r.ttft is not None), ms),
        "tpot_ms": summarize((r.tpot for r in records if r.tpot is not None), ms),
        "itl_ms": summarize((gap for r in records for gap in r.itls), ms),
        "e2e_latency_ms": summarize((r.latency for r in records if r.latency is not None), ms),
        "queue_wait_ms": summarize((r.queue_wait for r in records if r.queue_wait is not None), ms),
    }


def median_run(runs: Sequence[dict[str, Any]], key: str = "output_throughput_tok_s") -> dict[str, Any]:
    """The run whose `key` is the median (for an odd count; the lower middle otherwise)."""
    ordered = sorted(runs, key=lambda r: r[key])
    return ordered[(len(ordered) - 1) // 2]


def spread(runs: Sequence[dict[str, Any]], path: Sequence[str]) -> dict[str, float]:
    """min / median / max of one metric (a key path into each run) across repeated runs."""
    values = []
    for run in runs:
        v: Any = run
        for k in path:
            v = v[k]
        values.append(float(v))
    return {"min": min(values), "median": percentile(values, 50), "max": max(values), "runs": values}

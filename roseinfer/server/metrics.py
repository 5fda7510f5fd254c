"""Prometheus metrics, named as vLLM names them (roseinfer: instead of vllm:).

Gauges, and the prefix cache's counters (the scheduler's running totals), are
read from the manager's last-step snapshot when /metrics is scraped; the other
counters and the histograms are fed once per finished request, so the worker's
hot loop does no metrics work per token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily

from roseinfer.engine.sequence import RequestMetrics
from roseinfer.server.streams import RequestStream

disable_created_metrics()  # no *_created series: timestamps nobody graphs

LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
TOKEN_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)


class SnapshotCounters:
    """Counters whose totals the scheduler keeps (prefix-cache lookups): reported from the snapshot at each scrape,
    as vLLM's vllm:prefix_cache_queries / vllm:prefix_cache_hits (exposed with _total)."""

    COUNTERS = (
        ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache"),
        ("prefix_cache_hits", "Prompt tokens found in the prefix cache (their prefill skipped)"),
    )

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self._stats = stats

    def collect(self):
        stats = self._stats()
        for key, text in self.COUNTERS:
            yield CounterMetricFamily(f"roseinfer:{key}", text, value=float(stats.get(key, 0)))


class ServerMetrics:
    def __init__(self, stats: Callable[[], dict[str, Any]] | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._stats = stats or dict
        running = Gauge("roseinfer:num_requests_running", "Requests in the running batch", registry=r)
        waiting = Gauge("roseinfer:num_requests_waiting", "Requests queued for admission", registry=r)
        usage = Gauge("roseinfer:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1)", registry=r)
        running.set_function(lambda: self._stats().get("num_running", 0))
        waiting.set_function(lambda: self._stats().get("num_waiting", 0))
        usage.set_function(lambda: self._stats().get("kv_cache_usage", 0.0))
        healthy = Gauge(
            "roseinfer:engine_healthy", "1 while the engine worker can serve, 0 once it failed", registry=r
        )
        healthy.set_function(lambda: float(self._stats().get("healthy", True)))
        r.register(SnapshotCounters(lambda: self._stats()))
        self.prompt_tokens = Counter("roseinfer:prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("roseinfer:generation_tokens", "Tokens generated", registry=r)
        self.request_success = Counter(
            "roseinfer:request_success", "Finished requests", ["finished_reason"], registry=r
        )
        self.ttft = Histogram(
            "roseinfer:time_to_first_token_seconds",
            "Arrival to first token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "roseinfer:inter_token_latency_seconds",
            "Gap between consecutive tokens",
            buckets=TOKEN_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "roseinfer:e2e_request_latency_seconds",
            "Arrival to last token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "roseinfer:request_queue_time_seconds",
            "Arrival to first scheduled",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def bind(self, stats: Callable[[], dict[str, Any]]) -> None:
        self._stats = stats

    def on_finished(self, stream: RequestStream, metrics: RequestMetrics) -> None:
        t = stream.timings
        self.prompt_tokens.inc(len(stream.prompt_token_ids))
        self.generation_tokens.inc(stream.num_tokens)
        self.request_success.labels(stream.finish_reason or "unknown").inc()
        if t.first_token is not None:
            self.ttft.observe(t.first_token - t.submit)
        for before, after in zip(t.token_times, t.token_times[1:]):
            self.itl.observe(after - before)
        if t.finished is not None:
            self.e2e.observe(t.finished - t.submit)
        if t.scheduled is not None:
            self.queue_time.observe(max(0.0, t.scheduled - t.submit))

    def render(self) -> bytes:
        return generate_latest(self.registry)

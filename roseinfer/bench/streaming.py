"""Streaming through a manager variant in-process: the core of benchmark_streaming.py and notebooks 04-07.

Requests are submitted on a schedule by one thread; each gets its own
consumer thread that reads its stream the way an HTTP handler would.

Where a request's time goes: submit lag (late against its schedule),
add_request latency, tokenize time, queue wait after tokenization
(tokenized -> first scheduled), prefill -> first token; then TTFT and E2E as the consumer sees them, TPOT
((E2E - TTFT) / (tokens - 1)) and ITL (gaps between tokens as the worker
produced them).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import Any

from roseinfer.bench.metrics import RequestRecord, request_metrics, summarize
from roseinfer.history import make_manager
from roseinfer.sampling import SamplingParams

STAGES = ("submit_lag", "add_request", "tokenize", "queue_wait", "prefill_to_first_token")
# A request's TTFT cut into stages that do not overlap (add_request above holds tokenize when it runs
# inline): per request they add up to the TTFT exactly, so their means add up to the mean TTFT
# (medians do not add). submit -> add_request entered -> tokenized -> first step with it -> first
# token sampled -> first piece in the consumer thread.
TTFT_PARTITION = ("enter_add_request", "tokenize", "queue_wait", "prefill_to_first_token", "delivery")


@dataclass
class StreamingSetup:
    num_requests: int = 16
    prompt: str = "Hello"
    pretok: bool = False
    max_new_tokens: int = 32
    stop_on_eos: bool = True
    submit_interval_ms: float = 0.0
    submit_schedule: str = (
        "absolute"  # "absolute": request i at t0 + i*interval; "relative": after the previous
    )
    # "absolute" only: each request i is shifted by a random 0..jitter ms (seeded), so arrivals do not fall
    # into step with a worker's own cycle (notebook 05's polling naps)
    submit_jitter_ms: float = 0.0
    stream_interval: int = 1
    tokenize_workers: int = 0  # 0: tokenize in the submitting thread; N: in the manager's pool of N
    max_batch_size: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_cache: bool = True


def run_streaming(
    engine, variant: str, setup: StreamingSetup, manager_hook=None
) -> tuple[dict[str, Any], list[str]]:
    """Serve setup.num_requests streams through `variant`; returns (metrics, streamed texts).

    `manager_hook(manager)` runs before the first request (instrumentation).
    """
    args = setup
    prompt_ids = engine.tokenizer.encode(setup.prompt)
    manager = make_manager(
        variant,
        engine,
        max_batch_size=args.max_batch_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_cache=args.enable_prefix_cache,
        stream_interval=args.stream_interval,
        tokenize_workers=args.tokenize_workers,
    )
    if manager_hook is not None:
        manager_hook(manager)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, stop_on_eos=args.stop_on_eos)
    records: list[RequestRecord] = []
    texts: list[str] = [""] * args.num_requests
    consumers: list[threading.Thread] = []

    def consume(i: int, stream, record: RequestRecord) -> None:
        pieces = []
        for piece in stream.pieces(timeout=600):
            if not record.extra.get("first_piece"):
                record.extra["first_piece"] = time.perf_counter()
            pieces.append(piece)
        record.end = time.perf_counter()
        texts[i] = "".join(pieces)

    interval = args.submit_interval_ms / 1000.0
    jitter = random.Random(0)
    try:
        t0 = time.perf_counter()
        for i in range(args.num_requests):
            due = t0 + i * interval + jitter.uniform(0.0, args.submit_jitter_ms / 1000.0)
            if args.submit_schedule == "absolute":
                time.sleep(max(0.0, due - time.perf_counter()))
            elif i:
                time.sleep(interval)
                due = time.perf_counter()
            start = time.perf_counter()
            if args.pretok:
                stream = manager.submit(prompt_token_ids=prompt_ids, params=params)
            else:
                stream = manager.submit(prompt=args.prompt, params=params)
            record = RequestRecord(start=start, prompt_tokens=len(prompt_ids))
            record.extra.update(submit_lag=start - due, add_request=time.perf_counter() - start)
            records.append(record)
            consumer = threading.Thread(target=consume, args=(i, stream, record), daemon=True)
            consumer.start()
            consumers.append((consumer, stream, record))
        submit_wall = time.perf_counter() - t0
        for consumer, _, _ in consumers:
            consumer.join()
        duration = time.perf_counter() - t0
    finally:
        manager.close()
    metrics = _streaming_metrics([(stream, record) for _, stream, record in consumers], duration)
    metrics["submit_wall_s"] = submit_wall
    metrics["idle_wakeups"] = getattr(manager, "num_idle_wakeups", None)
    return metrics, texts


def _streaming_metrics(served: list[tuple[Any, RequestRecord]], duration: float) -> dict[str, Any]:
    """Request metrics, as the consumer saw them, plus where each request's time went (STAGES)."""
    records = [record for _, record in served]
    for stream, record in served:
        t = stream.timings
        record.token_times = list(t.token_times)
        record.scheduled = t.scheduled
        record.extra.update(
            tokenize=t.tokenized - t.submit,
            queue_wait=(t.scheduled - t.tokenized) if t.scheduled is not None else float("nan"),
            prefill_to_first_token=(t.first_token - t.scheduled)
            if t.scheduled and t.first_token
            else float("nan"),
            enter_add_request=t.submit - record.start,
            delivery=(record.extra["first_piece"] - t.first_token) if t.first_token else float("nan"),
        )
    metrics = request_metrics(records, duration)
    # TTFT, TPOT and E2E as the consumer sees them (the first piece, the end of the stream).
    client_ttft = [r.extra["first_piece"] - r.start for r in records]
    client_e2e = [r.end - r.start for r in records]
    n_out = [r.output_tokens for r in records]
    metrics["ttft_ms"] = summarize(client_ttft, 1000)
    metrics["e2e_latency_ms"] = summarize(client_e2e, 1000)
    metrics["tpot_ms"] = summarize(
        ((e - f) / (n - 1) for e, f, n in zip(client_e2e, client_ttft, n_out) if n > 1), 1000
    )
    for stage in dict.fromkeys(STAGES + TTFT_PARTITION):  # each once
        metrics[f"{stage}_ms"] = summarize((r.extra[stage] for r in records), 1000)
    return metrics

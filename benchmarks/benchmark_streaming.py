"""Streaming through a SchedulerManager (or an earlier version), in-process.

Requests are submitted on a schedule by one thread; each gets its own
consumer thread that reads its stream the way an HTTP handler would.

    python benchmarks/benchmark_streaming.py --num-requests 16 --max-new-tokens 32
    # the reference workload (a GPU, every feature on):
    python benchmarks/benchmark_streaming.py --device cuda --num-requests 64 --prompt Hello --pretok \
        --stream-interval 8 --submit-interval-ms 20 --submit-schedule absolute --max-batch-size 64 \
        --max-new-tokens 128 --no-stop-on-eos --no-prefix-cache --variant all

Where a request's time goes: submit lag (late against its schedule),
add_request latency, tokenize time, queue wait (submitted -> first scheduled),
prefill -> first token, then TTFT and E2E as the consumer sees them, TPOT
((E2E - TTFT) / (tokens - 1)) and ITL (gaps between tokens as the worker
produced them). Writes results/<device>/streaming-<variant>.json.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from roseinfer import SamplingParams
from roseinfer.bench.metrics import RequestRecord, median_run, request_metrics, spread, summarize
from roseinfer.bench.results import make_result, results_dir, write_json
from roseinfer.cli import add_engine_args, add_model_args, engine_from_args
from roseinfer.history import MANAGER_VARIANTS, make_manager

STAGES = ("submit_lag", "add_request", "tokenize", "queue_wait", "prefill_to_first_token")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    add_engine_args(p)
    w = p.add_argument_group("workload")
    w.add_argument("--num-requests", type=int, default=16)
    w.add_argument("--prompt", default="Hello")
    w.add_argument("--pretok", action="store_true", help="tokenize before submitting (else add_request tokenizes)")
    w.add_argument("--max-new-tokens", type=int, default=32)
    w.add_argument("--no-stop-on-eos", action="store_true")
    w.add_argument("--submit-interval-ms", type=float, default=0.0, help="gap between submissions")
    w.add_argument("--submit-schedule", choices=["relative", "absolute"], default="absolute",
                   help="absolute: request i at t0 + i*interval; relative: interval after the previous submit")
    w.add_argument("--stream-interval", type=int, default=1, help="flush every N tokens")
    w.add_argument("--variant", nargs="+", default=["current"], choices=[*MANAGER_VARIANTS, "all"])
    r = p.add_argument_group("runs")
    r.add_argument("--warmup-runs", type=int, default=1)
    r.add_argument("--repeat-runs", type=int, default=3)
    r.add_argument("--output-json", default=None, help="with one variant: write here instead of results/")
    return p


def run_once(engine, args, variant: str, prompt_ids: list[int]) -> tuple[dict[str, Any], list[str]]:
    manager = make_manager(variant, engine, max_batch_size=args.max_batch_size,
                           max_num_batched_tokens=args.max_num_batched_tokens,
                           enable_prefix_cache=not args.no_prefix_cache, stream_interval=args.stream_interval)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, stop_on_eos=not args.no_stop_on_eos)
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
    try:
        t0 = time.perf_counter()
        for i in range(args.num_requests):
            due = t0 + i * interval
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
        for consumer, _, _ in consumers:
            consumer.join()
        duration = time.perf_counter() - t0
    finally:
        manager.close()
    for _, stream, record in consumers:
        t = stream.timings
        record.token_times = list(t.token_times)
        record.scheduled = t.scheduled
        record.extra.update(
            tokenize=t.tokenized - t.submit,
            queue_wait=(t.scheduled - t.submit) if t.scheduled is not None else float("nan"),
            prefill_to_first_token=(t.first_token - t.scheduled) if t.scheduled and t.first_token else float("nan"),
        )
    metrics = request_metrics(records, duration)
    # TTFT, TPOT and E2E as the consumer sees them (the first piece, the end of the stream).
    client_ttft = [r.extra["first_piece"] - r.start for r in records]
    client_e2e = [r.end - r.start for r in records]
    n_out = [r.output_tokens for r in records]
    metrics["ttft_ms"] = summarize(client_ttft, 1000)
    metrics["e2e_latency_ms"] = summarize(client_e2e, 1000)
    metrics["tpot_ms"] = summarize(((e - f) / (n - 1) for e, f, n in zip(client_e2e, client_ttft, n_out) if n > 1), 1000)
    for stage in STAGES:
        metrics[f"{stage}_ms"] = summarize((r.extra[stage] for r in records), 1000)
    metrics["idle_wakeups"] = getattr(manager, "num_idle_wakeups", None)
    return metrics, texts


def report(variant: str, m: dict[str, Any]) -> None:
    print(f"[{variant}] {m['num_requests']} requests, {m['total_output_tokens']} tokens in {m['duration_s']:.2f}s: "
          f"{m['output_throughput_tok_s']:.1f} tok/s")
    for key in (*[f"{s}_ms" for s in STAGES], "ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms"):
        s = m[key]
        print(f"  {key:<27} p50 {s['p50']:9.3f}  p95 {s['p95']:9.3f}  p99 {s['p99']:9.3f}")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    variants = list(MANAGER_VARIANTS) if "all" in args.variant else args.variant
    engine = engine_from_args(args)
    prompt_ids = engine.tokenizer.encode(args.prompt)
    for _ in range(args.warmup_runs):
        for variant in variants:
            run_once(engine, args, variant, prompt_ids)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    reference_texts = None
    for _ in range(args.repeat_runs):
        for variant in variants:  # interleaved, so a noisy neighbour hits all variants alike
            metrics, texts = run_once(engine, args, variant, prompt_ids)
            if reference_texts is None:
                reference_texts = texts
            if texts != reference_texts:
                raise SystemExit(f"variant {variant} streamed different text: greedy outputs must match")
            runs[variant].append(metrics)
    config = {k: v for k, v in vars(args).items() if k not in ("output_json", "variant")} | {"engine": engine.describe()}
    for variant in variants:
        best = median_run(runs[variant])
        report(variant, best)
        best["throughput_spread"] = spread(runs[variant], ["output_throughput_tok_s"])
        best["ttft_p50_spread"] = spread(runs[variant], ["ttft_ms", "p50"])
        best["tpot_p50_spread"] = spread(runs[variant], ["tpot_ms", "p50"])
        out = args.output_json if args.output_json and len(variants) == 1 else (
            results_dir(args.device) / f"streaming-{variant}.json")
        write_json(out, make_result("streaming", variant, config, best, args.device))
        print(f"  wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

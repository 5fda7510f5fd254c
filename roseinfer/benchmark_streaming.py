"""`python -m roseinfer.benchmark_streaming`: streaming through a SchedulerManager (or an earlier version), in-process.

The timing breakdown is described in roseinfer.bench.streaming.

    python -m roseinfer.benchmark_streaming --num-requests 16 --max-new-tokens 32
    # the seed post's workload, as it printed it (on a GPU: --device cuda):
    python -m roseinfer.benchmark_streaming --hf-model-id gpt2 --device cpu --prompt "Hello" --pretok \
        --tokenize-workers 0 --stream-interval 8 --num-requests 64 --warmup-runs 1 --repeat-runs 1 \
        --submit-interval-ms 20 --submit-schedule absolute --max-batch-size 64 --prefill-max-batch-size 64 \
        --max-new-tokens 128 --no-stop-on-eos --no-prefix-cache

Prints the seed post's `=== streaming benchmark ===` block for the median run
of each variant and writes results/<device>/streaming-<variant>.json.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from roseinfer.bench.metrics import median_run, spread
from roseinfer.bench.results import make_result, results_dir, write_json
from roseinfer.bench.seed_report import streaming_block
from roseinfer.bench.streaming import StreamingSetup, run_streaming
from roseinfer.cli import add_engine_args, command_parser, engine_from_args, scheduler_options
from roseinfer.history import MANAGER_VARIANTS


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("python -m roseinfer.benchmark_streaming", __doc__)
    add_engine_args(p)
    w = p.add_argument_group("workload")
    w.add_argument("--num-requests", type=int, default=16)
    w.add_argument("--prompt", default="Hello")
    w.add_argument(
        "--pretok", action="store_true", help="tokenize before submitting (else add_request tokenizes)"
    )
    w.add_argument("--max-new-tokens", type=int, default=32)
    w.add_argument("--no-stop-on-eos", action="store_true")
    w.add_argument("--submit-interval-ms", type=float, default=0.0, help="gap between submissions")
    w.add_argument(
        "--submit-schedule",
        choices=["relative", "absolute"],
        default="absolute",
        help="absolute: request i at t0 + i*interval; relative: interval after the previous submit",
    )
    w.add_argument("--stream-interval", type=int, default=1, help="flush every N tokens")
    w.add_argument(
        "--tokenize-workers",
        type=int,
        default=0,
        help="tokenize in the manager's pool of N threads (0: in the submitting thread)",
    )
    w.add_argument("--variant", nargs="+", default=["current"], choices=[*MANAGER_VARIANTS, "all"])
    r = p.add_argument_group("runs")
    r.add_argument("--warmup-runs", type=int, default=1)
    r.add_argument("--repeat-runs", type=int, default=3)
    r.add_argument("--output-json", default=None, help="with one variant: write here instead of results/")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(message)s", stream=sys.stderr
    )  # which weights, downloads
    if args.tokenize_workers < 0:
        raise SystemExit("--tokenize-workers must be >= 0")
    variants = list(MANAGER_VARIANTS) if "all" in args.variant else args.variant
    engine = engine_from_args(args)
    setup = StreamingSetup(
        num_requests=args.num_requests,
        prompt=args.prompt,
        pretok=args.pretok,
        max_new_tokens=args.max_new_tokens,
        stop_on_eos=not args.no_stop_on_eos,
        submit_interval_ms=args.submit_interval_ms,
        submit_schedule=args.submit_schedule,
        stream_interval=args.stream_interval,
        tokenize_workers=args.tokenize_workers,
        **scheduler_options(args),
    )
    for _ in range(args.warmup_runs):
        for variant in variants:
            run_streaming(engine, variant, setup)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    reference_texts = None
    for _ in range(args.repeat_runs):
        for variant in variants:  # interleaved, so a noisy neighbour hits all variants alike
            metrics, texts = run_streaming(engine, variant, setup)
            if reference_texts is None:
                reference_texts = texts
            if texts != reference_texts:
                raise SystemExit(f"variant {variant} streamed different text: greedy outputs must match")
            runs[variant].append(metrics)
    config = {k: v for k, v in vars(args).items() if k not in ("output_json", "variant")} | {
        "engine": engine.describe()
    }
    for variant in variants:
        best = median_run(runs[variant])
        if len(variants) > 1:
            print(f"--- variant: {variant} ---")
        print(streaming_block(args.hf_model_id or args.model, engine, setup, best))
        best["throughput_spread"] = spread(runs[variant], ["output_throughput_tok_s"])
        best["ttft_p50_spread"] = spread(runs[variant], ["ttft_ms", "p50"])
        best["tpot_p50_spread"] = spread(runs[variant], ["tpot_ms", "p50"])
        out = (
            args.output_json
            if args.output_json and len(variants) == 1
            else (results_dir(args.device) / f"streaming-{variant}.json")
        )
        write_json(out, make_result("streaming", variant, config, best, args.device))
        print(f"  wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m roseinfer.benchmark_scheduler`: engine and OnlineScheduler throughput and latency, in three modes.

    naive    each request alone, one after another (engine.generate of one prompt)
    offline  every request queued at t=0, stepped to completion (peak throughput)
    online   requests arrive over time (--request-rate, Poisson) while the scheduler steps

    python -m roseinfer.benchmark_scheduler --model gpt2 --num-requests 32 --max-new-tokens 64 --mode all
    python -m roseinfer.benchmark_scheduler --device cuda --dtype bfloat16 --workload random \
        --input-len 256 --max-new-tokens 64 --num-requests 128 --max-batch-size 128 --no-stop-on-eos --mode offline
    # the seed post's command, as it printed it:
    python -m roseinfer.benchmark_scheduler --hf-model-id gpt2 --device cpu --prompt "Hello" \
        --num-requests 8 --max-new-tokens 8 --mode online --warmup-runs 0 --repeat-runs 1

Decode time is the time spent in steps that computed no prompt token; the
completion throughput is reported over it and over the total (see
roseinfer.bench.scheduler_modes). Prints the seed post's `=== <mode> summary ===`
block for each mode and writes results/<device>/scheduler[-<mode>].json unless
--output-json says otherwise.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from roseinfer import SamplingParams
from roseinfer.bench.metrics import median_run, spread
from roseinfer.bench.results import make_result, results_dir, write_json
from roseinfer.bench.roofline import continuous_batching_floor, measure_peaks
from roseinfer.bench.scheduler_modes import MODES, SchedulerSetup, run_mode
from roseinfer.bench.seed_report import scheduler_summary
from roseinfer.bench.workloads import BenchRequest, fixed_prompt, mixed_output_lengths, random_prompts
from roseinfer.cli import add_engine_args, command_parser, engine_from_args, scheduler_options


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("python -m roseinfer.benchmark_scheduler", __doc__)
    add_engine_args(p)
    w = p.add_argument_group("workload")
    w.add_argument("--mode", nargs="+", default=["offline"], choices=[*MODES, "all"])
    w.add_argument(
        "--workload",
        default="prompt",
        choices=["prompt", "random", "mixed"],
        help="prompt: --prompt/--prompts text; random: --input-len tokens; mixed: output lengths 8..max",
    )
    w.add_argument("--prompt", default="Hello", help="the prompt of every request (workload 'prompt')")
    w.add_argument("--prompts", default=None, help="a file with one prompt per line, used in turn")
    w.add_argument(
        "--pretok", action="store_true", help="tokenize before timing (else tokenization is timed)"
    )
    w.add_argument("--input-len", type=int, default=128, help="prompt tokens (workload 'random')")
    w.add_argument("--num-requests", type=int, default=16)
    w.add_argument("--max-new-tokens", type=int, default=64)
    w.add_argument(
        "--request-rate", type=float, default=float("inf"), help="online mode: requests/s (inf = all at once)"
    )
    s = p.add_argument_group("sampling")
    s.add_argument("--temperature", type=float, default=0.0)
    s.add_argument("--top-k", type=int, default=0)
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--seed", type=int, default=0, help="workload and sampling seed")
    s.add_argument("--no-stop-on-eos", action="store_true")
    r = p.add_argument_group("runs")
    r.add_argument("--warmup-runs", type=int, default=1)
    r.add_argument("--repeat-runs", type=int, default=3)
    r.add_argument("--output-json", default=None)
    return p


def make_workload(args, tokenizer) -> list[BenchRequest]:
    if args.workload == "random":
        return random_prompts(args.num_requests, args.input_len, args.max_new_tokens, args.seed)
    if args.workload == "mixed":
        return mixed_output_lengths(args.num_requests, (16, 64), (8, args.max_new_tokens), args.seed)
    texts = [args.prompt]
    if args.prompts:
        with open(args.prompts, encoding="utf-8") as f:
            texts = [line.rstrip("\n") for line in f if line.strip()]
    return [
        fixed_prompt(tokenizer, texts[i % len(texts)], 1, args.max_new_tokens)[0]
        for i in range(args.num_requests)
    ]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(message)s", stream=sys.stderr
    )  # which weights, downloads
    modes = list(MODES) if "all" in args.mode else args.mode
    engine = engine_from_args(args)
    workload = make_workload(args, engine.tokenizer)
    params = [
        SamplingParams(
            max_new_tokens=r.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=None if args.temperature == 0 else args.seed + i,
            stop_on_eos=not args.no_stop_on_eos,
        )
        for i, r in enumerate(workload)
    ]
    setup = SchedulerSetup(
        **scheduler_options(args),
        pretok=args.pretok,
        request_rate=args.request_rate,
        seed=args.seed,
    )
    for _ in range(args.warmup_runs):
        run_mode(engine, setup, "offline", workload[: min(4, len(workload))], params)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for _ in range(args.repeat_runs):
        for mode in modes:  # interleaved: drift on a shared machine hits every mode alike
            runs[mode].append(run_mode(engine, setup, mode, workload, params))
    peaks = measure_peaks(str(engine.device), engine.dtype)
    floor = continuous_batching_floor(
        engine.model_config,
        [len(r.prompt_token_ids) for r in workload],
        [r.max_new_tokens for r in workload],
        args.max_batch_size,
        engine.dtype.itemsize,
        peaks,
    )
    config = {k: v for k, v in vars(args).items() if k != "output_json"} | {"engine": engine.describe()}
    for mode in modes:
        best = median_run(runs[mode], "completion_tok_s_over_total")
        print(scheduler_summary(mode, runs[mode], args.warmup_runs))
        metrics = {
            **best,
            "throughput_spread": spread(runs[mode], ["completion_tok_s_over_total"]),
            "roofline": {**floor, **peaks, "fraction_of_floor": floor["floor_s"] / best["total_time_s"]},
        }
        if mode == "offline":
            print(
                f"  roofline floor {floor['floor_s']:.3f}s: this run is at {metrics['roofline']['fraction_of_floor']:.1%} of it"
            )
        name = "scheduler.json" if len(modes) == 1 else f"scheduler-{mode}.json"
        out = args.output_json if args.output_json and len(modes) == 1 else results_dir(args.device) / name
        write_json(out, make_result("scheduler", mode, config, metrics, args.device))
        print(f"  wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""roseinfer next to Hugging Face transformers, same weights, same workload, one run.

    python benchmarks/compare_hf.py --model gpt2 --repeat-runs 3

Systems: roseinfer (engine.generate: the OnlineScheduler over the paged KV
cache), hf_generate and hf_generate_batch (see harness/hf_peer.py).

Workloads: "fixed" (32 prompts of 32 tokens x 32 new tokens) and "mixed"
(32 prompts of 16-64 tokens, 8-128 new tokens). Greedy, EOS ignored, so every
system produces the same number of tokens; the greedy tokens are compared.
Output tokens/s is useful tokens over wall time. Writes
results/<device>/compare_hf.json and .png.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from harness.hf_peer import hf_model_for, run_hf_generate, run_hf_generate_batch, run_roseinfer

from roseinfer.bench import plots
from roseinfer.bench.results import make_result, results_dir, write_json
from roseinfer.bench.roofline import workload_ceiling_tok_s
from roseinfer.bench.workloads import BenchRequest, mixed_output_lengths, random_prompts
from roseinfer.cli import add_model_args, engine_from_args

SYSTEMS = ("roseinfer", "hf_generate", "hf_generate_batch")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--workload", nargs="+", default=["fixed", "mixed"], choices=["fixed", "mixed"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat-runs", type=int, default=3)
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    p.add_argument("--output-json", default=None)
    p.add_argument("--quick-roofline", action="store_true",
                   help="measure the peaks at token sizes: the code runs, the ceiling means nothing (tests)")
    return p


def workloads(args) -> dict[str, list[BenchRequest]]:
    n = args.num_requests
    return {
        "fixed": random_prompts(n, 32, 32, args.seed),
        "mixed": mixed_output_lengths(n, (16, 64), (8, 128), args.seed),
    }


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    engine = engine_from_args(args)
    hf = hf_model_for(engine, args.model)
    runners = {
        "roseinfer": lambda reqs: run_roseinfer(engine, reqs),
        "hf_generate": lambda reqs: run_hf_generate(hf, reqs),
        "hf_generate_batch": lambda reqs: run_hf_generate_batch(hf, reqs),
    }
    results: dict[str, Any] = {}
    for name, requests in workloads(args).items():
        if name not in args.workload:
            continue
        useful = sum(r.max_new_tokens for r in requests)
        for system in args.systems:  # warm-up: first calls allocate and initialise
            runners[system](requests[:4])
        runs: dict[str, list[float]] = {s: [] for s in args.systems}
        tokens: dict[str, list[list[int]]] = {}
        for _ in range(args.repeat_runs):
            for system in args.systems:  # interleaved, so machine noise hits all alike
                start = time.perf_counter()
                tokens[system] = runners[system](requests)
                runs[system].append(useful / (time.perf_counter() - start))
        reference = tokens[args.systems[0]]
        # The same workload run by an ideal engine at this device's measured peaks, in roseinfer's dtype.
        ceiling = workload_ceiling_tok_s(
            engine.model_config,
            [len(r.prompt_token_ids) for r in requests],
            [r.max_new_tokens for r in requests],
            engine.dtype,
            str(engine.device),
            small=args.quick_roofline,
        )
        block = {
            "useful_output_tokens": useful,
            "prompt_tokens": sum(len(r.prompt_token_ids) for r in requests),
            "roofline_tok_s": ceiling,
        }
        for system in args.systems:
            block[system] = {
                "output_throughput_tok_s": statistics.median(runs[system]),
                "runs_tok_s": runs[system],
                "same_greedy_tokens": sum(a == b for a, b in zip(tokens[system], reference)),
            }
        if "roseinfer" in block:
            block["roseinfer"]["fraction_of_roofline"] = block["roseinfer"]["output_throughput_tok_s"] / ceiling
        for system in args.systems[1:]:
            block[f"roseinfer_over_{system}"] = (
                block["roseinfer"]["output_throughput_tok_s"] / block[system]["output_throughput_tok_s"]
            )
        results[name] = block
        print(f"\n[{name}] {len(requests)} requests, {useful} output tokens")
        for system in args.systems:
            b = block[system]
            print(
                f"  {system:<18} {b['output_throughput_tok_s']:8.1f} tok/s  "
                f"(runs {', '.join(f'{x:.1f}' for x in b['runs_tok_s'])})  "
                f"same tokens as {args.systems[0]}: {b['same_greedy_tokens']}/{len(requests)}"
            )
        for system in args.systems[1:]:
            print(f"  roseinfer / {system}: {block[f'roseinfer_over_{system}']:.2f}x")
    config = {k: v for k, v in vars(args).items() if k != "output_json"} | {
        "engine": engine.describe(),
        "torch_threads": torch.get_num_threads(),
    }
    out = Path(args.output_json) if args.output_json else results_dir(args.device) / "compare_hf.json"
    write_json(out, make_result("compare_hf", "roseinfer-vs-hf", config, results, args.device))
    fig, axes = plots.figure(len(results))
    for ax, (name, block) in zip(axes, results.items()):
        plots.before_after_bars(
            ax,
            list(args.systems)[::-1],
            [block[s]["runs_tok_s"] for s in args.systems][::-1],
            "output tokens/s",
            f"{name}: {args.num_requests} requests",
        )
    plots.save(fig, out.with_suffix(".png"))
    print(f"\nwrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Static batching vs continuous batching (OnlineScheduler) on mixed output lengths.

    python benchmarks/benchmark_batching.py --model gpt2 --num-requests 32 --batch-size 8

Both variants run the same requests over the same engine and must give the
same greedy tokens. Writes results/<device>/batching.json.
"""

from __future__ import annotations

import argparse
import statistics

from roseinfer import InferenceEngine
from roseinfer.bench.batching import run_continuous, run_static
from roseinfer.bench.results import make_result, results_dir, write_json
from roseinfer.bench.workloads import mixed_output_lengths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None)
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--prompt-len", type=int, nargs=2, default=(16, 64))
    p.add_argument("--output-len", type=int, nargs=2, default=(4, 128))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat-runs", type=int, default=3)
    p.add_argument("--output-json", default=None)
    args = p.parse_args(argv)

    engine = InferenceEngine.from_pretrained(args.model, device=args.device, dtype=args.dtype)
    requests = mixed_output_lengths(
        args.num_requests, tuple(args.prompt_len), tuple(args.output_len), args.seed
    )
    total_tokens = sum(r.max_new_tokens for r in requests)
    variants = {"static": run_static, "continuous": run_continuous}
    reference = None
    runs = {name: [] for name in variants}
    extra = {}
    run_continuous(engine, requests[:2], 2)  # warm-up
    for _ in range(args.repeat_runs):
        for name, fn in variants.items():  # interleaved, so drift hits both alike
            elapsed, tokens, info = fn(engine, requests, args.batch_size)
            if reference is None:
                reference = tokens
            assert tokens == reference, f"{name} gave different greedy tokens"
            runs[name].append(total_tokens / elapsed)
            extra[name] = info
    metrics = {}
    for name, tps in runs.items():
        metrics[name] = {
            "output_throughput_tok_s": statistics.median(tps),
            "runs_tok_s": tps,
            **extra[name],
        }
        print(
            f"{name:>10}: {statistics.median(tps):8.1f} tok/s  (runs {', '.join(f'{x:.1f}' for x in tps)})"
            f"  steps={extra[name]['steps']}  wasted rows={extra[name]['wasted_fraction']:.0%}"
        )
    metrics["speedup"] = (
        metrics["continuous"]["output_throughput_tok_s"] / metrics["static"]["output_throughput_tok_s"]
    )
    print(f"continuous / static throughput: {metrics['speedup']:.2f}x")
    config = {k: v for k, v in vars(args).items() if k != "output_json"} | {
        "total_output_tokens": total_tokens,
        "weights": engine.weights.description,
    }
    out = args.output_json or results_dir(args.device) / "batching.json"
    write_json(out, make_result("batching", "static-vs-continuous", config, metrics, args.device))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What roseinfer's C RMSNorm, RoPE and silu(gate) * up (kernels/cpu/pointwise.c) buy a decode step.

    python benchmarks/benchmark_pointwise.py --model smollm2-135m --batches 1 32 --dtypes float32 bfloat16

A Llama layer runs three small operations between its projections. Through torch each is a
few operators of 5-17 us at batch 1, whatever their size; the C kernel does each in one call.
For each dtype and batch, one engine times the same decode step (contexts of `--context`
tokens) with the kernel and with torch's operators (`pointwise.use_kernel`), alternating
`--rounds` times, so both sides see the same machine; then each operation alone, per call.
Writes results/cpu/pointwise.json: step medians per round, their ratio (torch / kernel, > 1:
the kernel is faster) with its min-max over rounds, and the per-call times.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from roseinfer import InferenceEngine
from roseinfer.bench.decode_step import decode_batch, step_times_ms
from roseinfer.bench.results import make_result, results_dir, write_json
from roseinfer.models import pointwise


def per_call_us(fn, calls: int = 2000) -> float:
    for _ in range(50):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def operations_us(config, dtype: torch.dtype, rows: int) -> dict[str, dict[str, float]]:
    """Each operation alone on one layer's shapes, kernel against torch, in us a call."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, config.n_embd, generator=gen).to(dtype)
    weight = torch.ones(config.n_embd, dtype=dtype)
    qkv = torch.randn(rows, config.n_head + 2 * config.n_kv_head, config.head_dim, generator=gen).to(dtype)
    turned = qkv[:, : config.n_head + config.n_kv_head]
    cos = torch.rand(rows, 1, config.head_dim, generator=gen).to(dtype)
    gate_up = torch.randn(rows, 2 * config.intermediate_size, generator=gen).to(dtype)
    calls = {"rms_norm": lambda: pointwise.rms_norm(x, weight, 1e-5),
             "rope": lambda: pointwise.rope_(turned, cos, cos),
             "silu_mul": lambda: pointwise.silu_mul(gate_up)}
    out = {}
    for name, call in calls.items():
        out[name] = {}
        for side in ("kernel", "torch"):
            pointwise.use_kernel = side == "kernel"
            out[name][side] = per_call_us(call)
    pointwise.use_kernel = True
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--context", type=int, default=96, help="tokens in each sequence's cache")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=10, help="decode steps timed a round and side (their median)")
    args = p.parse_args()
    rows = []
    for dtype in args.dtypes:
        engine = InferenceEngine.from_pretrained(args.model, dtype=dtype, max_batch_size=max(args.batches))
        for batch in args.batches:
            sides: dict[str, list[float]] = {"kernel": [], "torch": []}
            with decode_batch(engine, batch, args.context) as step:
                for _ in range(args.rounds):
                    for side in sides:
                        pointwise.use_kernel = side == "kernel"
                        sides[side].append(statistics.median(step_times_ms(engine, step, args.steps)))
            pointwise.use_kernel = True
            ratios = [t / k for k, t in zip(sides["kernel"], sides["torch"])]
            row = {"dtype": dtype, "batch": batch, "context": args.context,
                   "step_ms": sides, "torch_over_kernel": statistics.median(ratios),
                   "torch_over_kernel_range": [min(ratios), max(ratios)],
                   "per_call_us": operations_us(engine.model_config, engine.runner.dtype, batch)}
            rows.append(row)
            print(f"{dtype} batch {batch}: step {statistics.median(sides['kernel']):.1f} ms with the kernel, "
                  f"{statistics.median(sides['torch']):.1f} with torch's operators: {row['torch_over_kernel']:.3f}x "
                  f"(rounds {min(ratios):.3f}-{max(ratios):.3f})")
            for name, us in row["per_call_us"].items():
                print(f"    {name:9s} {us['kernel']:6.1f} us a call, torch {us['torch']:6.1f}")
    path = write_json(results_dir() / "pointwise.json", make_result("pointwise", "current", vars(args), {"rows": rows}))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

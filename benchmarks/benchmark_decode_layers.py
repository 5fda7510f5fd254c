"""What the C calls between the projections buy a decode step, and how far the step then is from its floor.

    python benchmarks/benchmark_decode_layers.py --models smollm2-135m gpt2 --batches 1 32 --dtypes float32 bfloat16

Three sides of the same decode step (contexts of `--context` tokens), alternated `--rounds` times in
one engine so all see the same machine:
- "torch": the norms, RoPE, silu(gate) * up and the residual adds as torch's operators
  (`pointwise.use_kernel = False`), a Python call per operation;
- "kernels": each small operation one C call (kernels/cpu/pointwise.c), still a Python call per
  operation (`fused_decode.enabled = False`);
- "fused": every layer of the step in one C call (kernels/cpu/decode_layers.c), where the engine's
  projections all run roseinfer's own kernel (models/fused_decode.py: bf16 on a CPU with AVX512-BF16
  and no AMX, fp32 at the rows its probe gave roseinfer's kernel: its few rows, and in one-call steps
  up to 32 rows where it kept within 1.15x of oneDNN's); otherwise as "kernels".
Each round also measures the memory's read bandwidth, and each side's `x_floor` is its step time
over the step's bytes (weights once, K/V) at that bandwidth. Then each small operation alone, per
call. Writes results/cpu/decode_layers.json: step medians per round, the ratios torch / kernels and
kernels / fused (> 1: the second is faster) with their min-max over rounds, x_floor, per-call times.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from roseinfer import InferenceEngine
from roseinfer.bench.decode_step import decode_batch, step_times_ms
from roseinfer.bench.results import make_result, results_dir, write_json
from roseinfer.bench.roofline import decode_step_cost, read_bandwidth_meter
from roseinfer.models import fused_decode, packed_linear, pointwise

SIDES = ("torch", "kernels", "fused")


def use(side: str) -> None:
    pointwise.use_kernel = side != "torch"
    fused_decode.enabled = side == "fused"


def ratio_row(slow: list[float], fast: list[float]) -> dict:
    ratios = [s / f for s, f in zip(slow, fast)]
    return {"median": statistics.median(ratios), "range": [min(ratios), max(ratios)]}


def per_call_us(fn, calls: int = 2000) -> float:
    for _ in range(50):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def operations_us(config, dtype: torch.dtype, rows: int) -> dict[str, dict[str, float]]:
    """Each small operation of the family alone on one layer's shapes, kernel against torch, in us a call."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, config.n_embd, generator=gen).to(dtype)
    weight = torch.ones(config.n_embd, dtype=dtype)
    qkv = torch.randn(rows, config.n_head + 2 * config.n_kv_head, config.head_dim, generator=gen).to(dtype)
    turned = qkv[:, : config.n_head + config.n_kv_head]
    cos = torch.rand(rows, 1, config.head_dim, generator=gen).to(dtype)
    gate_up = torch.randn(rows, 2 * config.intermediate_size, generator=gen).to(dtype)
    if config.family == "gpt2":
        calls = {"layer_norm": lambda: pointwise.layer_norm(x, weight, weight, 1e-5)}
    else:
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
    p.add_argument("--models", nargs="+", default=["smollm2-135m", "gpt2"])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--context", type=int, default=96, help="tokens in each sequence's cache")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=10, help="decode steps timed a round and side (their median)")
    args = p.parse_args()
    rows = []
    bandwidth = read_bandwidth_meter("cpu", torch.float32)
    for model, dtype in ((m, d) for m in args.models for d in args.dtypes):
        engine = InferenceEngine.from_pretrained(model, dtype=dtype, max_batch_size=max(args.batches))
        elem = engine.runner.dtype.itemsize
        for batch in args.batches:
            sides: dict[str, list[float]] = {side: [] for side in SIDES}
            x_floor: dict[str, list[float]] = {side: [] for side in SIDES}
            floor_bytes = decode_step_cost(engine.model_config, [args.context] * batch, elem).bytes
            with decode_batch(engine, batch, args.context) as step:
                for _ in range(args.rounds):
                    floor_ms = floor_bytes / bandwidth() * 1e3
                    for side in SIDES:
                        use(side)
                        sides[side].append(statistics.median(step_times_ms(engine, step, args.steps)))
                        x_floor[side].append(sides[side][-1] / floor_ms)
            use("fused")
            row = {"model": model, "dtype": dtype, "batch": batch, "context": args.context, "step_ms": sides,
                   "torch_over_kernels": ratio_row(sides["torch"], sides["kernels"]),
                   "kernels_over_fused": ratio_row(sides["kernels"], sides["fused"]),
                   "x_floor": {side: statistics.median(x) for side, x in x_floor.items()},
                   "x_floor_range": {side: [min(x), max(x)] for side, x in x_floor.items()},
                   "per_call_us": operations_us(engine.model_config, engine.runner.dtype, batch)}
            rows.append(row)
            medians = ", ".join(f"{side} {statistics.median(sides[side]):.1f}" for side in SIDES)
            print(f"{model} {dtype} batch {batch}: step ms {medians}; kernels over torch "
                  f"{row['torch_over_kernels']['median']:.3f}x, fused over kernels "
                  f"{row['kernels_over_fused']['median']:.3f}x "
                  f"({row['kernels_over_fused']['range'][0]:.3f}-{row['kernels_over_fused']['range'][1]:.3f}); "
                  "x floor " + ", ".join(f"{side} {row['x_floor'][side]:.2f}" for side in SIDES))
            for name, us in row["per_call_us"].items():
                print(f"    {name:9s} {us['kernel']:6.1f} us a call, torch {us['torch']:6.1f}")
    # fp32's kernel choices, as this process's probe made them (models/packed_linear.py): which rows a step with
    # a Python call per operation gives roseinfer's kernel, and up to which rows a one-call step runs on it.
    kernel, small_rows = packed_linear.fp32_small_rows()
    choices = {"small_kernel": kernel, "small_rows": small_rows, "fused_rows": packed_linear.fp32_fused_rows(),
               "fused_probe_ratios": dict(packed_linear.fused_probe_ratios)}
    print(f"fp32 kernels: {choices}")
    path = write_json(results_dir() / "decode_layers.json",
                      make_result("decode_layers", "current", vars(args), {"rows": rows, "fp32_kernels": choices}))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

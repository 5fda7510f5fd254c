"""oneDNN's bf16 packed projection vs roseinfer's bf16 kernel (kernels/cpu/linear_bf16.c), on this CPU.

    python benchmarks/benchmark_bf16_linear.py            # rows 1 8 32 128, 7 interleaved repeats

Two parts, both interleaved (one repeat of each variant in turn), medians with min-max:
- per projection shape of gpt2 (qkv, attention out, the two MLP matrices with GELU
  fused in the first, the LM head), at each row count: microseconds, GFLOP/s, and
  the weight bytes read per second. A layer's weight (1.2-4.7 MB in bf16) stays in
  the L3 cache between repeats, so small row counts here run faster than in a real
  step, where all 248 MB of gpt2's bf16 weights stream from DRAM; the LM head
  (77 MB) does not fit and shows the DRAM-bound case.
- a whole gpt2 bf16 decode step (forward, LM head, greedy pick) at batch 1 and 32,
  context 48, with every projection on one kernel or the other (two engines in
  one process; `cpu_linear="onednn"` builds the oneDNN one).

Needs a CPU with AVX512-BF16. Writes results/cpu/bf16_linear.json.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from roseinfer import InferenceEngine
from roseinfer.bench.decode_step import decode_batch, step_times_ms
from roseinfer.bench.results import cpu_info, make_result, results_dir, write_json
from roseinfer.kernels.cpu.bindings import load_bf16_linear_kernel
from roseinfer.models.packed_linear import PackedLinear

SHAPES = {  # name: (in, out, activation)
    "c_attn": (768, 2304, "none"),
    "attn.c_proj": (768, 768, "none"),
    "c_fc": (768, 3072, "gelu_tanh"),
    "mlp.c_proj": (3072, 768, "none"),
    "lm_head": (768, 50257, "none"),
}
VARIANTS = ("onednn", "roseinfer")


def layer_for(variant: str, weight, bias, activation) -> PackedLinear:
    return PackedLinear(weight, bias, activation, cpu_linear=variant)


def time_us(fn, inner: int) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner * 1e6


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def bench_shapes(rows_list: list[int], repeats: int) -> list[dict]:
    out = []
    torch.manual_seed(0)
    for name, (fan_in, fan_out, activation) in SHAPES.items():
        weight = (torch.randn(fan_out, fan_in) * 0.02).bfloat16()
        bias = None if name == "lm_head" else torch.randn(fan_out).bfloat16()
        layers = {v: layer_for(v, weight, bias, activation) for v in VARIANTS}
        assert [layers[v].kernel for v in VARIANTS] == list(VARIANTS)
        for rows in rows_list:
            x = torch.randn(rows, fan_in).bfloat16()
            a, b = (layers[v](x).float() for v in VARIANTS)
            assert (a - b).abs().max() <= 2**-6 * a.abs().max() + 1e-3  # the same projection
            inner = 3 if fan_out > 10000 else 30
            us = {v: [] for v in VARIANTS}
            for _ in range(repeats):
                for v in VARIANTS:
                    layers[v](x)  # warm
                    us[v].append(time_us(lambda layer=layers[v], x=x: layer(x), inner))
            flops, weight_bytes = 2 * rows * fan_in * fan_out, 2 * fan_in * fan_out
            row = {"layer": name, "rows": rows}
            for v in VARIANTS:
                med = statistics.median(us[v])
                row[v] = {"us": spread(us[v]), "gflops": flops / med / 1e3, "weight_gb_s": weight_bytes / med / 1e3}
            row["speedup"] = row["onednn"]["us"]["median"] / row["roseinfer"]["us"]["median"]
            out.append(row)
            print(f"{name:<12} {rows:>4} rows: oneDNN {row['onednn']['us']['median']:8.1f} us "
                  f"({row['onednn']['gflops']:5.0f} GFLOP/s), roseinfer {row['roseinfer']['us']['median']:8.1f} us "
                  f"({row['roseinfer']['gflops']:5.0f} GFLOP/s): {row['speedup']:.2f}x")
    return out


def bench_steps(batches: list[int], context: int, repeats: int) -> list[dict]:
    engines = {}
    for v in VARIANTS:
        engines[v] = InferenceEngine.from_pretrained("gpt2", dtype="bfloat16", max_batch_size=max(batches),
                                                     cpu_linear=v)
    out = []
    for batch in batches:
        ms = {v: [] for v in VARIANTS}
        with decode_batch(engines["onednn"], batch, context) as step_a, decode_batch(
            engines["roseinfer"], batch, context
        ) as step_b:
            steps = {"onednn": step_a, "roseinfer": step_b}
            for _ in range(repeats):
                for v in VARIANTS:
                    ms[v].append(statistics.median(step_times_ms(engines[v], steps[v], 10)))
        row = {"batch": batch, "context": context, **{v: spread(ms[v]) for v in VARIANTS}}
        row["speedup"] = row["onednn"]["median"] / row["roseinfer"]["median"]
        out.append(row)
        print(f"decode step, batch {batch:>3}: oneDNN {row['onednn']['median']:.2f} ms "
              f"({row['onednn']['min']:.2f}-{row['onednn']['max']:.2f}), roseinfer {row['roseinfer']['median']:.2f} ms "
              f"({row['roseinfer']['min']:.2f}-{row['roseinfer']['max']:.2f}): {row['speedup']:.2f}x")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    p.add_argument("--context", type=int, default=48)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    if load_bf16_linear_kernel() is None:
        print("this CPU has no AVX512-BF16 (or no C compiler): nothing to compare")
        return 1
    with torch.inference_mode():
        shapes = bench_shapes(args.rows, args.repeats)
        steps = bench_steps(args.batches, args.context, args.repeats)
    out = results_dir("cpu") / "bf16_linear.json"
    config = dict(vars(args), cpu_flags=cpu_info()["cpu_flags"])  # which kind of CPU: AMX or not decides the winner
    write_json(out, make_result("bf16_linear", "onednn-vs-roseinfer-bf16", config,
                                {"threads": torch.get_num_threads(), "shapes": shapes, "steps": steps}, "cpu"))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""F.linear vs oneDNN-packed linear (roseinfer.models.packed_linear) for gpt2's layer shapes on this CPU.

    python benchmarks/benchmark_cpu_linear.py --rows 1 32 128

Rows are the tokens of a step (1 = a single decode, 32 = a batch of 32);
every shape of gpt2 appears: qkv, attention out, the two MLP matrices, the
LM head. Interleaved repeats, medians. Writes results/cpu/cpu_linear.json.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from roseinfer.bench.results import make_result, results_dir, write_json
from roseinfer.models.packed_linear import PackedLinear

SHAPES = {
    "c_attn": (768, 2304),
    "attn.c_proj": (768, 768),
    "c_fc": (768, 3072),
    "mlp.c_proj": (3072, 768),
    "lm_head": (768, 50257),
}


def best_of(fn, repeats: int, inner: int) -> list[float]:
    fn()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        out.append((time.perf_counter() - start) / inner * 1e6)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 32, 128])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    results = []
    with torch.inference_mode():
        for name, (fan_in, fan_out) in SHAPES.items():
            weight, bias = torch.randn(fan_out, fan_in) * 0.02, torch.zeros(fan_out)
            packed = PackedLinear(weight, bias, cpu_linear="onednn")  # the packed kernel at every row count
            for rows in args.rows:
                x = torch.randn(rows, fan_in)
                inner = 3 if fan_out > 10000 else 20
                dense_us, packed_us = [], []
                for _ in range(args.repeats):  # interleaved
                    dense_us += best_of(lambda x=x, w=weight, b=bias: F.linear(x, w, b), 1, inner)
                    packed_us += best_of(lambda x=x, layer=packed: layer(x), 1, inner)
                assert torch.allclose(packed(x), F.linear(x, weight, bias), atol=1e-4)
                row = {
                    "layer": name,
                    "rows": rows,
                    "f_linear_us": statistics.median(dense_us),
                    "packed_us": statistics.median(packed_us),
                }
                row["speedup"] = row["f_linear_us"] / row["packed_us"]
                results.append(row)
                print(
                    f"{name:<12} {rows:>4} rows: F.linear {row['f_linear_us']:9.1f} us, packed "
                    f"{row['packed_us']:9.1f} us ({row['speedup']:.2f}x)"
                )
    out = results_dir("cpu") / "cpu_linear.json"
    write_json(
        out, make_result("cpu_linear", "f_linear-vs-onednn-packed", vars(args), {"rows": results}, "cpu")
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

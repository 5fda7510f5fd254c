"""The fp32 projection kernels on this CPU for gpt2's layer shapes: F.linear, oneDNN's packed kernel
and roseinfer's few-rows kernel (kernels/cpu/linear_f32.c), as roseinfer.models.packed_linear uses them.

    python benchmarks/benchmark_cpu_linear.py --rows 1 2 4 32 128

Rows are the tokens of a step (1 = a single decode, 32 = a batch of 32);
every shape of gpt2 appears: qkv, attention out, the two MLP matrices, the
LM head. Interleaved repeats, medians; each kernel's weight read rate (the
weight's bytes over its time) is printed beside it, since at a few rows a
projection can go no faster than its weight streams from memory.
roseinfer's kernel runs only up to 8 rows (what it is chosen for).
Writes results/cpu/cpu_linear.json.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from roseinfer.bench.results import cpu_info, make_result, results_dir, write_json
from roseinfer.kernels.cpu.bindings import f32_linear, load_f32_linear_kernel, pack_f32_panels
from roseinfer.models.packed_linear import PackedLinear

KERNEL_MAX_ROWS = 8

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
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 32, 128])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    results = []
    with torch.inference_mode():
        for name, (fan_in, fan_out) in SHAPES.items():
            weight, bias = torch.randn(fan_out, fan_in) * 0.02, torch.zeros(fan_out)
            packed = PackedLinear(weight, bias, cpu_linear="onednn")  # the packed kernel at every row count
            lib = load_f32_linear_kernel()
            panels = pack_f32_panels(weight, lib.linear_f32_panel_columns()) if lib else None
            panel_bias = torch.zeros(panels.shape[0] * panels.shape[2]) if lib else None  # bias is 0 here
            for rows in args.rows:
                x = torch.randn(rows, fan_in)
                inner = 3 if fan_out > 10000 else 20
                calls = {"f_linear": lambda x=x: F.linear(x, weight, bias), "packed": lambda x=x: packed(x)}
                if panels is not None and rows <= KERNEL_MAX_ROWS:
                    calls["roseinfer"] = lambda x=x: f32_linear(x, panels, panel_bias, False, fan_out)
                    assert torch.allclose(calls["roseinfer"](), F.linear(x, weight, bias), atol=1e-4)
                assert torch.allclose(packed(x), F.linear(x, weight, bias), atol=1e-4)
                spent = {kernel: [] for kernel in calls}
                for _ in range(args.repeats):  # interleaved
                    for kernel, call in calls.items():
                        spent[kernel] += best_of(call, 1, inner)
                row = {"layer": name, "rows": rows} | {f"{k}_us": statistics.median(v) for k, v in spent.items()}
                row["speedup"] = row["f_linear_us"] / row["packed_us"]
                results.append(row)
                weight_bytes = weight.numel() * 4
                print(f"{name:<12} {rows:>4} rows: " + ", ".join(
                    f"{k} {row[f'{k}_us']:8.1f} us ({weight_bytes / row[f'{k}_us'] / 1e3:5.1f} GB/s)" for k in calls))
    out = results_dir("cpu") / "cpu_linear.json"
    config = vars(args) | {"cpu_flags": cpu_info()["cpu_flags"], "threads": torch.get_num_threads()}
    write_json(out, make_result("cpu_linear", "f_linear-vs-onednn-packed-vs-roseinfer-f32", config,
                                {"rows": results}, "cpu"))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

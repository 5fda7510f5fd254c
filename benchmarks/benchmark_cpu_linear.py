"""The fp32 projection kernels on this CPU for gpt2's layer shapes: F.linear, oneDNN's packed kernel
and roseinfer's few-rows kernel (kernels/cpu/linear_f32.c), as roseinfer.models.packed_linear uses them.

    python benchmarks/benchmark_cpu_linear.py --rows 1 2 4 32 128 --batches 1 2 4 8

Two parts, both interleaved (one repeat of each variant in turn), medians:
- per projection shape of gpt2 (qkv, attention out, the two MLP matrices, the
  LM head) at each row count (the tokens of a step): each kernel's time and its
  weight read rate (the weight's bytes over its time), since at a few rows a
  projection can go no faster than its weight streams from memory. A layer's
  weight stays in the L3 cache between repeats, so only the LM head (154 MB)
  shows the DRAM-bound case. roseinfer's kernel runs up to 8 rows (what it is
  chosen for).
- a whole gpt2 fp32 decode step at each batch, context 64, as the engine runs
  it by default (`cpu_linear="auto"`: the small rows on the kernel measured
  fastest at start-up) against every projection on oneDNN (`"onednn"`), with
  the step's floor: its weights and cached K/V read once at this machine's
  measured read bandwidth. Greedy tokens of the two engines are checked equal.

Writes results/cpu/cpu_linear.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import torch
import torch.nn.functional as F

from roseinfer import InferenceEngine, SamplingParams
from roseinfer.bench.decode_step import decode_batch, step_times_ms
from roseinfer.bench.results import cpu_info, make_result, results_dir, write_json
from roseinfer.bench.roofline import decode_step_cost, machine_peaks
from roseinfer.config import PRESETS
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


STEP_VARIANTS = ("onednn", "auto")
CONTEXT = 64


def bench_steps(batches: list[int], repeats: int) -> list[dict]:
    """A gpt2 fp32 decode step per batch, every projection on oneDNN against the engine's default choice."""
    engines = {v: InferenceEngine.from_pretrained("gpt2", dtype="float32", max_batch_size=max(batches), cpu_linear=v)
               for v in STEP_VARIANTS}
    params = SamplingParams(max_new_tokens=32, stop_on_eos=False)
    tokens = {v: [o.token_ids for o in e.generate(["The same answer", "either way"], params)] for v, e in engines.items()}
    assert tokens["onednn"] == tokens["auto"], "the two engines' greedy tokens differ"
    peaks = machine_peaks("cpu", torch.float32)
    out = []
    for batch in batches:
        ms = {v: [] for v in STEP_VARIANTS}
        with decode_batch(engines["onednn"], batch, CONTEXT) as a, decode_batch(engines["auto"], batch, CONTEXT) as b:
            steps = {"onednn": a, "auto": b}
            for _ in range(repeats):
                for v in STEP_VARIANTS:
                    ms[v].append(statistics.median(step_times_ms(engines[v], steps[v], 10)))
        floor_ms = decode_step_cost(PRESETS["gpt2"], [CONTEXT] * batch, 4).floor_s(peaks) * 1000
        row = {"batch": batch, "context": CONTEXT, "floor_ms": floor_ms, "same_greedy_tokens": True}
        for v in STEP_VARIANTS:
            row[v] = {"median_ms": statistics.median(ms[v]), "runs_ms": ms[v],
                      "x_floor": statistics.median(ms[v]) / floor_ms}
        row["speedup"] = row["onednn"]["median_ms"] / row["auto"]["median_ms"]
        out.append(row)
        print(f"decode step, batch {batch:>2}: oneDNN {row['onednn']['median_ms']:.2f} ms "
              f"({min(ms['onednn']):.2f}-{max(ms['onednn']):.2f}), default {row['auto']['median_ms']:.2f} ms "
              f"({min(ms['auto']):.2f}-{max(ms['auto']):.2f}): {row['speedup']:.2f}x; floor {floor_ms:.2f} ms "
              f"(default {row['auto']['x_floor']:.2f}x it, oneDNN {row['onednn']['x_floor']:.2f}x)")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 32, 128])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    results = []
    with torch.inference_mode():
        steps = bench_steps(args.batches, args.repeats) if args.batches else []
        for name, (fan_in, fan_out) in SHAPES.items():
            weight, bias = torch.randn(fan_out, fan_in) * 0.02, torch.zeros(fan_out)
            packed = PackedLinear(weight, bias, cpu_linear="onednn")  # the packed kernel at every row count
            lib = load_f32_linear_kernel()
            panels = pack_f32_panels(weight, lib.linear_f32_panel_columns()) if lib else None
            panel_bias = torch.zeros(panels.shape[0] * panels.shape[2]) if lib else None  # bias is 0 here
            for rows in args.rows:
                x = torch.randn(rows, fan_in)
                inner = 3 if fan_out > 10000 else 20
                calls = {"f_linear": partial(F.linear, x, weight, bias), "packed": partial(packed, x)}
                if panels is not None and rows <= KERNEL_MAX_ROWS:
                    calls["roseinfer"] = partial(f32_linear, x, panels, panel_bias, False, fan_out)
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
    config = vars(args) | {"cpu": cpu_info(), "threads": torch.get_num_threads()}
    write_json(out, make_result("cpu_linear", "f_linear-vs-onednn-packed-vs-roseinfer-f32", config,
                                {"rows": results, "steps": steps}, "cpu"))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

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
  fastest at start-up) against every projection on oneDNN (`"onednn"`) and
  against int8 weights (`quantization="int8-weight-only"`: fp32 arithmetic) and
  int8 weights and activations (`quantization="int8"`), each with its floor:
  its weights and cached K/V read once at the read bandwidth measured in the
  same round (a quarter of the weight bytes for int8). Greedy tokens of the two
  fp32 engines are checked equal; each int8 engine's agreement with them is
  measured (32 prompts, 32 tokens each, random weights) and reported.

Writes results/cpu/cpu_linear.json.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from functools import partial

import torch
import torch.nn.functional as F

from roseinfer import InferenceEngine, SamplingParams
from roseinfer.bench.decode_step import decode_batch, step_times_ms
from roseinfer.bench.results import cpu_info, make_result, results_dir, write_json
from roseinfer.bench.roofline import decode_step_cost, read_bandwidth_meter
from roseinfer.bench.same_answer import agreement, matching_prefix
from roseinfer.config import PRESETS
from roseinfer.kernels.cpu.bindings import f32_linear, load_f32_linear_kernel, pack_f32_panels, pad_to_panels
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


STEP_VARIANTS = {"onednn": dict(cpu_linear="onednn"), "auto": dict(cpu_linear="auto"),
                 "int8-weight-only": dict(quantization="int8-weight-only"), "int8": dict(quantization="int8")}
INT8 = ("int8-weight-only", "int8")
CONTEXT = 64


def step_bytes(batch: int, weight_bytes: float) -> float:
    """What a step must read: its weights at `weight_bytes` each, fp32 K/V and activations."""
    config = PRESETS["gpt2"]
    cost = decode_step_cost(config, [CONTEXT] * batch, 4)
    weights = 12 * config.n_layer * config.n_embd**2 + config.vocab_size * config.n_embd  # projections + LM head
    return cost.bytes - weights * (4 - weight_bytes)


def bench_steps(batches: list[int], repeats: int) -> dict:
    """A gpt2 decode step per batch: every projection on oneDNN, the engine's default, and the two int8 kinds.

    Each round measures the memory's read bandwidth first and every variant right after, and a step's
    `x_floor` is its time over its bytes at that round's bandwidth: this virtual machine's bandwidth
    swings ~1.6x within minutes, so a floor taken once would flatter or sink whole rounds."""
    engines = {v: InferenceEngine.from_pretrained("gpt2", dtype="float32", max_batch_size=max(batches), **options)
               for v, options in STEP_VARIANTS.items()}
    params = SamplingParams(max_new_tokens=32, stop_on_eos=False)
    prompts = [f"prompt {i}: " + "word " * (i % 7) for i in range(32)]
    tokens = {v: [o.token_ids for o in e.generate(prompts, params)] for v, e in engines.items()}
    assert tokens["onednn"] == tokens["auto"], "the two fp32 engines' greedy tokens differ"
    int8_agreement = {v: {"identical_requests": agreement(tokens[v], tokens["auto"]),
                          "matching_prefix": matching_prefix(tokens[v], tokens["auto"])} for v in INT8}
    for v, a in int8_agreement.items():
        print(f"{v} against fp32, {len(prompts)} prompts x 32 greedy tokens: {a['identical_requests']:.0%} "
              f"of requests identical, {a['matching_prefix']:.0%} of tokens before the first difference")
    read_bandwidth = read_bandwidth_meter("cpu", torch.float32)
    rows = []
    for batch in batches:
        ms = {v: [] for v in STEP_VARIANTS}
        x_floor = {v: [] for v in STEP_VARIANTS}
        bandwidths = []
        with contextlib.ExitStack() as stack:
            steps = {v: stack.enter_context(decode_batch(e, batch, CONTEXT)) for v, e in engines.items()}
            for _ in range(repeats):
                bandwidths.append(read_bandwidth())
                for v in STEP_VARIANTS:
                    ms[v].append(statistics.median(step_times_ms(engines[v], steps[v], 10)))
                    floor_ms = step_bytes(batch, 1 if v in INT8 else 4) / bandwidths[-1] * 1000
                    x_floor[v].append(ms[v][-1] / floor_ms)
        row = {"batch": batch, "context": CONTEXT, "read_bytes_s_runs": bandwidths}
        for v in STEP_VARIANTS:
            row[v] = {"median_ms": statistics.median(ms[v]), "runs_ms": ms[v],
                      "x_floor": statistics.median(x_floor[v]), "x_floor_runs": x_floor[v]}
        rows.append(row)
        print(f"decode step, batch {batch:>2} (read {min(bandwidths) / 1e9:.0f}-{max(bandwidths) / 1e9:.0f} GB/s): "
              + ", ".join(f"{v} {row[v]['median_ms']:.2f} ms, {row[v]['x_floor']:.2f}x its floor "
                          f"({min(x_floor[v]):.2f}-{max(x_floor[v]):.2f})" for v in STEP_VARIANTS))
    return {"rows": rows, "fp32_same_greedy_tokens": True, "int8_agreement_with_fp32": int8_agreement}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 32, 128])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    results = []
    with torch.inference_mode():
        steps = bench_steps(args.batches, args.repeats) if args.batches else {}
        for name, (fan_in, fan_out) in SHAPES.items():
            weight, bias = torch.randn(fan_out, fan_in) * 0.02, torch.zeros(fan_out)
            packed = PackedLinear(weight, bias, cpu_linear="onednn")  # the packed kernel at every row count
            lib = load_f32_linear_kernel()
            panels = pack_f32_panels(weight, lib.linear_f32_panel_columns()) if lib else None
            panel_bias = pad_to_panels(bias, panels.shape[2]) if lib else None
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

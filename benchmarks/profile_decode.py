"""Where a decode step's time goes on this CPU: per operator, and host vs compute.

    python benchmarks/profile_decode.py --model gpt2 --batches 1 32 --dtypes float32 bfloat16

For each batch size and dtype, `batch` requests with 32-token prompts are
prefilled, then decode steps are timed (wall clock, median of `--steps`), and
split into the model's forward, the LM head + sampler, and the host's share
(scheduling, batch tensors, bookkeeping: the step minus the two). A
torch.profiler pass over the same steps gives the operators' self time,
grouped by name, largest first. Writes results/cpu/profile_decode.json; the
roofline columns say how far each step is from reading the weights once.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from roseinfer import InferenceEngine, SamplingParams
from roseinfer.bench.instrument import MethodTimer
from roseinfer.bench.results import make_result, results_dir, write_json
from roseinfer.models import packed_linear


def weight_bytes(engine: InferenceEngine) -> int:
    """Bytes of weights a decode step reads: every parameter once (the tied LM head counted once)."""
    return sum(p.numel() * p.element_size() for p in engine.runner.model.state_dict().values())


def profile_one(model: str, batch: int, dtype: str, steps: int, top: int) -> dict:
    engine = InferenceEngine.from_pretrained(model, dtype=dtype, max_batch_size=batch)
    scheduler = engine.new_scheduler(max_batch_size=batch)
    for i in range(batch):
        engine.add_request(scheduler, prompt_token_ids=[(1000 + 37 * i + t) % 50000 for t in range(32)],
            params=SamplingParams(max_new_tokens=3 * steps + 16, stop_on_eos=False),
        )
    while scheduler.last_step_stats()["num_prompt_tokens"] or scheduler.num_waiting():
        engine.step(scheduler)  # prefill
    for _ in range(3):
        engine.step(scheduler)  # warm-up decodes
    runner = engine.runner
    forward = MethodTimer(runner.model, "forward")
    head = MethodTimer(runner.model, "compute_logits")
    sampler = MethodTimer(runner, "sampler")
    # The C kernels run outside torch's operators (ctypes), so the profiler below cannot see them.
    c_kernels = {"bf16 projections (linear_bf16.c)": MethodTimer(packed_linear, "bf16_linear")}
    if hasattr(runner.model.attention, "_attend"):
        c_kernels["paged attention (paged_decode.c)"] = MethodTimer(runner.model.attention, "_attend")
    walls = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step(scheduler)
        walls.append(time.perf_counter() - start)
    step_ms = statistics.median(walls) * 1e3
    total = sum(walls)
    split = {
        "model_forward": forward.seconds / total,
        "lm_head": head.seconds / total,
        "sampler": sampler.seconds / total,
    }
    split["host"] = max(0.0, 1.0 - sum(split.values()))
    c_kernel_ms = {name: timer.seconds / steps * 1e3 for name, timer in c_kernels.items()}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.step(scheduler)
    ops: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        ops[event.key] += event.self_cpu_time_total / steps / 1e3
    profiled_ms = sum(ops.values())
    top_ops = sorted(ops.items(), key=lambda kv: -kv[1])[:top]
    return {
        "batch": batch,
        "dtype": dtype,
        "attention_backend": engine.attention_backend,
        "step_ms_median": step_ms,
        "step_ms_runs": [w * 1e3 for w in walls],
        "ms_per_token": step_ms / batch,
        "tokens_per_s": batch / (step_ms / 1e3),
        "weight_mb": weight_bytes(engine) / 1e6,
        "time_split": split,
        # Shares are of torch's operators; the C kernels (ctypes) and Python are not among them:
        # outside_torch_ops_ms is what the step spends there, c_kernel_ms the kernels' part of it.
        "outside_torch_ops_ms": max(0.0, step_ms - profiled_ms),
        "c_kernel_ms": c_kernel_ms,
        "top_ops_ms_per_step": [{"op": k, "ms": v, "share": v / profiled_ms} for k, v in top_ops],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args(argv)
    rows = []
    with torch.inference_mode():
        for dtype in args.dtypes:
            for batch in args.batches:
                row = profile_one(args.model, batch, dtype, args.steps, args.top)
                rows.append(row)
                split = ", ".join(f"{k} {v:.0%}" for k, v in row["time_split"].items())
                print(
                    f"{dtype} batch {batch}: {row['step_ms_median']:.1f} ms/step ({split}); "
                    f"{row['outside_torch_ops_ms']:.1f} ms outside torch's operators (C kernels, Python)"
                )
                for name, ms in row["c_kernel_ms"].items():
                    print(f"    C: {name:<45} {ms:7.2f} ms")
                for op in row["top_ops_ms_per_step"][:6]:
                    print(f"    {op['op']:<48} {op['ms']:7.2f} ms  {op['share']:.0%}")
    out = results_dir("cpu") / "profile_decode.json"
    write_json(out, make_result("profile_decode", "current", vars(args), {"rows": rows}, "cpu"))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

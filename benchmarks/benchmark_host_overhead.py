"""What a decode step costs the host: scheduling, batch tensors, sampling, bookkeeping, without the model.

    python benchmarks/benchmark_host_overhead.py --batches 1 8 32 64 128

The model's forward is replaced by a stub that returns tiny logits at once, so
what is timed is everything roseinfer does around it in Python. On a GPU with
CUDA graphs the model takes a fraction of a millisecond per step, and this is
what is left; it is the budget that a TPOT target has to fit.
Writes results/cpu/host_overhead.json.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from roseinfer import InferenceEngine
from roseinfer.bench.results import make_result, results_dir, write_json


def host_us_per_step(batch: int, steps: int, repeats: int) -> list[float]:
    engine = InferenceEngine.from_pretrained("gpt2-tiny", num_kv_blocks=batch * 48 + 16)
    model = engine.runner.model
    model.forward = lambda ids, positions, kv, meta: torch.zeros(ids.shape[0], 8)
    model.compute_logits = lambda hidden: hidden
    rng = random.Random(batch)
    scheduler = engine.new_scheduler(max_batch_size=batch)
    for _ in range(batch):
        engine.add_request(scheduler, prompt_token_ids=[rng.randrange(50000) for _ in range(200)],
            max_new_tokens=steps * (repeats + 1) + 8,
            stop_on_eos=False,
        )
    for _ in range(steps):  # prefill and warm-up
        engine.step(scheduler)
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            engine.step(scheduler)
        runs.append((time.perf_counter() - start) / steps * 1e6)
    return runs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    rows = []
    for batch in args.batches:
        runs = host_us_per_step(batch, args.steps, args.repeats)
        rows.append({"batch": batch, "host_us_per_step": statistics.median(runs), "runs": runs})
        print(
            f"batch {batch:>4}: {statistics.median(runs):7.1f} us of host work per decode step "
            f"(runs {min(runs):.1f}-{max(runs):.1f})"
        )
    out = results_dir("cpu") / "host_overhead.json"
    write_json(
        out, make_result("host_overhead", "scheduler+runner+sampler", vars(args), {"rows": rows}, "cpu")
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A decode step in the main thread, in a worker thread, and in a worker thread once the main one let go of its OpenMP pool.

    python benchmarks/benchmark_worker_thread.py --model gpt2 --batches 1 16 32 --dtype float32

The server's steps run in the manager's worker thread, after the engine was
loaded and warmed up in the main thread. libgomp keeps an OpenMP pool for
each of the two threads, and with more pool threads than cores it throttles
the spinning of idle workers (see roseinfer/engine/openmp.py). Each placement
runs in a fresh process, the three interleaved for `--rounds` rounds; each
process times `--steps` decode steps per batch size (median). Writes
results/cpu/worker_thread.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time

PLACEMENTS = ("main_thread", "worker_thread", "worker_thread_released")


def step_medians(model: str, dtype: str, batches: list[int], steps: int) -> dict[int, float]:
    from roseinfer import InferenceEngine, SamplingParams

    engine = InferenceEngine.from_pretrained(model, dtype=dtype)
    out = {}
    for batch in batches:
        scheduler = engine.new_scheduler(max_batch_size=batch)
        for i in range(batch):
            engine.add_request(scheduler, prompt_token_ids=[(1000 + 37 * i + t) % 50000 for t in range(32)],
                params=SamplingParams(max_new_tokens=steps + 8, stop_on_eos=False),
            )
        for _ in range(4):
            engine.step(scheduler)  # the prefill, then warm-up decodes
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            engine.step(scheduler)
            times.append(time.perf_counter() - start)
        out[batch] = statistics.median(times) * 1e3
    return out


def child(placement: str, model: str, dtype: str, batches: list[int], steps: int) -> None:
    """One measurement: the engine is built in the main thread (as the server builds it), stepped where asked."""
    import torch

    from roseinfer import InferenceEngine
    from roseinfer.engine.openmp import release_openmp_workers

    InferenceEngine.from_pretrained(model, dtype=dtype)  # the main thread runs parallel work, as at start-up
    torch.ones(1 << 20).sum()
    result: dict[int, float] = {}
    if placement == "main_thread":
        result = step_medians(model, dtype, batches, steps)
    else:
        if placement == "worker_thread_released":
            assert release_openmp_workers(), "this torch's OpenMP runtime cannot free the main thread's pool"
        worker = threading.Thread(target=lambda: result.update(step_medians(model, dtype, batches, steps)))
        worker.start()
        worker.join()
    print(json.dumps(result))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16, 32])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--child", choices=PLACEMENTS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child, args.model, args.dtype, args.batches, args.steps)
        return 0

    from roseinfer.bench.results import make_result, results_dir, write_json
    from roseinfer.bench.stats import rank_test

    runs: dict[str, dict[int, list[float]]] = {p: {b: [] for b in args.batches} for p in PLACEMENTS}
    for round_ in range(args.rounds):
        for placement in PLACEMENTS:  # interleaved: every placement once per round
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    placement,
                    "--model",
                    args.model,
                    "--dtype",
                    args.dtype,
                    "--steps",
                    str(args.steps),
                    "--batches",
                    *map(str, args.batches),
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            for batch, ms in json.loads(out.stdout.strip().splitlines()[-1]).items():
                runs[placement][int(batch)].append(ms)
            print(
                f"round {round_ + 1}/{args.rounds} {placement}: {out.stdout.strip().splitlines()[-1]}",
                flush=True,
            )
    rows = []
    for batch in args.batches:
        row = {"batch": batch, **{f"{p}_ms": statistics.median(runs[p][batch]) for p in PLACEMENTS}}
        row["runs_ms"] = {p: runs[p][batch] for p in PLACEMENTS}
        row["worker_over_main"] = row["worker_thread_ms"] / row["main_thread_ms"]
        row["released_over_main"] = row["worker_thread_released_ms"] / row["main_thread_ms"]
        row["released_vs_worker_p"] = rank_test(
            runs["worker_thread_released"][batch], runs["worker_thread"][batch]
        )
        rows.append(row)
        print(
            f"batch {batch:>3}: main thread {row['main_thread_ms']:.2f} ms, worker thread {row['worker_thread_ms']:.2f} ms "
            f"({row['worker_over_main']:.2f}x), worker after releasing the main pool "
            f"{row['worker_thread_released_ms']:.2f} ms ({row['released_over_main']:.2f}x; "
            f"rank test vs worker p = {row['released_vs_worker_p']:.3f})"
        )
    out = results_dir("cpu") / "worker_thread.json"
    config = {k: v for k, v in vars(args).items() if k != "child"}
    write_json(out, make_result("worker_thread", "openmp-pools", config, {"rows": rows}, "cpu"))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One roseinfer replica against two behind SMG, round-robin against cache-aware routing, on a workload of a few
long shared system prompts and many users (roseinfer/bench/scale_out.py; notebook 14 runs the same).

    pip install "roseinfer[cluster]"
    python benchmarks/benchmark_cluster.py --model gpt2 --repeats 5

Writes results/cpu/cluster.json: per setup and run, output tok/s, TTFT p50/p99, the prompt tokens found in
the replicas' prefix caches; the same-answer check; one replica's prefill cost per token.
"""

from __future__ import annotations

import argparse
import statistics

from roseinfer.bench.results import cpu_info, make_result, results_dir, write_json
from roseinfer.bench.scale_out import (
    SETUPS,
    Setups,
    Workload,
    distinct_prompts,
    measure,
    prefill_ms_per_token,
    same_answers,
    summary,
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--system-prompts", type=int, default=8)
    p.add_argument("--system-words", type=int, default=300)
    p.add_argument("--users", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=8)
    args = p.parse_args(argv)
    workload = Workload(args.system_prompts, args.system_words, args.users, max_tokens=args.max_tokens,
                        concurrency=args.concurrency)
    with Setups(["--model", args.model, "--num-kv-blocks", "1024"]) as setups:
        same = same_answers(setups, args.model, distinct_prompts(9), 8)
        prefill = prefill_ms_per_token(setups.pair.workers[0].url, args.model)
        runs = measure(setups, args.model, workload, args.repeats)
    table = summary(runs)
    for setup in SETUPS:
        t = table[setup]
        print(f"{setup:<12} {statistics.median(t['tok_s']):7.1f} tok/s  TTFT p50 {statistics.median(t['ttft_p50_ms']):6.0f} ms"
              f"  p99 {statistics.median(t['ttft_p99_ms']):6.0f} ms  hit rate {statistics.median(t['hit_rate']):.2f}"
              f"  same answers: {same[setup]}")
    print(f"one replica of the pair: {prefill:.2f} ms of prefill per prompt token")
    out = results_dir("cpu") / "cluster.json"
    config = vars(args) | cpu_info()
    write_json(out, make_result("cluster", "one-replica-vs-round-robin-vs-cache-aware", config,
                                {"setups": table, "same_answers": same, "prefill_ms_per_token": prefill}, "cpu"))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

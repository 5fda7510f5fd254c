"""HTTP load generator for any OpenAI-compatible /v1/completions (roseinfer's, or another server's).

    python -m roseinfer.server --model gpt2 &
    python benchmarks/benchmark_serving.py --base-url http://127.0.0.1:8000 --num-prompts 64 \
        --input-len 256 --output-len 64 --request-rate 8 --ignore-eos

Requests are streamed (SSE) with `stream_options.include_usage`; prompts are
random token ids of exactly --input-len tokens (or, with --prompt-format
text, those ids decoded to text). Arrivals are all at once (--request-rate
inf) or gamma-distributed with mean 1/rate (--burstiness 1 = Poisson);
--max-concurrency caps requests in flight. Metric definitions: see
roseinfer.bench.serving. Writes results/<device>/serving-<label>-rate<rate>.json.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from roseinfer.bench.results import make_result, results_dir, write_json
from roseinfer.bench.serving import LoadSetup, run_load


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="the served model name (default: the first of /v1/models)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s; inf = all at once")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps (1 = Poisson)")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--prompt-format", choices=["ids", "text"], default="ids")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--label", default="roseinfer", help="names the result file (server, variant, ...)")
    p.add_argument("--device", default="cpu", help="the device the server runs on (for results/<device>/)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--output-json", default=None)
    return p


def report(args, m: dict[str, Any]) -> None:
    print(
        f"{m['num_requests']} ok, {m['failed']} failed, rate {args.request_rate} req/s, {m['duration_s']:.2f}s: "
        f"{m['request_throughput_req_s']:.2f} req/s, {m['output_throughput_tok_s']:.1f} output tok/s"
    )
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms"):
        s = m[key]
        print(
            f"  {key:<15} mean {s['mean']:9.2f}  p50 {s['p50']:9.2f}  p95 {s['p95']:9.2f}  p99 {s['p99']:9.2f}"
        )
    for e in m["errors"]:
        print("  error:", e)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    setup = LoadSetup(
        base_url=args.base_url,
        model=args.model,
        api_key=args.api_key,
        num_prompts=args.num_prompts,
        input_len=args.input_len,
        output_len=args.output_len,
        request_rate=args.request_rate,
        burstiness=args.burstiness,
        max_concurrency=args.max_concurrency,
        ignore_eos=args.ignore_eos,
        seed=args.seed,
        timeout=args.timeout,
        prompt_format=args.prompt_format,
        progress=not args.no_progress,
    )
    metrics = asyncio.run(run_load(setup))
    report(args, metrics)
    config = {k: v for k, v in vars(args).items() if k not in ("output_json", "no_progress", "api_key")}
    rate = "inf" if args.request_rate == float("inf") else f"{args.request_rate:g}"
    out = args.output_json or results_dir(args.device) / f"serving-{args.label}-rate{rate}.json"
    write_json(out, make_result("serving", args.label, config, metrics, args.device))
    print(f"wrote {out}")
    return 0 if metrics["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

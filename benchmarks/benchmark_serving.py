"""HTTP load generator for any OpenAI-compatible /v1/completions (roseinfer's, or another server's).

    python -m roseinfer.server --model gpt2 &
    python benchmarks/benchmark_serving.py --base-url http://127.0.0.1:8000 --num-prompts 64 \
        --input-len 256 --output-len 64 --request-rate 8 --ignore-eos

Requests are streamed (SSE) with `stream_options.include_usage`, prompts are
random token ids of exactly --input-len tokens. Arrivals are all at once
(--request-rate inf) or gamma-distributed with mean 1/rate (--burstiness 1 =
Poisson); --max-concurrency caps requests in flight. TTFT is the first text
chunk, ITL the gaps between chunks, TPOT (E2E - TTFT) / (output tokens - 1)
with the token count from the server's usage. Writes
results/<device>/serving-<label>-rate<rate>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import httpx

from roseinfer.bench.metrics import RequestRecord, request_metrics, summarize
from roseinfer.bench.results import make_result, results_dir, write_json
from roseinfer.bench.workloads import poisson_arrivals, random_prompts


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
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--label", default="roseinfer", help="names the result file (server, variant, ...)")
    p.add_argument("--device", default="cpu", help="the device the server runs on (for results/<device>/)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--output-json", default=None)
    return p


class Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled, self.start = total, 0, enabled, time.perf_counter()

    def step(self) -> None:
        self.done += 1
        if self.enabled:
            width = 30
            filled = width * self.done // self.total
            rate = self.done / (time.perf_counter() - self.start)
            sys.stderr.write(
                f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {rate:.1f} req/s"
            )
            if self.done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


async def one_request(client: httpx.AsyncClient, url: str, body: dict, record: RequestRecord) -> None:
    record.start = time.perf_counter()
    chunk_times: list[float] = []
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            raise RuntimeError(f"HTTP {response.status_code}: {text[:200]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                break
            payload = json.loads(data)
            if "error" in payload:
                raise RuntimeError(payload["error"].get("message"))
            if payload.get("usage"):
                record.extra["completion_tokens"] = payload["usage"]["completion_tokens"]
            if any(c.get("text") for c in payload.get("choices", [])):
                chunk_times.append(time.perf_counter())
    record.end = time.perf_counter()
    record.extra["chunk_times"] = chunk_times


async def run(args) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(
        base_url=args.base_url, headers=headers, timeout=args.timeout, limits=limits
    ) as client:
        model = args.model or (await client.get("/v1/models")).json()["data"][0]["id"]
        workload = random_prompts(args.num_prompts, args.input_len, args.output_len, args.seed)
        arrivals = poisson_arrivals(args.num_prompts, args.request_rate, args.burstiness, args.seed)
        gate = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
        progress = Progress(args.num_prompts, not args.no_progress)
        records = [RequestRecord(start=0.0, prompt_tokens=args.input_len) for _ in workload]
        errors: list[str] = []

        async def launch(i: int, t0: float) -> None:
            await asyncio.sleep(max(0.0, t0 + arrivals[i] - time.perf_counter()))
            body = {
                "model": model,
                "prompt": workload[i].prompt_token_ids,
                "max_tokens": workload[i].max_new_tokens,
                "temperature": 0.0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            if args.ignore_eos:
                body["ignore_eos"] = True
            try:
                if gate is None:
                    await one_request(client, "/v1/completions", body, records[i])
                else:
                    async with gate:
                        await one_request(client, "/v1/completions", body, records[i])
            except Exception as exc:  # counted, reported; the run goes on
                errors.append(f"request {i}: {exc}")
            progress.step()

        t0 = time.perf_counter()
        await asyncio.gather(*(launch(i, t0) for i in range(args.num_prompts)))
        duration = time.perf_counter() - t0
    ok = [r for r in records if r.end is not None and "chunk_times" in r.extra]
    for r in ok:
        # One "token time" per chunk for TTFT/ITL; the usage count for TPOT and throughput.
        r.token_times = r.extra["chunk_times"]
    metrics = request_metrics(ok, duration)
    n_tokens = [int(r.extra.get("completion_tokens", len(r.token_times))) for r in ok]
    metrics["total_output_tokens"] = sum(n_tokens)
    metrics["output_throughput_tok_s"] = sum(n_tokens) / duration
    metrics["tpot_ms"] = summarize(
        ((r.latency - r.ttft) / (n - 1) for r, n in zip(ok, n_tokens) if n > 1 and r.ttft is not None), 1000
    )
    metrics["failed"] = len(errors)
    metrics["errors"] = errors[:10]
    metrics["model"] = model
    return metrics


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
    metrics = asyncio.run(run(args))
    report(args, metrics)
    config = {k: v for k, v in vars(args).items() if k not in ("output_json", "no_progress", "api_key")}
    rate = "inf" if args.request_rate == float("inf") else f"{args.request_rate:g}"
    out = args.output_json or results_dir(args.device) / f"serving-{args.label}-rate{rate}.json"
    write_json(out, make_result("serving", args.label, config, metrics, args.device))
    print(f"wrote {out}")
    return 0 if metrics["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

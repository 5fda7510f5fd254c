"""HTTP load against OpenAI-compatible servers: the core of benchmark_serving.py, serving_sweep.py
and notebook 11.

- `run_load(setup)`: stream `num_prompts` completions at a request rate (all
  at once, or gamma-distributed gaps: burstiness 1 = Poisson), measure TTFT
  (first text chunk), ITL (gaps between chunks), TPOT ((E2E - TTFT) /
  (tokens - 1), tokens from the server's usage) and E2E;
- `start_server` / `stop_server`: a server in a subprocess, up when its
  health endpoint answers, stopped with SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx

from roseinfer.bench.metrics import RequestRecord, request_metrics, summarize
from roseinfer.bench.workloads import poisson_arrivals, random_prompts


@dataclass
class LoadSetup:
    base_url: str = "http://127.0.0.1:8000"
    model: str | None = None  # None: the first of /v1/models
    api_key: str | None = None
    num_prompts: int = 32
    input_len: int = 128
    output_len: int = 64
    request_rate: float = float("inf")
    burstiness: float = 1.0
    max_concurrency: int | None = None
    ignore_eos: bool = True  # vLLM's extension; for servers that refuse unknown fields, False
    seed: int = 0
    timeout: float = 600.0
    prompt_format: str = (
        "ids"  # "ids": exact token ids; "text": the same ids decoded (for servers that want text)
    )
    progress: bool = False
    keep_texts: bool = False  # return each request's text (to compare two servers' greedy answers)


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


async def _one_request(client: httpx.AsyncClient, body: dict, record: RequestRecord) -> str:
    """Stream one completion into `record`; returns its text."""
    record.start = time.perf_counter()
    chunk_times: list[float] = []
    pieces: list[str] = []
    async with client.stream("POST", "/v1/completions", json=body) as response:
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
            text = "".join(c.get("text") or "" for c in payload.get("choices", []))
            if text:
                chunk_times.append(time.perf_counter())
                pieces.append(text)
    record.end = time.perf_counter()
    record.token_times = chunk_times  # one "token time" per chunk: TTFT and ITL are per chunk
    return "".join(pieces)


async def run_load(setup: LoadSetup) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {setup.api_key}"} if setup.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    workload = random_prompts(setup.num_prompts, setup.input_len, setup.output_len, setup.seed)
    if setup.prompt_format == "text":
        from roseinfer.tokenizer import GPT2Tokenizer

        tokenizer = GPT2Tokenizer.from_pretrained()
    arrivals = poisson_arrivals(setup.num_prompts, setup.request_rate, setup.burstiness, setup.seed)
    records = [RequestRecord(start=0.0, prompt_tokens=setup.input_len) for _ in workload]
    texts: list[str | None] = [None] * len(workload)
    errors: list[str] = []
    async with httpx.AsyncClient(
        base_url=setup.base_url, headers=headers, timeout=setup.timeout, limits=limits
    ) as client:
        model = setup.model or (await client.get("/v1/models")).json()["data"][0]["id"]
        gate = asyncio.Semaphore(setup.max_concurrency) if setup.max_concurrency else None
        progress = Progress(setup.num_prompts, setup.progress)

        async def launch(i: int, t0: float) -> None:
            await asyncio.sleep(max(0.0, t0 + arrivals[i] - time.perf_counter()))
            ids = workload[i].prompt_token_ids
            body = {
                "model": model,
                "prompt": ids if setup.prompt_format == "ids" else tokenizer.decode(ids),
                "max_tokens": workload[i].max_new_tokens,
                "temperature": 0.0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            if setup.ignore_eos:
                body["ignore_eos"] = True
            try:
                if gate is None:
                    texts[i] = await _one_request(client, body, records[i])
                else:
                    async with gate:
                        texts[i] = await _one_request(client, body, records[i])
            except Exception as exc:  # counted and reported; the run goes on
                errors.append(f"request {i}: {exc}")
            progress.step()

        t0 = time.perf_counter()
        await asyncio.gather(*(launch(i, t0) for i in range(setup.num_prompts)))
        duration = time.perf_counter() - t0
    ok = [r for r in records if r.end is not None]
    metrics = request_metrics(ok, duration)
    n_tokens = [int(r.extra.get("completion_tokens", len(r.token_times))) for r in ok]
    metrics["total_output_tokens"] = sum(n_tokens)
    metrics["output_throughput_tok_s"] = sum(n_tokens) / duration
    metrics["tpot_ms"] = summarize(
        ((r.latency - r.ttft) / (n - 1) for r, n in zip(ok, n_tokens) if n > 1 and r.ttft is not None), 1000
    )
    # Per request in workload order (None where it failed): how many tokens, and (asked for) the text.
    if setup.keep_texts:
        metrics["texts"] = texts
    metrics["completion_tokens"] = [
        int(r.extra.get("completion_tokens", len(r.token_times))) if r.end is not None else None
        for r in records
    ]
    metrics.update(failed=len(errors), errors=errors[:10], model=model)
    return metrics


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    command: list[str], port: int, timeout_s: float = 300, env: dict | None = None
) -> subprocess.Popen:
    """Start a server process and wait until GET /health answers 200."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {proc.stdout.read()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("the server did not come up")


def stop_server(proc: subprocess.Popen, timeout_s: float = 30) -> int:
    """SIGTERM, then the exit code (roseinfer's server exits 0)."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def roseinfer_server_command(port: int, *server_args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "roseinfer.server",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *server_args,
    ]


def hf_server_command(
    model_dir: str,
    port: int,
    dtype: str = "float32",
    kv_tokens: int = 16384,
    block_size: int = 16,
    max_batch_tokens: int = 2048,
) -> list[str]:
    """`transformers serve` on a local model directory, with its continuous batching (needs accelerate).

    The dtype is pinned (its default, "auto", follows the checkpoint) so a comparison runs both
    servers in the same precision. The KV pool is pinned too: left to itself on a CPU, transformers
    sizes it to 60-90% of the machine's RAM (13 GB here, enough for the OOM killer); 16384 tokens is
    about roseinfer's default CPU pool for GPT-2 small in fp32 (1 GiB), and 2048 tokens per step is
    roseinfer's default `max_num_batched_tokens`.
    """
    return [
        sys.executable,
        "-m",
        "transformers.cli.transformers",
        "serve",
        model_dir,
        "--port",
        str(port),
        "--continuous-batching",
        "--dtype",
        dtype,
        "--cb-block-size",
        str(block_size),
        "--cb-num-blocks",
        str(kv_tokens // block_size),
        "--cb-max-batch-tokens",
        str(max_batch_tokens),
    ]


def run_load_sync(setup: LoadSetup) -> dict[str, Any]:
    """run_load from synchronous code, also where an event loop already runs (a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_load(setup))
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, run_load(setup)).result()


POINT_KEYS = (
    "request_throughput_req_s",
    "output_throughput_tok_s",
    "ttft_ms",
    "tpot_ms",
    "itl_ms",
    "e2e_latency_ms",
    "failed",
    "num_requests",
)


def sweep(setup: LoadSetup, rates: list[float]) -> list[dict[str, Any]]:
    """One load run per request rate against one live server (after a small untimed warm-up)."""
    warmup = LoadSetup(**{**setup.__dict__, "num_prompts": 2, "request_rate": float("inf")})
    run_load_sync(warmup)
    points = []
    for rate in rates:
        setup.request_rate = rate
        m = run_load_sync(setup)
        points.append({"request_rate": rate, **{k: m[k] for k in POINT_KEYS}, "errors": m["errors"][:3]})
    return points

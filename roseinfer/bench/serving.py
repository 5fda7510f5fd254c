"""HTTP load against OpenAI-compatible servers: the core of benchmark_serving.py, serving_sweep.py
and notebook 13.

- `run_load(setup)`: stream `num_prompts` completions at a request rate (all
  at once, or gamma-distributed gaps: burstiness 1 = Poisson), measure TTFT
  (first text chunk), ITL (gaps between chunks), TPOT ((E2E - TTFT) /
  (tokens - 1), tokens from the server's usage) and E2E; with
  `vllm_backend` set, it posts the very bodies `vllm bench serve --backend
  openai|openai-chat --dataset-name random` posts (text prompts made as that
  dataset makes them), so a machine without vLLM still loads a server the
  way vLLM's client does;
- `start_server` / `stop_server`: a server in a subprocess, up when its
  health endpoint answers, stopped with SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
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
    # "openai" or "openai-chat": the body `vllm bench serve --backend ...` sends (see vllm_body);
    # None: roseinfer's own greedy body with token-id prompts (prompt_format).
    vllm_backend: str | None = None


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


async def _one_request(
    client: httpx.AsyncClient, body: dict, record: RequestRecord, endpoint: str = "/v1/completions"
) -> str:
    """Stream one completion (or chat completion) into `record`; returns its text.

    Besides the text chunks' times it records what vLLM's client keys on:
    `chunks`, every streamed event that has choices (vLLM's client starts its
    TTFT clock at the first such event and counts one ITL per later one);
    whether the first of them carried text (a server whose first chunk is
    empty, a bare role say, would get a first-token time for no token); and
    `empty_chunks`, those without text that do not end the choice either
    (the closing chunk with finish_reason is OpenAI's shape).
    """
    record.start = time.perf_counter()
    chunk_times: list[float] = []
    pieces: list[str] = []
    chat = endpoint.endswith("/chat/completions")
    record.extra["chunks"] = record.extra["empty_chunks"] = 0
    async with client.stream("POST", endpoint, json=body) as response:
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
            choices = payload.get("choices") or []
            if chat:
                text = "".join((c.get("delta") or {}).get("content") or "" for c in choices)
            else:
                text = "".join(c.get("text") or "" for c in choices)
            if choices:
                if record.extra["chunks"] == 0:
                    record.extra["first_chunk_has_token"] = bool(text)
                record.extra["chunks"] += 1
                if not text and not any(c.get("finish_reason") for c in choices):
                    record.extra["empty_chunks"] += 1
            if text:
                chunk_times.append(time.perf_counter())
                pieces.append(text)
    record.end = time.perf_counter()
    record.token_times = chunk_times  # one "token time" per chunk: TTFT and ITL are per chunk
    return "".join(pieces)


def vllm_random_texts(num_prompts: int, input_len: int, seed: int, tokenizer=None) -> list[str]:
    """Text prompts of exactly `input_len` GPT-2 tokens, made as vLLM's random dataset makes them.

    `vllm bench serve --dataset-name random` takes `input_len` consecutive
    vocabulary ids from a random offset (special tokens left out), decodes
    them, and re-encodes: where the text tokenizes to a different length it
    pads with random ids or truncates and tries again, so the server sees
    text whose length in tokens is exactly the one asked for.
    """
    import random

    if tokenizer is None:
        from roseinfer.tokenizer import GPT2Tokenizer

        tokenizer = GPT2Tokenizer.from_pretrained()
    rng = random.Random(seed)
    allowed = list(range(tokenizer.vocab_size - 1))  # GPT-2's one special token is the last id
    texts = []
    for _ in range(num_prompts):
        offset = rng.randrange(len(allowed))
        ids = [allowed[(offset + k) % len(allowed)] for k in range(input_len)]
        for _ in range(10):
            text = tokenizer.decode(ids)
            ids = tokenizer.encode(text)
            if len(ids) == input_len:
                break
            ids = ids[:input_len] + [rng.randrange(len(allowed)) for _ in range(input_len - len(ids))]
        texts.append(tokenizer.decode(ids))
    return texts


def vllm_body(backend: str, model: str, prompt: str, max_tokens: int, ignore_eos: bool = True) -> dict:
    """The JSON `vllm bench serve --backend {openai,openai-chat}` posts for one request (vLLM 0.32).

    No temperature: vLLM's client stopped sending 0 and leaves sampling to the
    server's default. Copied from vllm/benchmarks/lib/endpoint_request_func.py;
    tests/test_load_generator_bodies.py posts the same bodies.
    """
    if backend == "openai":
        body = {
            "model": model,
            "prompt": prompt,
            "repetition_penalty": 1.0,
            "max_tokens": max_tokens,
            "logprobs": None,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    elif backend == "openai-chat":
        body = {
            "model": model,
            "messages": [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
            "max_completion_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    else:
        raise ValueError(f"unknown vLLM backend {backend!r}: openai or openai-chat")
    if ignore_eos:
        body["ignore_eos"] = True
    return body


async def run_load(setup: LoadSetup) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {setup.api_key}"} if setup.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    workload = random_prompts(setup.num_prompts, setup.input_len, setup.output_len, setup.seed)
    if setup.prompt_format == "text":
        from roseinfer.tokenizer import GPT2Tokenizer

        tokenizer = GPT2Tokenizer.from_pretrained()
    vllm_texts = (
        vllm_random_texts(setup.num_prompts, setup.input_len, setup.seed) if setup.vllm_backend else None
    )
    endpoint = "/v1/chat/completions" if setup.vllm_backend == "openai-chat" else "/v1/completions"
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
            if vllm_texts is not None:
                body = vllm_body(
                    setup.vllm_backend, model, vllm_texts[i], workload[i].max_new_tokens, setup.ignore_eos
                )
            else:
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
                    texts[i] = await _one_request(client, body, records[i], endpoint)
                else:
                    async with gate:
                        texts[i] = await _one_request(client, body, records[i], endpoint)
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
    for key in ("chunks", "empty_chunks"):
        metrics[key] = [r.extra.get(key) if r.end is not None else None for r in records]
    metrics["first_chunk_has_token"] = [
        r.extra.get("first_chunk_has_token") if r.end is not None else None for r in records
    ]
    metrics.update(failed=len(errors), errors=errors[:10], model=model)
    return metrics


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    command: list[str],
    port: int,
    timeout_s: float = 300,
    env: dict | None = None,
    log_path: str | Path | None = None,
    own_group: bool = False,
) -> subprocess.Popen:
    """Start a server process and wait until GET /health answers 200.

    With `log_path` its output goes to that file rather than to a pipe: a
    chatty server (vLLM logs every few seconds) would otherwise fill a pipe
    nobody reads and stall on its next write. With `own_group` it runs in a
    process group of its own, which stop_server empties: vLLM's API server
    starts its engine in a child process, which must not outlive it.
    """
    log = open(log_path, "w") if log_path else None  # noqa: SIM115 (the child writes to it until it exits)
    try:
        proc = subprocess.Popen(
            command,
            stdout=log or subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=own_group,
        )
    finally:
        if log:
            log.close()  # the child holds its own copy of the descriptor
    proc.own_group = own_group  # type: ignore[attr-defined]

    def output_tail() -> str:
        return Path(log_path).read_text(errors="replace")[-2000:] if log_path else proc.stdout.read()[-2000:]

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {output_tail()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    stop_server(proc, timeout_s=0)
    raise RuntimeError(f"the server did not come up in {timeout_s:.0f} s: {output_tail()}")


def stop_server(proc: subprocess.Popen, timeout_s: float = 30) -> int:
    """SIGTERM, then the exit code (roseinfer's server exits 0); SIGKILL after `timeout_s`.

    A server started with `own_group` has what is left of its process group
    killed once it has exited.
    """
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    if getattr(proc, "own_group", False):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return code


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

"""The seed blog posts' commands, run as printed (package path `rosellm.roseinfer` -> `roseinfer`, cuda -> cpu).

The benchmarks ask for `--hf-model-id gpt2`, so they run verbatim against a
Hub-compatible endpoint on 127.0.0.1 (tests/hub_server.py, via HF_ENDPOINT)
that serves a tiny GPT-2 as openai-community/gpt2: the real download path,
at test size. The server command takes a checkpoint, so it gets a tiny one.
The README's "From the blog" section lists the same commands.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from hub_server import HubServer
from live_server import free_port
from roseinfer import InferenceEngine, SamplingParams

ROOT = Path(__file__).resolve().parents[1]

SERVER = (
    "python -m roseinfer.server --checkpoint-path CKPT --tokenizer-name gpt2 --device cpu "
    "--host 127.0.0.1 --port 8089"
)
CURL_GENERATE = (
    'curl -N -X POST http://127.0.0.1:8089/generate -H "Content-Type: application/json" '
    """-d '{"prompt":"Hello","max_new_tokens":8,"stream":true}'"""
)
CURL_CHAT = (
    'curl -X POST http://127.0.0.1:8089/v1/chat/completions -H "Content-Type: application/json" '
    """-d '{"model": "roseinfer-gpt2", "messages": [{"role": "system", "content": "You are a helpful """
    """assistant."}, {"role": "user", "content": "Hello!"}], "max_tokens": 32, "temperature": 0.7, """
    """"top_p": 0.95, "stream": true}'"""
)
BENCH_STREAMING = (
    'python -m roseinfer.benchmark_streaming --hf-model-id gpt2 --device cpu --prompt "Hello" --pretok '
    "--tokenize-workers 0 --stream-interval 8 --num-requests 64 --warmup-runs 1 --repeat-runs 1 "
    "--submit-interval-ms 20 --submit-schedule absolute --max-batch-size 64 --prefill-max-batch-size 64 "
    "--max-new-tokens 128 --no-stop-on-eos --no-prefix-cache"
)
BENCH_SCHEDULER = (
    'python -m roseinfer.benchmark_scheduler --hf-model-id gpt2 --device cpu --prompt "Hello" '
    "--num-requests 8 --max-new-tokens 8 --mode online --warmup-runs 0 --repeat-runs 1"
)
SEED_COMMANDS = [SERVER, CURL_GENERATE, CURL_CHAT, BENCH_STREAMING, BENCH_SCHEDULER]

STREAMING_LINES = [
    "=== streaming benchmark ===",
    "Model: gpt2",
    "Device: cpu",
    "Pretok: True",
    "Tokenize workers: 0",
    "Paged attention:",
    "CUDA Graph:",
    "NVTX:",
    "Requests: 64",
    "Prompt tokens (total): 64",
    "Completion tokens (total): 8192",
    "Submit wall:",
    "Submit interval/schedule: 20.000 ms / absolute",
    "Submit lag p50/p95/p99:",
    "add_request latency p50/p95/p99:",
    "Tokenize p50/p95/p99:",
    "Queue wait (post-tok) p50/p95/p99:",
    "Prefill->first token p50/p95/p99:",
    "TTFT p50/p95/p99:",
    "TPOT p50/p95/p99:",
    "ITL p50/p95/p99:",
    "Latency p50/p95/p99:",
    "Throughput (completion,total):",
]
SCHEDULER_LINES = [
    "=== online summary ===",
    "Warmup runs: 0",
    "Measured runs: 1",
    "Decode time p50/mean:",
    "Total time p50/mean:",
    "Throughput(completion,decode) p50/mean:",
    "Throughput(completion,total) p50/mean:",
    "TTFT p50/mean:",
    "TPOT p50/mean:",
    "Latency p50/mean:",
]


def argv(command: str, **replace: str) -> list[str]:
    for old, new in replace.items():
        command = command.replace(old, new)
    args = shlex.split(command)
    return [sys.executable, *args[1:]] if args[0] == "python" else args


@pytest.fixture(scope="module")
def hub_env(hf_tiny_dir, tmp_path_factory):
    """The environment of a machine whose 'Hub' holds a tiny GPT-2 as openai-community/gpt2."""
    with HubServer() as hub:
        hub.add_directory("openai-community/gpt2", hf_tiny_dir)
        yield {
            **os.environ,
            "HF_ENDPOINT": hub.url,
            "HF_HUB_CACHE": str(tmp_path_factory.mktemp("hf-cache")),
            "ROSEINFER_RESULTS_DIR": str(tmp_path_factory.mktemp("results")),
        }


def _assert_lines_in_order(text: str, expected: list[str]) -> None:
    lines = text.splitlines()
    at = 0
    for prefix in expected:
        found = next((i for i in range(at, len(lines)) if lines[i].startswith(prefix)), None)
        assert found is not None, f"no line {prefix!r} after line {at} in:\n{text}"
        at = found + 1


def test_readme_lists_the_seed_commands():
    readme = (ROOT / "README.md").read_text()
    assert "## From the blog" in readme
    for command in SEED_COMMANDS:
        assert command in readme, command


def test_seed_server_generate_and_chat_commands(hf_tiny_dir, tmp_path):
    checkpoint = tmp_path / "roseinfer-gpt2.pt"
    engine = InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=16)
    engine.save_checkpoint(checkpoint)
    expected = engine.generate("Hello", SamplingParams(max_new_tokens=8))[0].text
    # Port 8089 as printed, unless something else on this machine holds it.
    port = "8089" if _port_is_free(8089) else str(free_port())
    log = tmp_path / "server.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            argv(SERVER, CKPT=str(checkpoint), **{"8089": port}), stdout=out, stderr=subprocess.STDOUT
        )
    try:
        _wait_healthy(server, f"http://127.0.0.1:{port}", log)
        generated = subprocess.run(argv(CURL_GENERATE, **{"8089": port}), capture_output=True, timeout=60)
        assert generated.returncode == 0 and generated.stdout.decode() == expected
        chat = subprocess.run(argv(CURL_CHAT, **{"8089": port}), capture_output=True, timeout=60)
        assert chat.returncode == 0, chat.stderr
        events = [
            line[len("data: ") :] for line in chat.stdout.decode().splitlines() if line.startswith("data: ")
        ]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert all(c["model"] == "roseinfer-gpt2" and c["object"] == "chat.completion.chunk" for c in chunks)
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
        base = f"http://127.0.0.1:{port}"
        models = httpx.get(base + "/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["gpt2", "roseinfer-gpt2"]
        assert all(m["root"] == str(checkpoint) and m["weights"] == f"roseinfer checkpoint {checkpoint}" for m in models)
        other = {"model": "not-served", "messages": [{"role": "user", "content": "Hi"}]}
        assert httpx.post(base + "/v1/chat/completions", json=other).status_code == 404
    finally:
        server.terminate()
        server.wait(timeout=20)
    startup = log.read_text()
    assert f"serving 'gpt2' / 'roseinfer-gpt2' with roseinfer checkpoint {checkpoint}" in startup


def test_seed_benchmark_streaming_command(hub_env):
    out = subprocess.run(argv(BENCH_STREAMING), capture_output=True, text=True, timeout=300, env=hub_env)
    assert out.returncode == 0, out.stderr
    _assert_lines_in_order(out.stdout, STREAMING_LINES)
    assert re.search(r"Weights: (HF Hub|local HF cache) openai-community/gpt2", out.stdout)


def test_seed_benchmark_scheduler_command(hub_env):
    out = subprocess.run(argv(BENCH_SCHEDULER), capture_output=True, text=True, timeout=300, env=hub_env)
    assert out.returncode == 0, out.stderr
    _assert_lines_in_order(out.stdout, SCHEDULER_LINES)
    # Downloaded by the first of the two benchmarks to run, found in the cache by the second.
    assert re.search(r"roseinfer: (HF Hub|local HF cache) openai-community/gpt2", out.stderr)


def _port_is_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait_healthy(proc: subprocess.Popen, base: str, log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(log.read_text())
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    raise RuntimeError("the server did not come up:\n" + log.read_text())

"""benchmarks/compare_served.py: roseinfer's live server loaded with the bodies vLLM's client sends.

CI has no vLLM: the harness must then run roseinfer's server under
roseinfer.bench.serving, say the peer is missing, and still check that the
first streamed chunk of every response carries a token. The parser of
`vllm bench serve`'s JSON is checked on a result of the shape vLLM 0.32 writes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness.readme import compare_served_section
from harness.served_compare import (
    SERVED_ENGINES,
    response_checks,
    server_env,
    summary_from_vllm_bench,
    vllm_compile,
)

from roseinfer.bench.serving import vllm_body, vllm_random_texts
from roseinfer.tokenizer import GPT2Tokenizer

ROOT = Path(__file__).resolve().parents[1]


def test_harness_runs_roseinfer_alone_where_vllm_is_missing(tmp_path):
    out = tmp_path / "results" / "cpu" / "compare_served.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "compare_served.py"),
            "--preset",
            "gpt2-tiny",
            "--engines",
            "roseinfer-fp32",
            "vllm-fp32",
            "--rounds",
            "1",
            "--num-prompts",
            "4",
            "--output-len",
            "6",
            "--peers-dir",
            str(tmp_path / "no-peers"),
            "--weights-dir",
            str(tmp_path / "weights"),
            "--log-dir",
            str(tmp_path / "logs"),
            "--output-json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "skipping vllm-fp32:" in done.stdout and "make peer-vllm" in done.stdout
    result = json.loads(out.read_text())
    config, metrics = result["config"], result["metrics"]
    assert result["benchmark"] == "compare_served" and config["completed_rounds"] == 1
    assert config["client"] == "roseinfer.bench.serving" and set(config["skipped"]) == {"vllm-fp32"}
    assert config["request_body"]["repetition_penalty"] == 1.0 and "temperature" not in config["request_body"]
    assert set(metrics["engines"]) == {"roseinfer-fp32"} and metrics["roseinfer_over_vllm_output_tok_s"] == {}
    block = metrics["engines"]["roseinfer-fp32"]
    assert block["output_throughput_tok_s"] > 0 and block["request_throughput_req_s"] > 0
    assert 0 < block["ready_s"] == block["runs_ready_s"][0]
    for latency in ("ttft_ms", "tpot_ms", "itl_ms"):
        assert all(block[latency][stat] > 0 for stat in ("mean", "median", "p99")), latency
    # Every response (4 and the probe) was seen by our client: each first chunk carried a token.
    assert block["first_chunk_carries_token"] and block["responses_seen"] == 5
    assert block["empty_chunks"] == 0 and block["all_completed"] and block["exact_output_lengths"]
    run = block["rounds"][0]
    assert run["output_tokens"] == [6] * 4 and run["server"]["dtype"] == "float32"
    assert (
        run["server_exit_code"] == 0 and (tmp_path / "logs" / "roseinfer-fp32-round1of1.server.log").is_file()
    )
    section = compare_served_section(out.parents[1])
    assert "| roseinfer-fp32 | roseinfer 0.1.0, float32 |" in section and "Not run: vllm-fp32" in section


def test_vllm_bench_result_is_read_per_response():
    """The fields `vllm bench serve --save-result --save-detailed` writes; request 2 failed."""
    data = {
        "num_prompts": 3,
        "duration": 2.0,
        "completed": 2,
        "failed": 1,
        "total_output_tokens": 8,
        "request_throughput": 1.0,
        "output_throughput": 4.0,
        "output_lens": [4, 4, 0],
        "itls": [[0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.0], []],
        "errors": ["", "", "HTTP 500"],
        **{f"{s}_{m}": 10.0 for s in ("mean", "median", "p99") for m in ("ttft_ms", "tpot_ms", "itl_ms")},
    }
    run = summary_from_vllm_bench(data)
    assert run["chunks"] == [4, 5, None] and run["output_tokens"] == [4, 4, None]
    assert run["output_throughput_tok_s"] == 4.0 and run["ttft_ms"]["median"] == 10.0
    probe = {"first_chunk_has_token": True, "empty_chunks": 0}
    checks = response_checks(run, probe, num_prompts=3, output_len=4)
    assert checks["extra_chunks"] == 1 and not checks["all_completed"] and not checks["exact_output_lengths"]
    assert checks["first_chunk_carries_token"] and checks["responses_seen"] == 1
    assert not response_checks(run, {**probe, "first_chunk_has_token": False}, 3, 4)[
        "first_chunk_carries_token"
    ]


def test_vllm_shaped_prompts_and_bodies():
    tokenizer = GPT2Tokenizer.from_pretrained()
    texts = vllm_random_texts(8, 64, seed=0, tokenizer=tokenizer)
    assert all(len(tokenizer.encode(t)) == 64 for t in texts) and len(set(texts)) == 8
    chat = vllm_body("openai-chat", "m", "hi", 16)
    assert chat["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert chat["max_completion_tokens"] == 16 and chat["ignore_eos"] is True


def test_vllm_compile_is_read_from_its_log():
    assert (
        vllm_compile("... [backbone] Directly load AOT compilation from path /x ...") == "loaded from cache"
    )
    assert vllm_compile("... [backbone] saved AOT compiled function to /x ...") == "compiled"
    failed = (
        "WARNING [backbone] Compiling model again due to a load failure from /x, reason: ...\n... saved AOT"
    )
    assert vllm_compile(failed) == "compiled: the cache did not load"
    assert vllm_compile("nothing about it") is None


def test_server_environments():
    vllm = server_env(SERVED_ENGINES["vllm-bf16"], 2, Path("/tmp/fresh"))
    assert vllm["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and vllm["VLLM_CACHE_ROOT"] == "/tmp/fresh"
    ours = server_env(SERVED_ENGINES["roseinfer-bf16"], 2, Path("/tmp/fresh"))
    assert ours["OMP_NUM_THREADS"] == "2" and "VLLM_CACHE_ROOT" not in ours and ours["HF_HUB_OFFLINE"] == "1"

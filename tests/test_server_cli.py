"""`python -m roseinfer.server`: every flag does something, and SIGTERM shuts down cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
import torch

from live_server import free_port
from roseinfer.server.__main__ import build_app, build_parser
from roseinfer.server.manager import SchedulerManager


def app_for(*argv: str):
    return build_app(build_parser().parse_args(list(argv)))


def test_engine_and_model_flags(hf_tiny_dir, tmp_path):
    app = app_for(
        "--model",
        str(hf_tiny_dir),
        "--dtype",
        "bfloat16",
        "--device",
        "cpu",
        "--num-kv-blocks",
        "77",
        "--block-size",
        "8",
        "--max-batch-size",
        "5",
        "--max-num-batched-tokens",
        "99",
        "--no-prefix-cache",
        "--stream-interval",
        "4",
        "--max-inflight-requests",
        "3",
        "--served-model-name",
        "mine",
        "--cpu-linear",
        "onednn",
    )
    manager, settings = app.state.manager, app.state.settings
    engine = manager.engine
    try:
        assert engine.weights.source == "hf-directory"
        assert engine.dtype == torch.bfloat16 and engine.device.type == "cpu"
        assert engine.num_kv_blocks == 77 and engine.config.block_size == 8
        limits = manager._scheduler.limits
        assert limits.max_batch_size == 5 and limits.max_num_batched_tokens == 99
        assert limits.enable_prefix_cache is False
        assert manager.stream_interval == 4 and manager.max_inflight_requests == 3
        assert settings.served_model_name == "mine"
        assert engine.config.cpu_linear == "onednn"
    finally:
        manager.close()
    with pytest.raises(RuntimeError):
        app_for("--model", "gpt2-tiny", "--device", "nonsense-device")


def test_the_quantization_flag_builds_an_int8_engine(hf_tiny_dir):
    from roseinfer.kernels.cpu.bindings import load_f32_linear_kernel

    if load_f32_linear_kernel() is None:
        pytest.skip("no C compiler: no int8 kernel")
    app = app_for("--model", str(hf_tiny_dir), "--quantization", "int8")
    manager = app.state.manager
    try:
        engine = manager.engine
        assert engine.config.quantization == "int8" and engine.dtype == torch.float32
        assert engine.runner.model.__dict__["_packed_lm_head"].kernel == "int8"
    finally:
        manager.close()


def test_weights_flags(hf_tiny_dir, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from roseinfer import InferenceEngine

    checkpoint = tmp_path / "w.pt"
    InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=16).save_checkpoint(checkpoint)
    app = app_for("--checkpoint-path", str(checkpoint), "--num-kv-blocks", "16")
    assert app.state.manager.engine.weights.source == "checkpoint"
    app.state.manager.close()
    app = app_for("--model", "gpt2-tiny", "--weights-seed", "7", "--num-kv-blocks", "16")
    other = app_for("--model", "gpt2-tiny", "--weights-seed", "8", "--num-kv-blocks", "16")
    w7 = app.state.manager.engine.runner.model.wte.weight
    w8 = other.state.manager.engine.runner.model.wte.weight
    assert "seed 7" in app.state.manager.engine.weights.description and not torch.equal(w7, w8)
    for a in (app, other):
        a.state.manager.close()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    with pytest.raises(FileNotFoundError, match="local Hugging Face cache"):
        app_for("--hf-model-id", "nobody/nothing")
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        app_for("--model", "gpt2-tiny", "--tokenizer-name", str(tmp_path / "no-tokenizer"))


def test_api_key_and_chat_template_flags(tmp_path, monkeypatch):
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>")
    app = app_for(
        "--model",
        "gpt2-tiny",
        "--num-kv-blocks",
        "16",
        "--api-key",
        "k1",
        "--chat-template",
        str(template),
        "--max-request-bytes",
        "1234",
    )
    try:
        s = app.state.settings
        assert s.api_key == "k1" and s.max_request_bytes == 1234
        assert s.chat.render([{"role": "user", "content": "hi"}]) == "<user>hi<assistant>"
        # Always the production manager: earlier variants are built by the benchmark scripts only.
        assert type(app.state.manager) is SchedulerManager
    finally:
        app.state.manager.close()
    monkeypatch.setenv("ROSEINFER_API_KEY", "from-env")
    app = app_for("--model", "gpt2-tiny", "--num-kv-blocks", "16")
    assert app.state.settings.api_key == "from-env"
    app.state.manager.close()


def _start_server(*args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "roseinfer.server", "--host", "127.0.0.1", "--port", str(port), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(proc.stdout.read())
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not come up")


def test_sigterm_drains_the_admitted_requests_then_exits_zero():
    # gpt2 (124M) on CPU takes a while a token: the stream is still running at SIGTERM.
    proc, base = _start_server("--model", "gpt2", "--num-kv-blocks", "64", "--log-level", "warning")
    try:
        body = {"model": "gpt2", "prompt": "Hello", "max_tokens": 48, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)  # the signal is handled on the server's event loop
            # The socket stays open: a gateway sees the drain and sends new work elsewhere.
            health = httpx.get(base + "/health", timeout=5)
            assert health.status_code == 503 and "draining" in health.json()["error"]["message"]
            refused = httpx.post(base + "/v1/completions", json={**body, "stream": False}, timeout=5)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"  # the admitted stream ran to its end, no error event
        chunks = [json.loads(line[len("data: "):]) for line in rest[:-1]]
        assert not any("error" in c for c in chunks) and chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert proc.wait(timeout=20) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(base + "/health", timeout=1)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_drain_that_times_out_ends_what_is_left_and_exits_zero():
    proc, base = _start_server("--model", "gpt2", "--num-kv-blocks", "64", "--log-level", "warning",
                               "--drain-timeout", "0.5")
    try:
        body = {"model": "gpt2", "prompt": "Hello", "max_tokens": 500, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        assert "shutting down" in json.loads(rest[-2][len("data: ") :])["error"]["message"]
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - sent < 10
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_admin_drain_call_is_a_sigterm(hf_tiny_dir):
    proc, base = _start_server("--model", str(hf_tiny_dir), "--log-level", "warning", "--api-key", "k")
    try:
        assert httpx.post(base + "/admin/drain", timeout=5).status_code == 401  # an admin call needs the key
        drain = httpx.post(base + "/admin/drain", headers={"Authorization": "Bearer k"}, timeout=5)
        assert drain.status_code == 202 and drain.json() == {"status": "draining"}
        assert proc.wait(timeout=20) == 0  # nothing in flight: the drain ends at once, the process exits
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_server_binds_to_localhost_by_default():
    assert build_parser().parse_args([]).host == "127.0.0.1"


def test_seed_engine_flags_and_served_model_names(monkeypatch):
    app = app_for(
        "--model",
        "gpt2-tiny",
        "--num-kv-blocks",
        "16",
        "--paged-attn",
        "--nvtx",
        "--prefill-max-batch-size",
        "3",
    )
    try:
        engine = app.state.manager.engine
        assert engine.attention_backend == "cpu"  # --paged-attn: this device's paged-attention kernels
        assert engine.describe()["nvtx"] is False  # accepted, and reported off on a CPU
        assert engine.config.nvtx is True
        assert app.state.manager._scheduler.limits.prefill_max_batch_size == 3
        # The seed posts' clients ask for 'roseinfer-gpt2', served beside the model's own name.
        assert app.state.settings.model_names == ("gpt2-tiny", "roseinfer-gpt2")
    finally:
        app.state.manager.close()
    app = app_for("--model", "gpt2-tiny", "--num-kv-blocks", "16", "--served-model-name", "a", "b")
    app.state.manager.close()
    assert app.state.settings.model_names == ("a", "b")
    with pytest.raises(ValueError, match="--paged-attn means the 'cpu' attention backend"):
        app_for("--model", "gpt2-tiny", "--paged-attn", "--attention-backend", "torch")
    # Outside Triton's interpreter, its kernels cannot run on a CPU: said up front, not at the first step.
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        app_for("--model", "gpt2-tiny", "--num-kv-blocks", "16", "--attention-backend", "triton")


def test_nvtx_ranges_name_each_phase_of_a_step(engine, monkeypatch):
    from contextlib import contextmanager

    from roseinfer import SamplingParams

    names = []

    @contextmanager
    def recording_range(name):
        names.append(name)
        yield

    # No GPU here: record the ranges a CUDA runner would push.
    monkeypatch.setattr(torch.cuda.nvtx, "range", recording_range)
    monkeypatch.setattr(engine.runner, "nvtx", True)
    engine.generate("Hi", SamplingParams(max_new_tokens=2))
    assert {"roseinfer.prepare", "roseinfer.forward", "roseinfer.sample"} <= set(names)


def test_no_manager_variant_flag_and_no_history_in_the_server():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--manager-variant", "polling"])
    # The server's import graph stays clear of the earlier versions kept for the notebooks.
    code = (
        "import sys, roseinfer.server.__main__, roseinfer.server.app; "
        "print(sorted(m for m in sys.modules if m.startswith('roseinfer.history')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

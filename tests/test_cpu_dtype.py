"""The CPU's automatic dtype: bf16 where the CPU computes it natively, fp32 elsewhere, fp32 on request."""

from __future__ import annotations

import pytest
import torch

from roseinfer import InferenceEngine, SamplingParams
from roseinfer.config import native_bf16_cpu, resolve_dtype

CPU = torch.device("cpu")


def test_auto_follows_the_cpu_and_the_override(monkeypatch):
    monkeypatch.setenv("ROSEINFER_CPU_DTYPE", "auto")
    expected = torch.bfloat16 if native_bf16_cpu() else torch.float32
    assert resolve_dtype(None, CPU) == resolve_dtype("auto", CPU) == expected
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert resolve_dtype(None, CPU) == torch.float32  # emulated bf16 is slower than fp32
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert resolve_dtype(None, CPU) == torch.bfloat16
    monkeypatch.setenv("ROSEINFER_CPU_DTYPE", "float32")
    assert resolve_dtype(None, CPU) == torch.float32
    assert resolve_dtype("bfloat16", CPU) == torch.bfloat16  # an explicit dtype wins over the variable
    assert resolve_dtype(None, torch.device("cuda")) == torch.bfloat16  # the variable is the CPU's


def test_bf16_engine_agrees_with_fp32_on_most_greedy_tokens(hf_tiny_dir):
    """bf16 rounds differently, so tokens may part ways after a near-tie; they must mostly agree."""
    prompts = [[(7 * i + 3 * t) % 50000 for t in range(12)] for i in range(6)]
    params = SamplingParams(max_new_tokens=12, stop_on_eos=False)
    outs = {}
    for dtype in ("float32", "bfloat16"):
        engine = InferenceEngine.from_pretrained(str(hf_tiny_dir), dtype=dtype, num_kv_blocks=64)
        assert engine.dtype == getattr(torch, dtype)
        outs[dtype] = [o.token_ids for o in engine.generate(prompts, params)]
    first_tokens = sum(a[0] == b[0] for a, b in zip(outs["float32"], outs["bfloat16"]))
    assert first_tokens >= 5, outs


@pytest.mark.parametrize("batch", [1, 5])
def test_bf16_batched_equals_solo(hf_tiny_dir, batch):
    engine = InferenceEngine.from_pretrained(str(hf_tiny_dir), dtype="bfloat16", num_kv_blocks=64)
    prompts = [[(11 * i + t) % 50000 for t in range(8 + i)] for i in range(batch)]
    params = SamplingParams(max_new_tokens=10, stop_on_eos=False)
    together = [o.token_ids for o in engine.generate(prompts, params)]
    alone = [engine.generate([p], params)[0].token_ids for p in prompts]
    assert together == alone

"""The decode-graph path: buckets, padding and static buffers.

On a GPU the graphs are captured and replayed; on CPU the same padded
static-buffer path runs without capture (through the Triton interpreter), so
everything but the capture itself is checked in CI.
"""

from __future__ import annotations

import pytest
import torch

from roseinfer import InferenceEngine, OnlineScheduler, SamplingParams
from roseinfer.engine.cuda_graphs import graph_buckets
from roseinfer.model.kernels import triton_available


def test_buckets():
    assert graph_buckets(1) == [1]
    assert graph_buckets(8) == [1, 2, 4, 8]
    assert graph_buckets(12) == [1, 2, 4, 8, 12]
    assert graph_buckets(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert graph_buckets(70) == [1, 2, 4, 8, 16, 32, 48, 64, 70]


def test_cuda_graph_needs_cuda_and_triton(hf_tiny_dir):
    with pytest.raises(ValueError, match="CUDA device"):
        InferenceEngine.from_pretrained(str(hf_tiny_dir), cuda_graph=True, num_kv_blocks=8)
    engine = InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=8)
    assert engine.runner.graphs is None and engine.describe()["cuda_graph"] is False
    assert engine.attention_backend == "cpu"  # the CPU default since the fused C decode kernel


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_padded_static_buffer_decode_gives_the_same_tokens(hf_tiny_dir):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    reference = InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=64)
    engine = InferenceEngine.from_pretrained(
        str(hf_tiny_dir), num_kv_blocks=64, device=device, attention_backend="triton", cuda_graph=False
    )
    engine.runner.enable_decode_graphs(max_batch_size=6, capture=device == "cuda")
    calls = []
    run = engine.runner.graphs.run
    engine.runner.graphs.run = lambda *a: calls.append(len(a[0])) or run(*a)
    prompts = [f"graph row {i} " * (i + 1) for i in range(5)]
    params = SamplingParams(max_new_tokens=10, stop_on_eos=False)
    expected = [o.token_ids for o in reference.generate(prompts, params)]
    # 5 requests decode in the 6-row bucket: one padding row in every decode step
    scheduler = OnlineScheduler(engine, max_batch_size=6)
    rids = [scheduler.add_request(prompt=p, params=params) for p in prompts]
    while scheduler.has_unfinished():
        scheduler.step()
    assert [scheduler.pop_response(r).token_ids for r in rids] == expected
    assert calls and set(calls) == {5}
    # A batch larger than the largest graph falls back to eager.
    big = [f"eager {i}" for i in range(8)]
    calls.clear()
    outs = engine.generate(big, SamplingParams(max_new_tokens=3, stop_on_eos=False), max_batch_size=8)
    assert [o.token_ids for o in outs] == [
        o.token_ids for o in reference.generate(big, SamplingParams(max_new_tokens=3, stop_on_eos=False))
    ]
    assert engine.block_manager.num_used_blocks == 0

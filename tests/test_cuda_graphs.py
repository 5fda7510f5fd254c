"""The decode-graph path: buckets, padding and static buffers.

On a GPU the graphs are captured and replayed; on CPU the same padded
static-buffer path runs without capture (through the Triton interpreter), so
everything but the capture itself is checked in CI.
"""

from __future__ import annotations

import pytest
import torch

from roseinfer import InferenceEngine, SamplingParams
from roseinfer.engine.cuda_graphs import graph_buckets
from roseinfer.kernels.triton import triton_available


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


def test_decode_graphs_refuse_a_data_dependent_attention_backend(make_engine):
    """Issue 13, item 7: capture would hit the torch backend's boolean-mask index (a host sync)."""
    for backend in ("torch", "cpu"):
        engine = make_engine(num_kv_blocks=8, attention_backend=backend)
        with pytest.raises(ValueError, match=f"'{backend}' sizes its gather"):
            engine.runner.enable_decode_graphs(max_batch_size=4, capture=False)
        assert engine.runner.graphs is None


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_padded_static_buffer_decode_gives_the_same_tokens(hf_tiny_dir, engine_device):
    reference = InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=64)
    # fp32 on every device: the CPU reference is fp32, and CUDA's default (bf16) differs from it
    engine = InferenceEngine.from_pretrained(
        str(hf_tiny_dir),
        num_kv_blocks=64,
        device=engine_device,
        dtype="float32",
        attention_backend="triton",
        cuda_graph=False,
    )
    engine.runner.enable_decode_graphs(max_batch_size=6)  # captured on a real GPU only
    calls = []
    run = engine.runner.graphs.run
    engine.runner.graphs.run = lambda *a: calls.append(len(a[0])) or run(*a)
    prompts = [f"graph row {i} " * (i + 1) for i in range(5)]
    params = SamplingParams(max_new_tokens=10, stop_on_eos=False)
    expected = [o.token_ids for o in reference.generate(prompts, params)]
    # 5 requests decode in the 6-row bucket: one padding row in every decode step
    scheduler = engine.new_scheduler(max_batch_size=6)
    rids = [engine.add_request(scheduler, prompt=p, params=params) for p in prompts]
    while scheduler.has_unfinished():
        engine.step(scheduler)
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


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_a_step_below_the_largest_bucket_is_one_contiguous_copy(hf_tiny_dir, virtual_cuda):
    """Issue 13, item 5: a bucket's inputs were a strided slice of the staging buffer, so the
    'single async copy from pinned memory' became an unpinned copy plus a device copy."""
    engine = InferenceEngine.from_pretrained(
        str(hf_tiny_dir), num_kv_blocks=16, device="cuda", dtype="float32", cuda_graph=False
    )
    engine.runner.enable_decode_graphs(max_batch_size=8, capture=False)
    graphs = engine.runner.graphs
    tables = [engine.block_manager.allocate(1) for _ in range(3)]
    for bucket, batch in ((4, 3), (8, 3), (1, 1)):
        before = virtual_cuda.h2d_copies
        logits = graphs.run([5] * batch, [0] * batch, [t[0] * 16 for t in tables[:batch]], tables[:batch])
        assert virtual_cuda.h2d_copies == before + 1, f"bucket {bucket}"
        assert logits.shape[0] == batch and logits.is_cuda


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_enabling_graphs_on_a_used_engine_leaves_the_kv_cache_alone(hf_tiny_dir, virtual_cuda):
    """Issue 13, item 6: the pre-capture warm-up wrote dummy K/V into slot 0 of block 0 of every
    layer, which on a used engine is a live or prefix-cached block."""
    engine = InferenceEngine.from_pretrained(
        str(hf_tiny_dir), num_kv_blocks=16, device="cuda", dtype="float32", cuda_graph=False
    )
    engine.generate(["a prompt long enough to fill a block or two " * 3], SamplingParams(max_new_tokens=2))
    assert engine.block_manager.num_cached_blocks > 0
    assert engine.runner.kv_cache[:, :, 0].abs().sum().item() > 0  # block 0 holds a cached prefix
    cache = engine.runner.kv_cache.cpu()
    engine.runner.enable_decode_graphs(max_batch_size=4, capture=False)
    # capture() warms up with the static buffers as they are, then stops where virtual CUDA
    # cannot follow (the capture itself)
    with pytest.raises(NotImplementedError, match="graph capture"):
        engine.runner.graphs.capture()
    assert torch.equal(engine.runner.kv_cache.cpu(), cache)

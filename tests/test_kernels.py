"""The Triton kernels against the torch reference (on CPU through TRITON_INTERPRET=1).

Outputs are poisoned with NaN before each call, so an element a kernel forgets
to write fails the comparison; the caches hold a large poison value in every
slot that is not part of a context, so reading one shows up as a wrong result.
"""

from __future__ import annotations

import pytest
import torch

from roseinfer.kernels.triton import triton_available

pytestmark = pytest.mark.skipif(not triton_available(), reason="triton is not installed")

from test_attention import build_case  # noqa: E402

from roseinfer.attention.torch_ref import TorchPagedAttention  # noqa: E402
from roseinfer.attention.triton import TritonPagedAttention  # noqa: E402


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def _to(case, dev):
    q, k, v, k_cache, v_cache, meta, seqs = case
    meta.slot_mapping = meta.slot_mapping.to(dev)
    meta.block_tables = meta.block_tables.to(dev)
    meta.context_lens = meta.context_lens.to(dev)
    meta.query_start_loc = meta.query_start_loc.to(dev)
    return q.to(dev), k.to(dev), v.to(dev), k_cache.to(dev), v_cache.to(dev), meta, seqs


DECODE_SHAPES = [
    # (context lengths, heads, head_dim)
    ([1, 17, 33, 100], 4, 16),
    ([5, 64, 129], 3, 64),  # gpt2's head size; heads are independent programs, so 3 stand for 12
    ([250, 3, 31, 2, 77], 2, 32),
]


@pytest.mark.parametrize("block_size", [1, 2, 8, 16, 32])
@pytest.mark.parametrize("ctx, heads, head_dim", DECODE_SHAPES)
def test_decode_kernel_matches_reference(ctx, heads, head_dim, block_size):
    from roseinfer.kernels.triton.paged_attention import paged_decode_attention

    seqs = [(c, 1) for c in ctx]
    q, k, v, k_cache, v_cache, meta, _ = _to(
        build_case(seqs, block_size, heads, head_dim, seed=block_size), device()
    )
    reference = TorchPagedAttention().forward(q, k, v, k_cache.clone(), v_cache.clone(), meta, 0.3)
    # the reference wrote the new tokens; write them here too, then run the decode kernel alone
    from roseinfer.kernels.triton.paged_attention import write_kv

    write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    out = torch.full_like(q, float("nan"))
    paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.context_lens, 0.3, out=out)
    assert torch.isfinite(out).all()
    assert rel_err(out, reference) <= 1e-5


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(8, 2, 16), (9, 3, 64), (6, 1, 32)])
def test_grouped_query_kernels_match_reference(heads, kv_heads, head_dim):
    """Decode (a program per KV head, its query heads together) and prefill (a program per query head)."""
    from roseinfer.kernels.triton.paged_attention import (
        paged_decode_attention,
        paged_prefill_attention,
        write_kv,
    )

    for seqs in ([(1, 1), (40, 1), (77, 1)], [(23, 23), (50, 9), (3, 1)]):
        q, k, v, k_cache, v_cache, meta, _ = _to(
            build_case(seqs, 16, heads, head_dim, seed=heads, kv_heads=kv_heads), device()
        )
        reference = TorchPagedAttention().forward(q, k, v, k_cache.clone(), v_cache.clone(), meta, 0.2)
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.full_like(q, float("nan"))
        if meta.is_decode_only:
            paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.context_lens, 0.2, out=out)
        else:
            paged_prefill_attention(q, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.context_lens,
                                    meta.max_query_len, 0.2, out=out)
        assert torch.isfinite(out).all()
        assert rel_err(out, reference) <= 1e-5


PREFILL_CASES = {
    "prompts": [(5, 5), (16, 16), (47, 47)],
    "chunk-on-prefix": [(37, 5), (64, 31), (130, 100)],
    "mixed": [(50, 50), (23, 1), (80, 9), (1, 1)],
}


@pytest.mark.parametrize("block_size", [4, 16, 32])
@pytest.mark.parametrize("case", PREFILL_CASES)
def test_prefill_kernel_matches_reference(case, block_size):
    from roseinfer.kernels.triton.paged_attention import paged_prefill_attention, write_kv

    q, k, v, k_cache, v_cache, meta, _ = _to(
        build_case(PREFILL_CASES[case], block_size, 4, 32, seed=7), device()
    )
    reference = TorchPagedAttention().forward(q, k, v, k_cache.clone(), v_cache.clone(), meta, 0.25)
    write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    out = torch.full_like(q, float("nan"))
    paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        meta.block_tables,
        meta.query_start_loc,
        meta.context_lens,
        meta.max_query_len,
        0.25,
        out=out,
    )
    assert torch.isfinite(out).all()
    assert rel_err(out, reference) <= 1e-5


def test_kv_write_kernel_writes_exactly_its_slots_and_skips_padding():
    from roseinfer.kernels.triton.paged_attention import write_kv

    dev = device()
    k_cache = torch.full((6, 4, 3, 8), -7.0, device=dev)
    v_cache = torch.full_like(k_cache, -7.0)
    qkv = torch.randn(5, 3, 3, 8, device=dev)  # the model's [T, 3, H, D] view: keys are strided
    key, value = qkv[:, 1], qkv[:, 2]
    slots = torch.tensor([0, 5, -1, 23, 9], device=dev)
    write_kv(key, value, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(-1, 3, 8), v_cache.view(-1, 3, 8)
    written = [0, 5, 23, 9]
    assert torch.equal(flat_k[written], key[[0, 1, 3, 4]]) and torch.equal(
        flat_v[written], value[[0, 1, 3, 4]]
    )
    untouched = [i for i in range(24) if i not in written]
    assert (flat_k[untouched] == -7).all() and (flat_v[untouched] == -7).all()


def test_decode_kernel_in_half_precision():
    from roseinfer.kernels.triton.paged_attention import paged_decode_attention, write_kv

    for dtype in (torch.float16, torch.bfloat16):
        q, k, v, k_cache, v_cache, meta, _ = _to(build_case([(40, 1), (9, 1)], 16, 4, 64, seed=3), device())
        reference = TorchPagedAttention().forward(q, k, v, k_cache.clone(), v_cache.clone(), meta, 0.125)
        k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
        write_kv(k.to(dtype), v.to(dtype), k_cache, v_cache, meta.slot_mapping)
        out = paged_decode_attention(
            q.to(dtype), k_cache, v_cache, meta.block_tables, meta.context_lens, 0.125
        )
        assert out.dtype == dtype
        assert rel_err(out.float(), reference) <= (1e-2 if dtype == torch.bfloat16 else 2e-3)


def test_triton_backend_generates_the_torch_backends_tokens(hf_tiny_dir, engine_device):
    from roseinfer import InferenceEngine, SamplingParams

    prompts = ["Triton and torch agree", "on every token", "東京 🙂"]
    params = SamplingParams(max_new_tokens=8, stop_on_eos=False)
    expected = [
        o.token_ids
        for o in InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=32).generate(prompts, params)
    ]
    # fp32 like the reference: on CUDA the default is bf16, whose tokens may differ from fp32's
    engine = InferenceEngine.from_pretrained(
        str(hf_tiny_dir), num_kv_blocks=32, attention_backend="triton", device=engine_device, dtype="float32"
    )
    assert isinstance(engine.runner.model.attention, TritonPagedAttention)
    assert [o.token_ids for o in engine.generate(prompts, params)] == expected
    # chunked prefill and prefix-cache hits go through the prefill kernel on top of cached blocks
    scheduler = engine.new_scheduler(max_num_batched_tokens=5)
    rids = [engine.add_request(scheduler, prompt=p, params=params) for p in prompts]
    while scheduler.has_unfinished():
        engine.step(scheduler)
    assert [scheduler.pop_response(r).token_ids for r in rids] == expected


def test_kernels_compile_for_hopper():
    """Compile every kernel to an sm_90 cubin (H100/H200), in a process without the interpreter."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-m", "roseinfer.kernels.triton.compile_check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("cubin") == 12  # 4 kernel variants (decode with and without GQA) x 3 dtypes

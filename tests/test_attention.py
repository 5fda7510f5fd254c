"""Paged attention (gather through block tables) against plain contiguous attention."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
import torch.nn.functional as F

from roseinfer.attention import cpu as cpu_attention
from roseinfer.attention.base import AttentionMetadata
from roseinfer.attention.cpu import CpuPagedAttention
from roseinfer.attention.torch_ref import TorchPagedAttention
from roseinfer.kernels.cpu import bindings


def build_case(seqs, block_size, heads=4, head_dim=16, seed=0, dtype=torch.float32, kv_heads=None):
    """seqs: [(context_len, query_len)]. Random K/V for every context token, scattered
    over shuffled blocks; the last query_len tokens of each sequence are the new ones.
    Every other slot holds a large poison value that must never reach the output.
    kv_heads: the cache's heads (grouped-query attention), each read by heads / kv_heads query heads."""
    query_heads, heads = heads, kv_heads or heads
    num_blocks = sum(-(-c // block_size) for c, _ in seqs) + 3
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    free = list(range(num_blocks))
    rng.shuffle(free)
    k_cache = torch.full((num_blocks, block_size, heads, head_dim), 1e4, dtype=dtype)
    v_cache = torch.full_like(k_cache, 1e4)
    tables, queries, keys, values, new_k, new_v, slots = [], [], [], [], [], [], []
    for ctx, q_len in seqs:
        table = [free.pop() for _ in range(-(-ctx // block_size))]
        tables.append(table)
        k = torch.randn(ctx, heads, head_dim, generator=gen, dtype=dtype)
        v = torch.randn(ctx, heads, head_dim, generator=gen, dtype=dtype)
        keys.append(k)
        values.append(v)
        queries.append(torch.randn(q_len, query_heads, head_dim, generator=gen, dtype=dtype))
        for t in range(ctx):
            b, o = table[t // block_size], t % block_size
            if t < ctx - q_len:  # the cached prefix is already in the cache
                k_cache[b, o], v_cache[b, o] = k[t], v[t]
            else:  # the new tokens are written by the forward pass
                slots.append(b * block_size + o)
        new_k.append(k[ctx - q_len :])
        new_v.append(v[ctx - q_len :])
    width = max(len(t) for t in tables)
    q_lens = [q for _, q in seqs]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        context_lens=torch.tensor([c for c, _ in seqs], dtype=torch.int32),
        query_start_loc=torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32),
        max_query_len=max(q_lens),
        max_context_len=max(c for c, _ in seqs),
    )
    return (
        torch.cat(queries),
        torch.cat(new_k),
        torch.cat(new_v),
        k_cache,
        v_cache,
        meta,
        (queries, keys, values),
    )


def contiguous_reference(queries, keys, values, scale):
    outs = []
    for q, k, v in zip(queries, keys, values):
        ctx, q_len = k.shape[0], q.shape[0]
        group = q.shape[1] // k.shape[1]  # query head h reads KV head h // group (transformers' repeat_kv)
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        allowed = torch.arange(ctx)[None, :] <= torch.arange(ctx - q_len, ctx)[:, None]
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1).double(),
            k.transpose(0, 1).double(),
            v.transpose(0, 1).double(),
            attn_mask=allowed,
            scale=scale,
        )
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)


CASES = {
    "decode": [(1, 1), (17, 1), (33, 1), (100, 1)],
    "prefill": [(5, 5), (16, 16), (40, 40)],
    "chunk-on-prefix": [(37, 5), (64, 31)],
    "mixed": [(50, 50), (23, 1), (80, 9), (1, 1)],
}


BACKENDS = {"torch": TorchPagedAttention, "cpu": CpuPagedAttention}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block_size", [1, 4, 16, 32])
@pytest.mark.parametrize("case", CASES)
def test_paged_equals_contiguous(case, block_size, backend):
    q, k, v, k_cache, v_cache, meta, seqs = build_case(CASES[case], block_size, seed=block_size)
    scale = 0.25
    out = BACKENDS[backend]().forward(q, k, v, k_cache, v_cache, meta, scale)
    expected = contiguous_reference(*seqs, scale)
    assert out.shape == q.shape
    assert torch.isfinite(out).all()
    assert (out.double() - expected).abs().max() <= 1e-5


# (query heads, KV heads, head_dim); 40 is no multiple of an AVX-512 vector: the kernel's scalar fallback there
GQA_SHAPES = [(8, 2, 16), (9, 3, 64), (6, 1, 128), (32, 8, 64), (4, 2, 40)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("heads, kv_heads, head_dim", GQA_SHAPES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("threads", [1, 2])
def test_grouped_query_attention_equals_contiguous(case, heads, kv_heads, head_dim, backend, threads, monkeypatch):
    """Each query head reads its KV head's keys and values, however the kernel cuts the step."""
    monkeypatch.setattr(cpu_attention, "SPLIT_ABOVE_ROW_TOKENS", 0)  # always split when threads > 1
    q, k, v, k_cache, v_cache, meta, seqs = build_case(CASES[case], 16, heads=heads, head_dim=head_dim,
                                                       kv_heads=kv_heads, seed=heads)
    attention = CpuPagedAttention(num_threads=threads) if backend == "cpu" else TorchPagedAttention()
    out = attention.forward(q, k, v, k_cache, v_cache, meta, head_dim**-0.5)
    assert out.shape == q.shape
    assert (out.double() - contiguous_reference(*seqs, head_dim**-0.5)).abs().max() <= 1e-5
    assert torch.equal(k_cache.view(-1, kv_heads, head_dim)[meta.slot_mapping], k)  # new K/V in their slots
    assert torch.equal(v_cache.view(-1, kv_heads, head_dim)[meta.slot_mapping], v)


def test_grouped_query_decode_goes_through_the_kernel_and_bf16_matches(monkeypatch):
    calls = []
    real = TorchPagedAttention.forward
    monkeypatch.setattr(TorchPagedAttention, "forward", lambda *a: calls.append(1) or real(*a))
    q, k, v, k_cache, v_cache, meta, _ = build_case([(300, 1)] * 3 + [(17, 1)], 16, heads=9, head_dim=64,
                                                    kv_heads=3, dtype=torch.bfloat16)
    fused = CpuPagedAttention(num_threads=2).forward(q, k, v, k_cache, v_cache, meta, 0.125)
    assert not calls  # GQA is the kernel's, not a fallback
    q32, k32, v32, kc32, vc32 = (t.float() for t in (q, k, v, k_cache, v_cache))
    reference = TorchPagedAttention().forward(q32, k32, v32, kc32, vc32, meta, 0.125)
    assert (fused.float() - reference).abs().max() <= 2e-2  # the output's own bf16 rounding


@pytest.mark.parametrize("backend, case", [("torch", "mixed"), ("cpu", "decode"), ("cpu", "mixed")])
def test_new_tokens_are_written_to_their_slots(backend, case):
    q, k, v, k_cache, v_cache, meta, _ = build_case(CASES[case], 8)
    BACKENDS[backend]().forward(q, k, v, k_cache, v_cache, meta, 1.0)
    assert torch.equal(k_cache.view(-1, 4, 16)[meta.slot_mapping], k)
    assert torch.equal(v_cache.view(-1, 4, 16)[meta.slot_mapping], v)


def test_the_cpu_backend_runs_decode_and_short_prompt_steps_through_the_fused_kernel(monkeypatch):
    backend = CpuPagedAttention(num_threads=2)
    assert backend.fused, "a C compiler is on every machine the tests run on"
    calls = []
    real = TorchPagedAttention.forward
    monkeypatch.setattr(TorchPagedAttention, "forward", lambda *a: calls.append(1) or real(*a))
    q, k, v, k_cache, v_cache, meta, _ = build_case(CASES["decode"], 16)
    backend.forward(q, k, v, k_cache, v_cache, meta, 0.25)
    assert not calls  # decode: the kernel
    q, k, v, k_cache, v_cache, meta, _ = build_case(CASES["mixed"], 16)
    backend.forward(q, k, v, k_cache, v_cache, meta, 0.25)
    assert not calls  # prompt chunks up to PREFILL_MAX_QUERY tokens: the kernel, a query token at a time
    long_chunk = cpu_attention.PREFILL_MAX_QUERY + 1
    q, k, v, k_cache, v_cache, meta, seqs = build_case([(long_chunk + 3, long_chunk), (9, 1)], 16)
    out = backend.forward(q, k, v, k_cache, v_cache, meta, 0.25)
    assert calls  # a longer chunk: SDPA
    assert (out.double() - contiguous_reference(*seqs, 0.25)).abs().max() <= 1e-5


@pytest.mark.parametrize("threads", [1, 3])
def test_fused_bf16_decode_matches_the_reference_in_bf16(threads):
    seqs = [(1, 1), (15, 1), (16, 1), (17, 1), (129, 1)] + [(300, 1)] * 4  # enough work to split
    q, k, v, k_cache, v_cache, meta, _ = build_case(seqs, 16, heads=12, head_dim=64, dtype=torch.bfloat16)
    fused = CpuPagedAttention(num_threads=threads).forward(q, k, v, k_cache, v_cache, meta, 0.125)
    q32, k32, v32, kc32, vc32 = (t.float() for t in (q, k, v, k_cache, v_cache))
    reference = TorchPagedAttention().forward(q32, k32, v32, kc32, vc32, meta, 0.125)
    assert fused.dtype == torch.bfloat16
    assert (fused.float() - reference).abs().max() <= 2e-2  # the output's own bf16 rounding


def test_without_a_compiler_the_cpu_backend_falls_back(monkeypatch, tmp_path, caplog):
    bindings.load_paged_decode_kernel.cache_clear()
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("ROSEINFER_KERNEL_CACHE", str(tmp_path / "kernels"))
    try:
        backend = CpuPagedAttention()
        assert not backend.fused
        assert "torch path" in caplog.text
        q, k, v, k_cache, v_cache, meta, seqs = build_case(CASES["decode"], 4)
        out = backend.forward(q, k, v, k_cache, v_cache, meta, 0.25)
        assert (out.double() - contiguous_reference(*seqs, 0.25)).abs().max() <= 1e-5
    finally:
        bindings.load_paged_decode_kernel.cache_clear()


def test_a_compiler_without_openmp_still_builds_a_one_thread_kernel(monkeypatch, tmp_path, caplog):
    cc = tmp_path / "cc-without-openmp"
    cc.write_text('#!/bin/sh\nfor a in "$@"; do [ "$a" = -fopenmp ] && exit 1; done\nexec cc "$@"\n')
    cc.chmod(0o755)
    bindings.load_paged_decode_kernel.cache_clear()
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("ROSEINFER_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.setattr(cpu_attention, "SPLIT_ABOVE_ROW_TOKENS", 0)
    try:
        backend = CpuPagedAttention(num_threads=2)
        assert backend.fused and "runs on one thread" in caplog.text
        q, k, v, k_cache, v_cache, meta, seqs = build_case([(300, 1)] * 3, 16)
        out = backend.forward(q, k, v, k_cache, v_cache, meta, 0.25)
        assert (out.double() - contiguous_reference(*seqs, 0.25)).abs().max() <= 1e-5
    finally:
        bindings.load_paged_decode_kernel.cache_clear()


@pytest.mark.parametrize(
    "seqs, heads, head_dim",
    [
        ([(700, 1)], 12, 64),  # batch 1 with enough work to split: the heads are shared out
        ([(300, 1)] * 3, 5, 16),  # more sequences than threads, an odd head count
        ([(40, 1), (90, 1)], 80, 64),  # 5120 elements a token: over one call's span, heads in groups
        ([(max(1, 128 - 7 * i), 1) for i in range(12)], 4, 16),  # mixed lengths: runs cut by work, not count
    ],
)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_fused_decode_is_exact_however_the_step_is_cut(seqs, heads, head_dim, threads, monkeypatch):
    monkeypatch.setattr(cpu_attention, "SPLIT_ABOVE_ROW_TOKENS", 0)  # always split when threads > 1
    q, k, v, k_cache, v_cache, meta, parts = build_case(seqs, 16, heads=heads, head_dim=head_dim)
    out = CpuPagedAttention(num_threads=threads).forward(q, k, v, k_cache, v_cache, meta, 0.125)
    assert (out.double() - contiguous_reference(*parts, 0.125)).abs().max() <= 1e-5


def test_a_step_of_mixed_lengths_is_cut_into_runs_of_equal_work():
    lib = bindings.load_paged_decode_kernel()
    if lib is None:
        pytest.skip("no C compiler: the kernel cannot be built here")
    lens = [max(1, 128 - 7 * i) for i in range(32)]  # notebook 08's case: 97% of the tokens in the first half
    for parts in (1, 2, 3, 7, 32, 40):
        bounds = bindings.split_by_work(lib, lens, parts)
        assert bounds[0] == 0 and bounds[-1] == len(lens) and bounds == sorted(bounds)
        work = [sum(n + 1 for n in lens[a:b]) for a, b in itertools.pairwise(bounds)]
        # each run is within one sequence's work of an equal share (a sequence is never cut)
        assert max(abs(w - sum(work) / parts) for w in work) <= max(lens) + 1, (parts, work)
    assert bindings.split_by_work(lib, [100, 100, 100, 100], 2) == [0, 2, 4]  # equal lengths: equal counts
    assert bindings.split_by_work(lib, [], 2) == [0, 0, 0]


def test_plan_pieces_covers_every_head_within_a_calls_span():
    assert cpu_attention.plan_pieces(32, 12, 64, 2, 4096, 64) == (2, 12)  # by sequences
    assert cpu_attention.plan_pieces(1, 12, 64, 2, 4096, 64) == (1, 6)  # batch 1: by heads
    assert cpu_attention.plan_pieces(4, 80, 64, 2, 4096, 64) == (2, 64)  # 80 heads > one call's span
    assert cpu_attention.plan_pieces(1, 1, 64, 4, 4096, 64) == (1, 1)


def test_the_fused_kernel_reads_q_k_v_in_place_and_never_writes_outside_the_cache():
    # q, k, v as the model hands them over: views of one [T, 3, H, D] projection output.
    q, k, v, k_cache, v_cache, meta, seqs = build_case(CASES["decode"], 4)
    qkv = torch.stack([q, k, v], dim=1)
    q, k, v = qkv.unbind(1)
    assert not q.is_contiguous()
    out = CpuPagedAttention().forward(q, k, v, k_cache, v_cache, meta, 0.25)
    assert (out.double() - contiguous_reference(*seqs, 0.25)).abs().max() <= 1e-5
    meta.slot_mapping[0] = k_cache.shape[0] * k_cache.shape[1]  # one past the last slot
    meta.backend_state.clear()
    before = k_cache.clone()
    with pytest.raises(IndexError, match="outside the KV cache"):
        CpuPagedAttention().forward(q, k, v, k_cache, v_cache, meta, 0.25)
    assert torch.equal(k_cache, before)


def test_the_default_backend_can_be_overridden_for_a_process(monkeypatch):
    from roseinfer.attention.registry import default_attention_backend

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv("ROSEINFER_ATTENTION_BACKEND", raising=False)
    assert (default_attention_backend(cpu), default_attention_backend(cuda)) == ("cpu", "triton")
    monkeypatch.setenv("ROSEINFER_ATTENTION_BACKEND", "torch")
    assert (default_attention_backend(cpu), default_attention_backend(cuda)) == ("torch", "torch")
    monkeypatch.setenv("ROSEINFER_ATTENTION_BACKEND", "flash")
    with pytest.raises(ValueError, match="ROSEINFER_ATTENTION_BACKEND='flash'"):
        default_attention_backend(cpu)

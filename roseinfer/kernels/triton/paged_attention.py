"""Triton kernels: KV-cache write, paged decode attention, paged prefill attention.

Layouts (roseinfer.attention.base): the cache of one layer is
k_cache/v_cache [num_blocks, block_size, kv_heads, head_dim]; queries are packed
[tokens, heads, head_dim], keys and values [tokens, kv_heads, head_dim], with
head_dim contiguous. Under grouped-query attention kv_heads < heads: query head
h reads KV head h // GROUP, GROUP = heads // kv_heads (1: multi-head). All
accumulation is in fp32 whatever the storage dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


# -- KV write --------------------------------------------------------------------------------
@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_vt,
    stride_slot,
    ROW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token)
    if slot >= 0:
        offs = tl.arange(0, BLOCK)
        mask = offs < ROW
        k = tl.load(key_ptr + token * stride_kt + offs, mask=mask)
        v = tl.load(value_ptr + token * stride_vt + offs, mask=mask)
        tl.store(k_cache_ptr + slot * stride_slot + offs, k, mask=mask)
        tl.store(v_cache_ptr + slot * stride_slot + offs, v, mask=mask)


def write_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Store key/value [T, H, D] at their slots (slot < 0: skipped)."""
    tokens, heads, head_dim = key.shape
    assert key.stride(2) == 1 and key.stride(1) == head_dim, "each token's heads must be contiguous"
    assert value.stride(2) == 1 and value.stride(1) == head_dim
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    row = heads * head_dim
    _write_kv_kernel[(tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        value.stride(0),
        row,
        ROW=row,
        BLOCK=triton.next_power_of_2(row),
    )


# -- decode: one query per sequence ----------------------------------------------------------
@triton.jit
def _paged_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    block_tables_ptr,
    context_lens_ptr,
    scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_bt,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,  # query heads a KV head serves (1: multi-head attention)
    BLOCK_G: tl.constexpr,  # GROUP rounded up to a power of two
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)  # one program reads a KV head's blocks once for all of its query heads
    ctx = tl.load(context_lens_ptr + seq)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    offs_s = tl.arange(0, BLOCK_SIZE)
    offs_g = tl.arange(0, BLOCK_G)
    g_mask = offs_g < GROUP
    heads = kv_head * GROUP + offs_g
    q_mask = g_mask[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + seq * stride_qt + heads[:, None] * stride_qh + offs_d[None, :], mask=q_mask, other=0.0)
    q = q.to(tl.float32)  # [BLOCK_G, BLOCK_D]
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for j in range(0, tl.cdiv(ctx, BLOCK_SIZE)):
        block = tl.load(block_tables_ptr + seq * stride_bt + j).to(tl.int64)
        valid = j * BLOCK_SIZE + offs_s < ctx
        base = block * stride_kb + offs_s[:, None] * stride_ks + kv_head * stride_kh + offs_d[None, :]
        kv_mask = valid[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + base, mask=kv_mask, other=0.0).to(tl.float32)  # [BLOCK_SIZE, BLOCK_D]
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [BLOCK_G, BLOCK_SIZE]
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        v = tl.load(v_ptr + base, mask=kv_mask, other=0.0).to(tl.float32)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new
    l_i = tl.where(l_i == 0.0, 1.0, l_i)  # an empty context (a padding row) gives zeros, not NaN
    out = acc / l_i[:, None]
    tl.store(out_ptr + seq * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, out=None):
    """q [B, H, D] -> [B, H, D]: each query over its sequence's context_lens[b] cached tokens."""
    batch, heads, head_dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    assert block_size & (block_size - 1) == 0, "block size must be a power of two"
    assert q.stride(2) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    assert heads % kv_heads == 0, "each KV head serves the same number of query heads"
    out = torch.empty_like(q) if out is None else out
    _paged_decode_kernel[(batch, kv_heads)](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        context_lens,
        scale,
        *_strides(q, out, k_cache, block_tables),
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=block_size,
        GROUP=heads // kv_heads,
        BLOCK_G=triton.next_power_of_2(heads // kv_heads),
    )
    return out


# -- prefill: a tile of queries per program --------------------------------------------------
@triton.jit
def _paged_prefill_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, block_tables_ptr, query_start_loc_ptr, context_lens_ptr, scale,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_kb, stride_ks, stride_kh, stride_bt,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr, GROUP: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    head = tl.program_id(1)
    tile = tl.program_id(2)
    kv_head = head // GROUP  # a prompt is compute-bound: a program per query head, its KV head read again
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if tile * BLOCK_M < q_len:
        ctx = tl.load(context_lens_ptr + seq)
        offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        m_mask = offs_m < q_len
        q_pos = ctx - q_len + offs_m  # each query's position in its sequence
        offs_d = tl.arange(0, BLOCK_D)
        d_mask = offs_d < HEAD_DIM
        q_rows = (q_start + offs_m).to(tl.int64)
        q = tl.load(
            q_ptr + q_rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
            mask=m_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        # Causal: the tile's last query sees up to its own position, never past the context.
        kv_end = ctx - q_len + (tile + 1) * BLOCK_M
        kv_end = tl.where(kv_end < ctx, kv_end, ctx)
        offs_n0 = tl.arange(0, BLOCK_N)
        for start_n in range(0, kv_end, BLOCK_N):
            offs_n = start_n + offs_n0
            n_mask = offs_n < kv_end
            block = tl.load(block_tables_ptr + seq * stride_bt + offs_n // BLOCK_SIZE, mask=n_mask, other=0)
            row = block.to(tl.int64) * stride_kb + (offs_n % BLOCK_SIZE) * stride_ks + kv_head * stride_kh
            kv_mask = n_mask[:, None] & d_mask[None, :]
            k = tl.load(k_ptr + row[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = s * scale
            visible = (offs_n[None, :] <= q_pos[:, None]) & n_mask[None, :]
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_ptr + row[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
            if IEEE:
                pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(
            out_ptr + q_rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=m_mask[:, None] & d_mask[None, :],
        )


def _strides(q: torch.Tensor, out: torch.Tensor, k_cache: torch.Tensor, block_tables: torch.Tensor) -> tuple:
    """The strides both attention kernels take, in their order: token/head of q and out, block/slot/head
    of the cache (K and V share a layout), a block table's row."""
    return (q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0))  # fmt: skip


def paged_prefill_attention(
    q,
    k_cache,
    v_cache,
    block_tables,
    query_start_loc,
    context_lens,
    max_query_len,
    scale,
    out=None,
    block_m: int = 16,
    block_n: int = 32,
):
    """Packed queries q [T, H, D] of several sequences, each attending causally to its cache."""
    _, heads, head_dim = q.shape
    num_seqs = context_lens.shape[0]
    assert q.stride(2) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    assert heads % k_cache.shape[2] == 0, "each KV head serves the same number of query heads"
    out = torch.empty_like(q) if out is None else out
    grid = (num_seqs, heads, triton.cdiv(max_query_len, block_m))
    _paged_prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        query_start_loc,
        context_lens,
        scale,
        *_strides(q, out, k_cache, block_tables),
        HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_SIZE=k_cache.shape[1],
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        IEEE=q.dtype == torch.float32,
        GROUP=heads // k_cache.shape[2],
    )
    return out

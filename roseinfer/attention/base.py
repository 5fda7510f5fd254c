"""Attention over a paged KV cache.

The cache of one layer is a pool of blocks, `[num_blocks, block_size, heads,
head_dim]` for keys and the same for values. A sequence's tokens live in the
blocks its block table lists, in order; token t of a sequence sits in block
`block_table[t // block_size]` at offset `t % block_size` (its "slot" is
`block_id * block_size + offset`).

A forward pass works on packed tokens: the new tokens of every sequence in the
batch, one after the other. `AttentionMetadata` says where each sequence's new
tokens start, how long its context is after this step, and which slots the new
keys and values go to. The same metadata serves a decode step (one new token a
sequence), a prefill (all prompt tokens), a prefill chunk on top of cached
tokens, and any mix of them.

`TorchPagedAttention` is the reference: gather each sequence's keys and values
through its block table, then one padded, masked scaled-dot-product attention.
It runs on any device and is the oracle the Triton kernels
(`TritonPagedAttention`, roseinfer.kernels.triton) are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot of each new token
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32 (int64 in the graph path), padded with 0
    context_lens: torch.Tensor  # [num_seqs] int32 (or int64): tokens in the cache after this step
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: packed offsets of new tokens
    max_query_len: int
    max_context_len: int
    # Per-forward tensors a backend derives once and reuses in every layer.
    backend_state: dict[str, Any] = field(default_factory=dict)

    @property
    def num_seqs(self) -> int:
        return self.context_lens.shape[0]

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store the new tokens' keys and values [T, H, D] at their slots."""
    heads, head_dim = key.shape[1:]
    k_cache.view(-1, heads, head_dim).index_copy_(0, slot_mapping, key)
    v_cache.view(-1, heads, head_dim).index_copy_(0, slot_mapping, value)


class TorchPagedAttention:
    """Gather through the block table + masked SDPA. Any device, any dtype."""

    name = "torch"
    graph_safe = False  # its gather and mask are sized by the longest context (data-dependent)

    def plan(self, meta: AttentionMetadata, block_size: int, num_tokens: int) -> dict[str, Any]:
        """Index tensors shared by all layers of one forward pass."""
        state = meta.backend_state
        if "q_index" in state:
            return state
        device = meta.context_lens.device
        ctx = meta.context_lens.long()
        starts = meta.query_start_loc[:-1].long()
        q_lens = meta.query_start_loc[1:].long() - starts
        i = torch.arange(meta.max_query_len, device=device)
        q_valid = i[None, :] < q_lens[:, None]  # [B, Q]
        q_index = (starts[:, None] + i).clamp(max=num_tokens - 1)  # [B, Q]
        q_pos = ctx[:, None] - q_lens[:, None] + i  # position of each query in its sequence
        k_pos = torch.arange(meta.max_context_len, device=device)
        # Causal and within the context; padded query rows see a valid prefix, so no NaN.
        mask = (k_pos[None, None, :] <= q_pos[:, :, None]) & (k_pos[None, None, :] < ctx[:, None, None])
        num_blocks = -(-meta.max_context_len // block_size)
        offsets = torch.arange(block_size, device=device)
        slots = meta.block_tables[:, :num_blocks, None].long() * block_size + offsets
        state.update(
            q_index=q_index,
            q_valid=q_valid,
            mask=mask[:, None],  # broadcast over heads
            # Flat, for index_select: several times faster on CPU than 2-D fancy indexing.
            k_slots=slots.flatten(1)[:, : meta.max_context_len].flatten(),
        )
        return state

    def forward(
        self,
        query: torch.Tensor,  # [T, H, D]
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,  # [num_blocks, block_size, H, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        write_kv(key, value, k_cache, v_cache, meta.slot_mapping)
        heads, head_dim = query.shape[1:]
        plan = self.plan(meta, k_cache.shape[1], query.shape[0])
        batch = meta.num_seqs
        q = query[plan["q_index"]].transpose(1, 2)  # [B, H, Q, D]
        gathered = (batch, meta.max_context_len, heads, head_dim)
        k = k_cache.view(-1, heads, head_dim).index_select(0, plan["k_slots"]).view(gathered).transpose(1, 2)
        v = v_cache.view(-1, heads, head_dim).index_select(0, plan["k_slots"]).view(gathered).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=plan["mask"], scale=scale)
        return out.transpose(1, 2)[plan["q_valid"]]  # back to packed [T, H, D]


class TritonPagedAttention:
    """The Triton kernels: a decode kernel when every sequence has one new token, else the prefill kernel.

    Its shapes never depend on the data (no gather sized by the longest context),
    which is what lets a decode step be captured in a CUDA graph.
    """

    name = "triton"
    graph_safe = True

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        from roseinfer.kernels.triton import paged_attention as kernels

        kernels.write_kv(key, value, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        if meta.is_decode_only:
            return kernels.paged_decode_attention(
                query, k_cache, v_cache, meta.block_tables, meta.context_lens, scale, out=out
            )
        return kernels.paged_prefill_attention(
            query,
            k_cache,
            v_cache,
            meta.block_tables,
            meta.query_start_loc,
            meta.context_lens,
            meta.max_query_len,
            scale,
            out=out,
        )


AttentionBackend = TorchPagedAttention | TritonPagedAttention
ATTENTION_BACKENDS = ("torch", "cpu", "triton")


def default_attention_backend(device: torch.device) -> str:
    """Triton on CUDA; on a CPU, the fused decode kernel over the torch reference."""
    return "triton" if device.type == "cuda" else "cpu"


def make_attention_backend(name: str) -> AttentionBackend:
    if name == "torch":
        return TorchPagedAttention()
    if name == "cpu":
        from roseinfer.attention.cpu import CpuPagedAttention

        return CpuPagedAttention()
    if name == "triton":
        from roseinfer.kernels.triton import triton_available

        if not triton_available():
            raise ValueError("attention_backend 'triton' needs the triton package (pip install triton)")
        return TritonPagedAttention()
    raise ValueError(f"unknown attention backend {name!r}; available: {ATTENTION_BACKENDS}")

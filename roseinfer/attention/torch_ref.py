"""The reference paged attention: gather each sequence's keys and values through its block table,
then one padded, masked scaled-dot-product attention.

It runs on any device and dtype, and is the oracle the CPU kernel and the
Triton kernels are tested against.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from roseinfer.attention.base import AttentionMetadata, write_kv


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
        key: torch.Tensor,  # [T, kv_heads, D]: kv_heads divides H (grouped-query attention)
        value: torch.Tensor,
        k_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        write_kv(key, value, k_cache, v_cache, meta.slot_mapping)
        kv_heads, head_dim = k_cache.shape[2:]  # fewer than the query's heads under grouped-query attention
        plan = self.plan(meta, k_cache.shape[1], query.shape[0])
        batch = meta.num_seqs
        q = query[plan["q_index"]].transpose(1, 2)  # [B, H, Q, D]
        gathered = (batch, meta.max_context_len, kv_heads, head_dim)
        k = k_cache.view(-1, kv_heads, head_dim).index_select(0, plan["k_slots"]).view(gathered).transpose(1, 2)
        v = v_cache.view(-1, kv_heads, head_dim).index_select(0, plan["k_slots"]).view(gathered).transpose(1, 2)
        # enable_gqa: query head h reads K/V head h // (H / kv_heads), as transformers' repeat_kv lays them out
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=plan["mask"], scale=scale,
                                             enable_gqa=kv_heads != query.shape[1])
        return out.transpose(1, 2)[plan["q_valid"]]  # back to packed [T, H, D]

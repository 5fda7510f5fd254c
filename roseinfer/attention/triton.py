"""The Triton backend: the paged kernels of roseinfer.kernels.triton behind the attention protocol."""

from __future__ import annotations

import torch

from roseinfer.attention.base import AttentionMetadata


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

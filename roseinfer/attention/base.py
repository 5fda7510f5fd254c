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

A backend is anything with `forward(query, key, value, k_cache, v_cache, meta,
scale)` (the `AttentionBackend` protocol): the torch reference
(`attention/torch_ref.py`), the CPU C kernel (`attention/cpu.py`) and Triton
(`attention/triton.py`); `attention/registry.py` builds one by name. This file
imports none of them, so each can import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch


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


class AttentionBackend(Protocol):
    """What the model calls once a layer: write the step's new K/V at their slots, attend, return [T, H, D]."""

    name: str
    graph_safe: bool  # no shape depends on the data, so a decode step can be captured in a CUDA graph

    def forward(
        self,
        query: torch.Tensor,  # [T, H, D], the step's new tokens packed
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,  # [num_blocks, block_size, H, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor: ...

"""Triton kernels for attention over the paged KV cache.

- `write_kv`: scatter the new tokens' keys and values to their cache slots
  (a negative slot is skipped: CUDA-graph padding rows have nowhere to write);
- `paged_decode_attention`: one query per sequence, many sequences per launch,
  reading each sequence's keys and values through its block table with an
  online softmax, for any power-of-two block size;
- `paged_prefill_attention`: many queries per sequence (a prompt, or a chunk
  of one on top of cached tokens), causal, flash-attention style tiles.

They run on CUDA, and on CPU tensors under the Triton interpreter
(`TRITON_INTERPRET=1`), which is how CI checks them against the torch
reference in roseinfer.attention.base.
"""

from __future__ import annotations

import os


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

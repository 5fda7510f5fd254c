"""Notebook 12's exercise: grouped-query attention for one decode token."""

from __future__ import annotations

from collections.abc import Callable


def check_gqa_decode(attend: Callable) -> str:
    """Notebook 12: `attend(q, k, v, scale)` with q [heads, D] (one decode token) and k, v [tokens, kv_heads, D]
    must give [heads, D], query head h reading KV head h // (heads // kv_heads), as transformers lays them out."""
    import torch

    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, tokens = 9, 3, 8, 5
    q = torch.randn(heads, dim, generator=gen)
    k, v = torch.randn(tokens, kv_heads, dim, generator=gen), torch.randn(tokens, kv_heads, dim, generator=gen)
    group = heads // kv_heads
    expected = torch.stack([torch.softmax(k[:, h // group] @ q[h] * 0.5, 0) @ v[:, h // group] for h in range(heads)])
    interleaved = torch.stack([torch.softmax(k[:, h % kv_heads] @ q[h] * 0.5, 0) @ v[:, h % kv_heads]
                               for h in range(heads)])
    try:
        out = attend(q, k, v, 0.5)
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your attention"
    if not isinstance(out, torch.Tensor) or out.shape != (heads, dim):
        return f"FAIL: expected a tensor of shape {(heads, dim)}, got {getattr(out, 'shape', type(out))}"
    if torch.allclose(out, interleaved, atol=1e-5):
        return "FAIL: query head h read KV head h % kv_heads; the heads of a group are consecutive: h // group"
    if not torch.allclose(out, expected, atol=1e-5):
        return f"FAIL: off by {(out - expected).abs().max():.3g} from the reference"
    return f"PASS: {heads} query heads on {kv_heads} KV heads, each reading its group's keys and values"

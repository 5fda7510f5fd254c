"""Notebook 01's exercise: one token's attention over a KV cache, each token projected once."""

from __future__ import annotations

from collections.abc import Callable


def check_kv_cache_attention(step: Callable) -> str:
    """Notebook 01: `step(cache, x, project, scale)` gets one new token's hidden state x ([E]), a `project`
    that maps rows [n, E] to their (q, k, v), each [n, D], and a `cache` dict (empty at first, kept across
    calls). It must return that token's attention output over every token so far, itself included, and
    project each token once: the keys and values of earlier tokens come from the cache, not recomputed."""
    import torch

    gen = torch.Generator().manual_seed(0)
    tokens, width, dim, scale = 6, 12, 8, 8**-0.5
    xs = torch.randn(tokens, width, generator=gen)
    weights = torch.randn(3, width, dim, generator=gen)
    projected = []

    def project(rows):
        if rows.dim() != 2 or rows.shape[1] != width:
            raise ValueError(f"project takes rows [n, {width}], got {tuple(rows.shape)}")
        projected.append(rows.shape[0])
        return rows @ weights[0], rows @ weights[1], rows @ weights[2]

    q, k, v = (xs @ w for w in weights)
    causal = torch.full((tokens, tokens), float("-inf")).triu(1)
    expected = torch.softmax(q @ k.T * scale + causal, dim=-1) @ v  # row t: token t over tokens 0..t
    cache: dict = {}
    try:
        outs = [step(cache, xs[t], project, scale) for t in range(tokens)]
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your step"
    for t, out in enumerate(outs):
        out = out.reshape(-1) if isinstance(out, torch.Tensor) and out.numel() == dim else out
        if not isinstance(out, torch.Tensor) or out.shape != (dim,):
            return f"FAIL: token {t}: expected a tensor of {dim} values, got {getattr(out, 'shape', type(out))}"
        if not torch.allclose(out, expected[t], atol=1e-5):
            alone = torch.allclose(out, v[t], atol=1e-5)
            hint = " (it attended to the new token alone: keep every token's k and v)" if alone else ""
            return f"FAIL: token {t} is off by {(out - expected[t]).abs().max():.3g} from causal attention{hint}"
    if sum(projected) != tokens:
        return (f"FAIL: right answers, but {sum(projected)} rows projected for {tokens} tokens: earlier tokens' "
                "keys and values were recomputed instead of read from the cache")
    return f"PASS: {tokens} tokens, each projected once, each attending to every cached key and value and itself"
